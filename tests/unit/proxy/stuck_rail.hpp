// A rail whose poll() blocks while its gate is armed: a provider call that does not return (as
// on shm when a dead peer held a lock in shared memory). The gate must outlive the rail's users.
#pragma once

#include "fabric/transport.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace proxyep::proxy::testing {

struct StuckGate {
  std::atomic<bool> armed{false};
  std::atomic<bool> inside{false};  // a thread has blocked in poll() since it was armed
};

// A rail that passes everything to the one it wraps, for decorators to override a call or two.
class ForwardingRail : public fabric::Transport {
 public:
  explicit ForwardingRail(std::unique_ptr<fabric::Transport> inner) : inner_(std::move(inner)) {}
  const fabric::Capabilities& capabilities() const override { return inner_->capabilities(); }
  int rail_index() const override { return inner_->rail_index(); }
  fabric::Bytes address() const override { return inner_->address(); }
  void connect(const std::vector<fabric::Bytes>& addresses) override { inner_->connect(addresses); }
  [[nodiscard]] Status write(const fabric::WriteOp& op) override { return inner_->write(op); }
  [[nodiscard]] Status poll(std::span<fabric::Completion> out, size_t& count) override {
    return inner_->poll(out, count);
  }
  size_t writes_in_flight() const override { return inner_->writes_in_flight(); }
  const std::string& last_error() const override { return inner_->last_error(); }

 protected:
  std::unique_ptr<fabric::Transport> inner_;
};

class StuckRail final : public ForwardingRail {
 public:
  StuckRail(std::unique_ptr<fabric::Transport> inner, StuckGate& gate)
      : ForwardingRail(std::move(inner)), gate_(gate) {}
  [[nodiscard]] Status poll(std::span<fabric::Completion> out, size_t& count) override {
    while (gate_.armed) {
      gate_.inside = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return inner_->poll(out, count);
  }

 private:
  StuckGate& gate_;
};

}  // namespace proxyep::proxy::testing
