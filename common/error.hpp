// Error policy (docs/ERRORS.md): setup and API misuse throw proxyep::Error carrying the phase
// and, where one is involved, the peer; the hot path (posting writes, polling completions,
// ring operations) returns a [[nodiscard]] Status instead. Library code never calls
// exit()/abort(): a failure always reaches the caller, and the process stays alive to tear down.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace proxyep {

// Outcome of a hot-path operation. `again` means "drive progress and retry", never an error.
enum class [[nodiscard]] Status{
    ok,
    again,        // resource temporarily exhausted (-FI_EAGAIN, ring full, no credit)
    timeout,      // a deadline passed
    peer_failed,  // a remote peer reported an error or went away
    error,        // anything else; the object holding the status can describe it
};

std::string_view to_string(Status status);

// The one exception type of the library. `what()` reads "<phase>: <message>", so every error
// names where it happened (e.g. "bootstrap.allgather: ranks 2, 3 did not arrive within 5000 ms").
class Error : public std::runtime_error {
 public:
  Error(std::string phase, std::string message);

  const std::string& phase() const noexcept { return phase_; }
  const std::string& message() const noexcept { return message_; }

 private:
  std::string phase_;
  std::string message_;
};

// Throws proxyep::Error(phase, formatted message).
template <typename... Args>
[[noreturn]] void fail(std::string phase, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(std::move(phase), fmt::format(format, std::forward<Args>(args)...));
}

// Setup-time precondition check: throws proxyep::Error when `condition` is false.
template <typename... Args>
void require(bool condition, std::string_view phase, fmt::format_string<Args...> format,
             Args&&... args) {
  if (!condition) fail(std::string(phase), format, std::forward<Args>(args)...);
}

}  // namespace proxyep
