#include "tools/bench/ep_baseline.hpp"

#include "common/error.hpp"
#include "tools/bench/subprocess.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>
#include <filesystem>

namespace proxyep::tools {
namespace {

constexpr const char* kPhase = "bench.ep.baseline";
constexpr const char* kBinary = "proxyep-mpi-baseline";

std::string baseline_binary() {
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  require(!error, kPhase, "cannot read /proc/self/exe: {}", error.message());
  auto binary = self.parent_path() / kBinary;
  require(access(binary.c_str(), X_OK) == 0, kPhase,
          "{} not found next to {}: this proxyep was built without MPI. Install Open MPI "
          "(scripts/install-deps.sh installs openmpi-bin and libopenmpi-dev), re-run cmake and "
          "rebuild, or use --baseline none",
          binary.string(), self.string());
  return binary.string();
}

}  // namespace

std::vector<std::string> mpi_baseline_command(const MpiBaselineRequest& request,
                                              const std::string& binary) {
  std::vector<std::string> cmd = {"mpirun",
                                  "--allow-run-as-root",
                                  "--oversubscribe",
                                  "--bind-to",
                                  "none",
                                  "-n",
                                  std::to_string(request.ranks),
                                  "--mca",
                                  "pml",
                                  "ob1",
                                  "--mca",
                                  "oob_tcp_if_include",
                                  "lo"};
  if (request.ranks_per_node < request.ranks)
    cmd.insert(cmd.end(), {"--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"});
  else
    cmd.insert(cmd.end(), {"--mca", "btl", "vader,self"});
  cmd.insert(cmd.end(), request.extra_mpirun_args.begin(), request.extra_mpirun_args.end());
  cmd.push_back(binary);
  if (request.workload.low_latency) cmd.emplace_back("ll");  // the low-latency baseline
  if (request.variant == kMpiRecords) cmd.emplace_back("--records");
  auto args = to_args(request.workload);
  cmd.insert(cmd.end(), args.begin(), args.end());
  cmd.insert(cmd.end(), {"--ranks-per-node", std::to_string(request.ranks_per_node)});
  return cmd;
}

void check_mpi_baseline_available() {
  baseline_binary();
  require(!find_in_path("mpirun").empty(), kPhase,
          "mpirun not found in PATH: install Open MPI (openmpi-bin) or use --baseline none");
}

nlohmann::json run_mpi_baseline(const MpiBaselineRequest& request) {
  check_mpi_baseline_available();
  auto binary = baseline_binary();
  auto cmd = mpi_baseline_command(request, binary);
  auto result = run_capturing_stdout(cmd, {}, request.timeout);
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
  return out;
}

}  // namespace proxyep::tools
