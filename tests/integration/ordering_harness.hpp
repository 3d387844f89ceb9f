// Shared plumbing of the ordering-layer integration programs (ordering_stress, ordering_streams):
// one rank's bootstrap + fabric, a receive region whose descriptor every rank knows, a
// QuietTracker that tickets every write (ticket = cookie) and a SignalRouter that every
// remote completion goes through -- the same loop a proxy thread runs.
#pragma once

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "control/quiet_tracker.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "reorder_check.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace proxyep::testing {

struct HarnessOptions {
  std::string provider = "shm";
  bool reorder = false;
  uint64_t seed = 1;
  int64_t timeout_ms = 60000;

  void add_to(CLI::App& app) {
    app.add_option("--provider", provider);
    app.add_flag("--reorder", reorder, "reorder shim on (EFA SRD semantics)");
    app.add_option("--seed", seed);
    app.add_option("--timeout-ms", timeout_ms);
  }
};

class Harness {
 public:
  static constexpr uint64_t kTickets = 4096;  // writes in flight per rank at most

  explicit Harness(const HarnessOptions& options) : options_(options) {
    params::fabric_provider.set(options.provider);
    params::fabric_reorder.set(options.reorder);
    params::fabric_reorder_seed.set(static_cast<int64_t>(options.seed));
    boot_ = control::Bootstrap::from_environment();
    fab_ = fabric::Fabric::open(fabric::FabricOptions::from_params(boot_->rank()));
    boot_->set_progress([this] { fab_->progress(); });
    fab_->connect(boot_->allgather(fab_->addresses(), "ordering(addresses)"));
  }

  int rank() const { return boot_->rank(); }
  int world() const { return boot_->world_size(); }
  control::Bootstrap& boot() { return *boot_; }
  fabric::Fabric& fabric() { return *fab_; }
  control::SignalRouter& router() { return router_; }
  control::QuietTracker& quiet() { return quiet_; }
  const HarnessOptions& options() const { return options_; }

  // Registers `size` bytes of zeroed receive memory and learns every rank's descriptor.
  uint8_t* open_region(size_t size) {
    recv_.assign(size, 0);
    recv_mr_ = fab_->register_memory(recv_.data(), recv_.size());
    for (const auto& blob :
         boot_->allgather(recv_mr_->descriptor().serialize(), "ordering(regions)"))
      peers_.push_back(fabric::RegionDescriptor::deserialize(blob));
    return recv_.data();
  }
  // Registers the send arena (rank-local).
  uint8_t* open_send(size_t size) {
    send_.assign(std::max<size_t>(size, 1), 0);
    send_mr_ = fab_->register_memory(send_.data(), send_.size());
    return send_.data();
  }

  // Called with the immediate of every remote completion before it is routed; and with the
  // router's complaint when routing fails (the default throws it).
  std::function<void(uint32_t)> observe = [](uint32_t) {};
  std::function<void(const std::string&)> route_error = [](const std::string& what) {
    fail("ordering.route", "{}", what);
  };

  // One round of the proxy's completion loop: local completions retire tickets, remote ones
  // go through the router.
  void pump() {
    fabric::Completion batch[64];
    size_t count = 0;
    fabric::Transport& rail = fab_->rail(0);
    if (rail.poll(batch, count) != Status::ok)
      fail("ordering.poll", "completion error: {}", rail.last_error());
    for (size_t i = 0; i < count; ++i) {
      if (batch[i].kind == fabric::Completion::Kind::local_write) {
        if (quiet_.complete(batch[i].cookie) != Status::ok)
          fail("ordering.quiet", "{}", quiet_.last_error());
        continue;
      }
      observe(batch[i].imm);
      if (router_.route(batch[i].imm) != Status::ok) route_error(router_.last_error());
    }
    if (deadline_.expired())
      fail("ordering", "the run passed its {} ms deadline", options_.timeout_ms);
  }

  // Posts one write of [send + offset, +length) to `peer`'s region at `remote_offset`.
  void write(int peer, size_t offset, size_t length, uint64_t remote_offset, uint32_t imm) {
    control::QuietTracker::Ticket ticket = 0;
    while (quiet_.post(ticket) == Status::again)
      pump();
    fabric::WriteOp op;
    op.peer = peer;
    op.local = send_.data() + offset;
    op.local_desc = send_mr_->local_desc(0);
    op.length = length;
    op.remote = peers_[static_cast<size_t>(peer)].target(0, length ? remote_offset : 0);
    op.imm = imm;
    op.cookie = ticket;
    Status status;
    while ((status = fab_->rail(0).write(op)) == Status::again)
      pump();
    if (status != Status::ok)
      fail("ordering.write", "write to rank {}: {}", peer, fab_->rail(0).last_error());
  }

  // Every write posted so far has completed locally.
  void quiet_all(const char* phase) {
    quiet_.wait_all(phase, deadline_, [this] { pump(); });
  }

  const Deadline& deadline() const { return deadline_; }

  // Collective, at the end of a run: with --reorder, the shim must have delivered some
  // completions out of order (reorder_check.hpp).
  void finish(const std::string& program) {
    if (options_.reorder) require_reordered(*boot_, out_of_order(fab_->reorder_stats()), program);
  }

 private:
  HarnessOptions options_;
  Deadline deadline_{std::chrono::milliseconds(options_.timeout_ms)};
  std::unique_ptr<control::Bootstrap> boot_;
  std::unique_ptr<fabric::Fabric> fab_;
  control::QuietTracker quiet_{kTickets};
  control::SignalRouter router_;
  std::vector<uint8_t> recv_, send_;
  std::unique_ptr<fabric::MemoryRegion> recv_mr_, send_mr_;
  std::vector<fabric::RegionDescriptor> peers_;
};

// A byte of payload that is never 0 (receive memory is zeroed, so an unlanded byte shows).
inline uint8_t pattern_byte(uint64_t h, size_t i) {
  return static_cast<uint8_t>(1 + ((h >> ((i & 7) * 8)) ^ (i * 131)) % 255);
}
inline uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

}  // namespace proxyep::testing
