// `proxyep bench rendezvous`: the bootstrap's control plane against the number of ranks, with
// every rank a thread of this process (1024 rank processes do not fit a small box; the control
// plane is the same sockets, handshakes and collectives either way, on loopback).
//
// Per world size and repetition, all ranks start together (a latch) and each:
//   1. joins the rendezvous (Bootstrap::connect with a job id and secret, as `proxyep launch`
//      gives its ranks: the challenge, the HMAC proofs both ways, the welcome);
//   2. enters a barrier;
//   3. allgathers `address_bytes` bytes (a fabric address's size), checked on every rank.
// Reported per world size over the repetitions (p50, p99, max), each as the slowest rank sees it:
//   rendezvous_ms  start -> the last rank returned from connect;
//   barrier_ms     the last rank connected -> the last rank left the barrier;
//   allgather_ms   the last rank left the barrier -> the last rank had every address;
// and `verified` (every allgather returned every rank's bytes on every rank).
#pragma once

#include "tools/commands.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace proxyep::tools {

struct RendezvousBenchOptions {
  std::vector<int> ranks{16, 64, 256, 1024};  // world sizes
  int reps = 5;                               // repetitions of each
  size_t address_bytes = 64;                  // each rank's allgather contribution
  int64_t timeout_ms = 60'000;                // bootstrap.timeout_ms of every rank
};

nlohmann::json run_rendezvous_bench(const RendezvousBenchOptions& options);
void print_rendezvous_bench(const nlohmann::json& results);
void register_bench_rendezvous(CLI::App& bench, Action& action);

}  // namespace proxyep::tools
