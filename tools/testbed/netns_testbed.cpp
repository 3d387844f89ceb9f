#include "tools/testbed/netns_testbed.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "tools/bench/subprocess.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace proxyep::tools::testbed {
namespace {

constexpr const char* kPhase = "launch.link";
constexpr const char* kNetnsDir = "/run/netns";
constexpr const char* kBridge = "br0";
constexpr std::chrono::seconds kCommandTimeout{10};
constexpr int kCapNetAdmin = 12;  // linux/capability.h
// tbf's queue: how long a packet may wait behind the rate before it is dropped. Long enough
// that TCP, not drops, sets the pace.
constexpr int kQueueMs = 20;

// The start time of `pid` (field 22 of /proc/PID/stat, clock ticks since boot), or "" when it
// has exited. With the pid it names a process for good: a later process may reuse the pid,
// not both.
std::string start_time_of(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 22) return field;
  }
  return "";
}

// Runs one iproute2 command; throws naming it and what it printed when it fails.
void run(const std::vector<std::string>& argv) {
  auto result = run_capturing_stdout(argv, {}, kCommandTimeout, std::chrono::seconds(1),
                                     /*capture_stderr=*/true);
  require(!result.timed_out && result.exit_code == 0, kPhase, "`{}` failed{}: {}",
          fmt::join(argv, " "), result.timed_out ? " (timed out)" : "", result.out);
}

// `ip netns del`, quietly: used while cleaning up, where a failure must not hide the first error.
bool delete_namespace(const std::string& name) noexcept {
  try {
    auto result = run_capturing_stdout({"ip", "netns", "del", name}, {}, kCommandTimeout,
                                       std::chrono::seconds(1), /*capture_stderr=*/true);
    return result.exit_code == 0;
  } catch (...) {
    return false;
  }
}

bool has_net_admin() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("CapEff:")) continue;
    auto bits = std::stoull(line.substr(7), nullptr, 16);
    return (bits >> kCapNetAdmin) & 1;
  }
  return false;
}

std::string rate_text(double gbps) {
  return fmt::format("{}bit", std::llround(gbps * 1e9));
}

// tbf's bucket: at least 64 KiB (a GSO packet passes whole) and 1 ms of the rate, so that the
// timer's granularity does not cap the rate.
std::string burst_text(double gbps) {
  double bytes = std::max(64.0 * 1024, gbps * 1e9 / 8 / 1000);
  return fmt::format("{}b", std::llround(bytes));
}

}  // namespace

void NetnsTestbed::check_available() {
  require(has_net_admin(), kPhase,
          "the testbed (--link / launch.link) builds network namespaces and shapes links with "
          "tc, which needs CAP_NET_ADMIN (run as root, or give the capability); without --link "
          "the ranks share this host's network");
  for (const char* tool : {"ip", "tc", "nsenter"})
    require(!find_in_path(tool).empty(), kPhase,
            "the testbed needs `{}` in PATH (Debian: iproute2 has ip and tc, util-linux nsenter)",
            tool);
}

std::vector<std::string> NetnsTestbed::sweep_stale() {
  static const std::regex kOurs(R"(proxyep-(\d+)-(\d+)-(sw|n\d+))");
  std::vector<std::string> removed;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(kNetnsDir, error)) {
    auto name = entry.path().filename().string();
    std::smatch match;
    if (!std::regex_match(name, match, kOurs)) continue;
    pid_t pid = static_cast<pid_t>(std::stol(match[1]));
    if (start_time_of(pid) == match[2].str()) continue;  // its launcher still runs
    if (delete_namespace(name)) removed.push_back(name);
  }
  if (!removed.empty())
    log::info("testbed: removed {} network namespace(s) of launchers that are gone: {}",
              removed.size(), fmt::join(removed, ", "));
  return removed;
}

