// Python's signal handlers during a long native wait. The Buffer's constructor waits for every
// rank (the rendezvous, the session's collectives) with the GIL released, for up to
// bootstrap.timeout_ms; Python runs a handler only when its main thread gets back to bytecode,
// so Ctrl-C (KeyboardInterrupt) or a SIGTERM handler that exits would otherwise wait that long.
// PythonSignals gives the handlers their turn between the bootstrap's socket polls and ends the
// wait when one raises; the caller re-raises that exception in place of the bootstrap's error.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

namespace proxyep::python {

class PythonSignals {
 public:
  // Shares this object's state: the hook may outlive no wait it is given to (clear it after).
  std::function<void()> hook();
  // With the GIL held: raises the exception a handler raised during the wait, if any.
  void raise_if_interrupted();

 private:
  struct State {
    std::chrono::steady_clock::time_point next_check{};
    std::optional<pybind11::error_already_set> raised;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace proxyep::python
