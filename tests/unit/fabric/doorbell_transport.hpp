// Test double: a Transport that behaves like a doorbell provider (EFA, verbs) about FI_MORE.
// Such a provider may leave a write posted with FI_MORE in its send queue, unseen by the NIC,
// until a write without FI_MORE on the same endpoint rings the doorbell. A burst whose last write
// keeps the flag then waits for the next burst: in production, a hang. tcp and shm make progress
// on FI_MORE writes anyway, so without this double a dangling flag passes every test.
//
// Semantics, per rail (one DoorbellTransport wraps one rail):
// - write() with `more` holds the write here: nothing is posted, nothing moves, no completion
//   comes; it returns ok.
// - write() without `more` rings the doorbell: every held write, then this one, go to the
//   transport below in order (with `more` cleared: the doorbell has rung). What the transport
//   below pushes back (again) stays rung and goes on from poll(); until it has, write() returns
//   again. A write the transport below refuses fails at the next poll() (it was accepted here).
// - poll() never rings the doorbell, just as on EFA.
//
// Below it is a real transport (the libfabric rail, or the reorder shim), so bytes really move.
// Install it with FabricOptions::wrap_rail (DoorbellRails does): that hook sits above the reorder
// shim, which clears FI_MORE on the segments it posts and would hide the flag from a double below.
// One thread uses it, like any Transport; the counters may be read from any thread.
#pragma once

#include "fabric/fabric.hpp"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace proxyep::fabric::testing {

class DoorbellTransport final : public Transport {
 public:
  explicit DoorbellTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  const Capabilities& capabilities() const override { return inner_->capabilities(); }
  int rail_index() const override { return inner_->rail_index(); }
  Bytes address() const override { return inner_->address(); }
  void connect(const std::vector<Bytes>& addresses) override { inner_->connect(addresses); }

  [[nodiscard]] Status write(const WriteOp& op) override {
    if (!push_rung()) return Status::again;
    if (op.more) {
      held_.push_back(op);
      held_now_.store(held_.size(), std::memory_order_relaxed);
      held_total_.store(held_total_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return Status::ok;
    }
    if (!held_.empty())
      batches_.store(batches_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    rung_.insert(rung_.end(), held_.begin(), held_.end());
    rung_.push_back(op);
    held_.clear();
    held_now_.store(0, std::memory_order_relaxed);
    push_rung();  // what the transport below pushes back goes on from poll()
    return Status::ok;
  }

  [[nodiscard]] Status poll(std::span<Completion> out, size_t& count) override {
    count = 0;
    if (failures_.empty()) push_rung();
    if (!failures_.empty()) {
      last_error_ = std::move(failures_.front().text);
      Status status = failures_.front().status;
      failures_.pop_front();
      return status;
    }
    Status status = inner_->poll(out, count);
    if (status != Status::ok) last_error_ = inner_->last_error();
    return status;
  }

  size_t writes_in_flight() const override {
    return inner_->writes_in_flight() + held_.size() + rung_.size();
  }
  const std::string& last_error() const override { return last_error_; }

  // Writes held behind FI_MORE now (waiting for a write without it on this rail).
  size_t held() const { return held_now_.load(std::memory_order_relaxed); }
  // Writes that were ever held, and doorbells that released at least one of them: proof that
  // the layer above batched its writes.
  uint64_t held_total() const { return held_total_.load(std::memory_order_relaxed); }
  uint64_t batches() const { return batches_.load(std::memory_order_relaxed); }

 private:
  struct Failure {
    Status status = Status::error;
    std::string text;
  };

  // Posts rung writes in order; false while the transport below pushes back.
  bool push_rung() {
    while (!rung_.empty()) {
      WriteOp op = rung_.front();
      op.more = false;
      Status status = inner_->write(op);
      if (status == Status::again) return false;
      rung_.pop_front();
      if (status != Status::ok) failures_.push_back({status, inner_->last_error()});
    }
    return true;
  }

  std::unique_ptr<Transport> inner_;
  std::vector<WriteOp> held_;  // posted with FI_MORE, waiting for the doorbell
  std::deque<WriteOp> rung_;   // the doorbell rang; the transport below said again
  std::deque<Failure> failures_;
  std::string last_error_;
  std::atomic<size_t> held_now_{0};
  std::atomic<uint64_t> held_total_{0};
  std::atomic<uint64_t> batches_{0};
};

// Installs a DoorbellTransport on every rail of the Fabrics opened with the options it returns,
// and keeps pointers to them (owned by those Fabrics) for the test's checks and messages.
class DoorbellRails {
 public:
  FabricOptions install(FabricOptions options) {
    options.wrap_rail = [this](std::unique_ptr<Transport> inner) -> std::unique_ptr<Transport> {
      auto rail = std::make_unique<DoorbellTransport>(std::move(inner));
      rails_.push_back(rail.get());
      return rail;
    };
    return options;
  }

  const std::vector<DoorbellTransport*>& rails() const { return rails_; }
  size_t held() const {
    size_t sum = 0;
    for (const DoorbellTransport* rail : rails_)
      sum += rail->held();
    return sum;
  }
  uint64_t held_total() const {
    uint64_t sum = 0;
    for (const DoorbellTransport* rail : rails_)
      sum += rail->held_total();
    return sum;
  }
  uint64_t batches() const {
    uint64_t sum = 0;
    for (const DoorbellTransport* rail : rails_)
      sum += rail->batches();
    return sum;
  }
  // For a failure message: how many writes are held, on which rails (in the order they opened).
  std::string report() const {
    std::string per_rail;
    for (size_t i = 0; i < rails_.size(); ++i)
      per_rail += fmt::format("{}{}: {}", i == 0 ? "" : ", ", i, rails_[i]->held());
    return fmt::format(
        "{} write(s) held behind FI_MORE, never followed by a write without it on their rail "
        "(held per rail, in the order the rails opened: {}); {} writes were held in all, {} "
        "doorbells released some",
        held(), per_rail, held_total(), batches());
  }

 private:
  std::vector<DoorbellTransport*> rails_;
};

}  // namespace proxyep::fabric::testing
