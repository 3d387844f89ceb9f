// A bootstrap rank for tests run under `proxyep launch`: Bootstrap::from_environment(), then an
// allgather, a barrier and a broadcast, each checked. Exit 0 = pass, 1 = a proxyep::Error (on
// stderr), 2 = wrong data. `--die R`: rank R closes its bootstrap right after the allgather and
// exits 3 a moment later, so the others must report it.
#include "common/error.hpp"
#include "control/bootstrap.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

using namespace proxyep;

namespace {

control::Bytes text_bytes(const std::string& text) {
  return {text.begin(), text.end()};
}

int run(int die_rank) {
  auto boot = control::Bootstrap::from_environment();
  const int rank = boot->rank(), world = boot->world_size();
  auto all = boot->allgather(text_bytes(fmt::format("rank {}", rank)), "probe names");
  for (int from = 0; from < world; ++from) {
    if (all.at(from) != text_bytes(fmt::format("rank {}", from))) {
      fmt::print(stderr, "probe: wrong allgather entry from rank {}\n", from);
      return 2;
    }
  }
  if (rank == die_rank) {
    boot.reset();
    // Let the others notice the closed connection and report it before we are reaped (the
    // launcher stops the others once we exit).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return 3;
  }
  boot->barrier("probe");
  auto message = boot->broadcast(text_bytes("from the last rank"), world - 1, "probe");
  if (message != text_bytes("from the last rank")) {
    fmt::print(stderr, "probe: wrong broadcast data\n");
    return 2;
  }
  fmt::print("probe: rank {} of {} (node {} of {}) ok\n", rank, world, boot->env().node(),
             boot->env().num_nodes());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int die_rank = -1;
  if (argc == 3 && std::string(argv[1]) == "--die") die_rank = std::stoi(argv[2]);
  try {
    return run(die_rank);
  } catch (const Error& e) {
    fmt::print(stderr, "probe: error: {}\n", e.what());
    return 1;
  }
}
