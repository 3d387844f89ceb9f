#include "tools/bench/ep_baseline.hpp"

#include "common/error.hpp"
#include "tools/bench/subprocess.hpp"
#include "tools/testbed/netns_testbed.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

namespace proxyep::tools {
namespace {

constexpr const char* kPhase = "bench.ep.baseline";
constexpr const char* kBinary = "proxyep-mpi-baseline";
constexpr const char* kAgent = "proxyep-netns-agent";

// The mpirun options of the testbed: daemons started in the nodes' namespaces by the agent, one
// per node (no tree spawn: every agent call comes from mpirun), no name lookups, vader inside a
// node and tcp over the shaped links between nodes.
std::vector<std::string> testbed_mpirun_options(const MpiBaselineRequest& request,
                                                const MpiTestbedFiles& files) {
  std::vector<std::string> hosts;
  for (const auto& ns : request.testbed_namespaces)
    hosts.push_back(fmt::format("{}:{}", ns, request.ranks_per_node));
  return {"--host",
          fmt::format("{}", fmt::join(hosts, ",")),
          "--map-by",
          "slot",
          "--mca",
          "plm_rsh_agent",
          files.agent,
          "--mca",
          "plm_rsh_no_tree_spawn",
          "1",
          "--mca",
          "if_base_do_not_resolve",
          "1",
          "--mca",
          "orte_tmpdir_base",
          files.session_dir,
          "--mca",
          "oob_tcp_if_include",
          testbed::kNodeInterface,
          "--mca",
          "btl",
          "self,vader,tcp",
          "--mca",
          "btl_tcp_if_include",
          testbed::kNodeInterface,
          "--mca",
          "btl_tcp_disable_family",
          "6"};
}

std::string beside_self(const char* name) {
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  require(!error, kPhase, "cannot read /proc/self/exe: {}", error.message());
  return (self.parent_path() / name).string();
}

std::string baseline_binary() {
  std::filesystem::path binary = beside_self(kBinary);
  require(access(binary.c_str(), X_OK) == 0, kPhase,
          "{} not found next to {}: this proxyep was built without MPI. Install Open MPI "
          "(scripts/install-deps.sh installs openmpi-bin and libopenmpi-dev), re-run cmake and "
          "rebuild, or use --baseline none",
          binary.string(), beside_self("proxyep"));
  return binary.string();
}

// Open MPI's session directories for one baseline run, removed after it (a killed run leaves
// them behind otherwise).
struct SessionDir {
  SessionDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "proxyep-mpi-XXXXXX").string();
    require(::mkdtemp(pattern.data()) != nullptr, kPhase, "mkdtemp: {}", std::strerror(errno));
    path = pattern;
  }
  ~SessionDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  SessionDir(const SessionDir&) = delete;
  SessionDir& operator=(const SessionDir&) = delete;
  std::string path;
};

}  // namespace

