#include "python_signals.hpp"

#include "common/error.hpp"

namespace proxyep::python {
namespace {

// Handlers run this often at most: taking the GIL on every 1 ms poll slice of the bootstrap
// would make every waiting rank contend with the Python threads for nothing.
constexpr std::chrono::milliseconds kCheckEvery{20};

}  // namespace

std::function<void()> PythonSignals::hook() {
  return [state = state_] {
    const auto now = std::chrono::steady_clock::now();
    if (now < state->next_check) return;
    state->next_check = now + kCheckEvery;
    pybind11::gil_scoped_acquire held;
    // Runs the handlers of the signals that arrived (on the main thread only; elsewhere 0).
    if (PyErr_CheckSignals() == 0) return;
    state->raised.emplace();  // fetches the handler's exception, clearing Python's error state
    const auto name = pybind11::str(state->raised->type().attr("__name__")).cast<std::string>();
    fail("python.signal", "a Python signal handler raised {} during the wait", name);
  };
}

void PythonSignals::raise_if_interrupted() {
  if (!state_->raised) return;
  pybind11::error_already_set raised = std::move(*state_->raised);
  state_->raised.reset();
  throw raised;
}

}  // namespace proxyep::python
