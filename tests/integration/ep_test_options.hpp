// What the Buffer integration programs (ep_buffer, ep_low_latency) share: the options of a run,
// the fabric parameters they set, and main()'s parse-run-report frame.
#pragma once

#include "common/error.hpp"
#include "common/params.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

namespace proxyep::testing {

struct EpTestOptions {
  std::string provider = "shm";
  bool reorder = false;
  int ranks_per_node = 0;
  uint64_t seed = 1;
  bool bad_input = false;
  int die_rank = -1;
};

inline void add_ep_test_options(CLI::App& app, EpTestOptions& o) {
  app.add_option("--provider", o.provider, "fabric provider for ranks on other nodes");
  app.add_flag("--reorder", o.reorder, "reorder shim on");
  app.add_option("--ranks-per-node", o.ranks_per_node, "0 = LOCAL_WORLD_SIZE");
  app.add_option("--seed", o.seed);
  app.add_flag("--bad-input", o.bad_input, "invalid calls first, then valid ones");
  app.add_option("--die-rank", o.die_rank, "this rank leaves before its second case");
}

// The fabric the program's Buffer opens: provider, reorder shim and its seed.
inline void set_fabric_params(const EpTestOptions& o) {
  params::fabric_provider.set(o.provider);
  params::fabric_reorder.set(o.reorder);
  params::fabric_reorder_seed.set(static_cast<int64_t>(o.seed));
}

// Parses the command line and runs `run()`: exit code 0 = pass; a proxyep::Error is printed
// with the program's name and gives 1.
template <typename Run>
int run_ep_test(const char* program, CLI::App& app, int argc, char** argv, Run&& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace proxyep::testing