std::vector<std::string> mpi_baseline_command(const MpiBaselineRequest& request,
                                              const std::string& binary,
                                              const MpiTestbedFiles& testbed) {
  const bool on_testbed = !request.testbed_namespaces.empty();
  std::vector<std::string> cmd;
  // mpirun in node 0's namespace (this rank's) under node 0's own hostname, as the agent gives
  // every other node its own: Open MPI tells nodes apart by hostname.
  if (on_testbed)
    cmd = {"unshare",
           "--uts",
           "--",
           "sh",
           "-c",
           "hostname \"$0\" && exec \"$@\"",
           request.testbed_namespaces.front()};
  cmd.insert(cmd.end(), {"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                         "-n", std::to_string(request.ranks), "--mca", "pml", "ob1"});
  std::vector<std::string> transport;
  if (on_testbed)
    transport = testbed_mpirun_options(request, testbed);
  else if (request.ranks_per_node < request.ranks && !request.shared_memory_everywhere)
    transport = {"--mca", "oob_tcp_if_include", "lo", "--mca", "btl", "tcp,self",
                 "--mca", "btl_tcp_if_include", "lo"};
  else
    transport = {"--mca", "oob_tcp_if_include", "lo", "--mca", "btl", "vader,self"};
  cmd.insert(cmd.end(), transport.begin(), transport.end());
  cmd.insert(cmd.end(), request.extra_mpirun_args.begin(), request.extra_mpirun_args.end());
  cmd.push_back(binary);
  if (request.workload.low_latency) cmd.emplace_back("ll");  // the low-latency baseline
  if (request.variant == kMpiRecords) cmd.emplace_back("--records");
  auto args = to_args(request.workload);
  cmd.insert(cmd.end(), args.begin(), args.end());
  cmd.insert(cmd.end(), {"--ranks-per-node", std::to_string(request.ranks_per_node)});
  return cmd;
}

bool baseline_needs_brackets(const MpiBaselineRequest& request) {
  return request.testbed_namespaces.empty() && request.ranks_per_node < request.ranks;
}

std::string baseline_transport(const MpiBaselineRequest& request) {
  if (!request.testbed_namespaces.empty())
    return "shared memory inside a node, tcp over the testbed's shaped links between nodes";
  if (request.ranks_per_node >= request.ranks) return "shared memory (one node)";
  return request.shared_memory_everywhere
             ? "shared memory between every pair, nodes ignored (upper bracket)"
             : "tcp over loopback between every pair, inside a node too (lower bracket)";
}

void check_mpi_baseline_available() {
  baseline_binary();
  require(!find_in_path("mpirun").empty(), kPhase,
          "mpirun not found in PATH: install Open MPI (openmpi-bin) or use --baseline none");
}

nlohmann::json run_mpi_baseline(const MpiBaselineRequest& request) {
  check_mpi_baseline_available();
  auto binary = baseline_binary();
  MpiTestbedFiles testbed;
  std::optional<SessionDir> sessions;
  std::vector<std::pair<std::string, std::string>> env;
  if (!request.testbed_namespaces.empty()) {
    testbed.agent = beside_self(kAgent);
    require(access(testbed.agent.c_str(), X_OK) == 0, kPhase,
            "{} not found: the MPI baseline on the testbed needs it (rebuild)", testbed.agent);
    sessions.emplace();
    testbed.session_dir = sessions->path;
    // No display to probe: hwloc's gl component would try X servers on every start.
    env.emplace_back("HWLOC_COMPONENTS", "-gl");
  }
  auto cmd = mpi_baseline_command(request, binary, testbed);
  auto result = run_capturing_stdout(cmd, env, request.timeout);
  auto command_text = fmt::format("{}", fmt::join(cmd, " "));
  require(!result.timed_out, kPhase, "`{}` did not finish within {} s (raise --baseline-timeout)",
          command_text, request.timeout.count());
  require(result.exit_code == 0, kPhase, "`{}` failed with exit code {}{}", command_text,
          result.exit_code, result.exit_code == 127 ? " (could not start mpirun)" : "");
  // The JSON is the last line starting with '{' (mpirun may print notices on stdout first).
  nlohmann::json out;
  size_t end = result.out.size();
  while (end > 0) {
    size_t start = result.out.rfind('\n', end - 1);
    start = start == std::string::npos ? 0 : start + 1;
    auto line = result.out.substr(start, end - start);
    if (!line.empty() && line.front() == '{') {
      out = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      break;
    }
    if (start == 0) break;
    end = start - 1;
  }
  require(out.is_object() && out.contains("verified") && out.contains("total"), kPhase,
          "`{}` printed no result JSON; its output was:\n{}", command_text, result.out);
  require(out.value("variant", "") == request.variant, kPhase,
          "`{}` ran variant \"{}\", not the \"{}\" asked for", command_text,
          out.value("variant", ""), request.variant);
  out["command"] = command_text;
  out["transport"] = baseline_transport(request);
  return out;
}

}  // namespace proxyep::tools