NetnsTestbed::NetnsTestbed(int nodes, double gbps, double latency_us) : nodes_(nodes) {
  require(nodes >= 1 && nodes <= 250 * 250, kPhase, "{} nodes: the testbed builds 1..62500", nodes);
  check_available();
  sweep_stale();
  run_ = fmt::format("proxyep-{}-{}", ::getpid(), start_time_of(::getpid()));
  switch_ = run_ + "-sw";
  for (int k = 0; k < nodes; ++k)
    namespaces_.push_back(fmt::format("{}-n{}", run_, k));
  auto start = std::chrono::steady_clock::now();
  try {
    build(gbps, latency_us);
  } catch (...) {
    remove_all();
    throw;
  }
  setup_time_ = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
}

NetnsTestbed::~NetnsTestbed() {
  remove_all();
}

void NetnsTestbed::build(double gbps, double latency_us) {
  const auto rate = rate_text(gbps);
  const auto burst = burst_text(gbps);
  const auto queue = fmt::format("{}ms", kQueueMs);
  auto add_namespace = [&](const std::string& name) {
    run({"ip", "netns", "add", name});
    created_.push_back(name);
    run({"ip", "-n", name, "link", "set", "lo", "up"});
  };
  add_namespace(switch_);
  run({"ip", "-n", switch_, "link", "add", kBridge, "type", "bridge"});
  run({"ip", "-n", switch_, "link", "set", kBridge, "up"});
  for (int k = 0; k < nodes_; ++k) {
    const auto& node = namespaces_[k];
    const auto port = fmt::format("n{}", k);
    add_namespace(node);
    // Made straight in the two namespaces: no name in this host's namespace, so concurrent
    // testbeds cannot collide.
    run({"ip", "link", "add", kNodeInterface, "netns", node, "type", "veth", "peer", "name", port,
         "netns", switch_});
    run({"ip", "-n", node, "addr", "add", address_of(k) + "/16", "dev", kNodeInterface});
    run({"ip", "-n", node, "link", "set", kNodeInterface, "up"});
    run({"ip", "-n", switch_, "link", "set", port, "master", kBridge, "up"});
    // What node k receives: the switch port's egress.
    run({"tc", "-n", switch_, "qdisc", "add", "dev", port, "root", "tbf", "rate", rate, "burst",
         burst, "latency", queue});
    // What node k sends: its own interface's egress, behind the latency when there is one.
    if (latency_us > 0) {
      auto delay = fmt::format("{}us", std::llround(latency_us));
      try {
        run({"tc", "-n", node, "qdisc", "add", "dev", kNodeInterface, "root", "handle",
             "1:", "netem", "delay", delay});
      } catch (const Error& e) {
        fail(kPhase,
             "a latency of {} needs tc's netem, which this kernel refused ({}); give the link "
             "without a latency (GBPS or preset:NAME) to shape the rate only",
             delay, e.message());
      }
      run({"tc", "-n", node, "qdisc", "add", "dev", kNodeInterface, "parent", "1:", "handle",
           "2:", "tbf", "rate", rate, "burst", burst, "latency", queue});
    } else {
      run({"tc", "-n", node, "qdisc", "add", "dev", kNodeInterface, "root", "tbf", "rate", rate,
           "burst", burst, "latency", queue});
    }
  }
}

void NetnsTestbed::remove_all() noexcept {
  // Nodes first, the switch last: deleting a namespace deletes its ends of the veth pairs.
  for (auto it = created_.rbegin(); it != created_.rend(); ++it)
    if (!delete_namespace(*it))
      log::warn("testbed: could not remove network namespace {} (the next testbed sweeps it)", *it);
  created_.clear();
}

std::string NetnsTestbed::namespace_list() const {
  return fmt::format("{}", fmt::join(namespaces_, ","));
}

std::string NetnsTestbed::address_of(int node) const {
  return fmt::format("10.200.{}.{}", node / 250, node % 250 + 1);
}

std::vector<std::string> NetnsTestbed::enter(int node) const {
  return {"nsenter", fmt::format("--net={}/{}", kNetnsDir, namespace_of(node)), "--"};
}

}  // namespace proxyep::tools::testbed
