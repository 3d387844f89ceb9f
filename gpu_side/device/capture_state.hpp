// CaptureState: what a DeviceRuntime keeps of a stream capture in progress
// (DeviceRuntime::begin_capture), and its refusal of a call a graph cannot hold, shared by the
// CUDA and the simulated device so that both say the same.
#pragma once

#include "common/error.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace proxyep::gpu_side::device {

struct CaptureState {
  std::string phase;                   // begin_capture's
  std::optional<std::string> invalid;  // the first call a graph cannot hold, for end_capture

  // Invalidates the capture with `what` (the first reason stays) and throws
  // proxyep::Error(phase), the message prefixed by `device` (may be empty).
  [[noreturn]] void refuse(std::string_view what, std::string_view phase_of_call,
                           std::string_view device) {
    std::string reason = fmt::format(
        "{}, inside the capture begun by {}: a graph holds no host waits, no joins and no "
        "copies with plain host memory",
        what, phase);
    if (!invalid) invalid = reason;
    fail(std::string(phase_of_call), "{}{}", device, reason);
  }
};

}  // namespace proxyep::gpu_side::device
