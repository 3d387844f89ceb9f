#include "common/error.hpp"

namespace proxyep {

std::string_view to_string(Status status) {
  switch (status) {
    case Status::ok:
      return "ok";
    case Status::again:
      return "again";
    case Status::timeout:
      return "timeout";
    case Status::peer_failed:
      return "peer failed";
    case Status::error:
      return "error";
  }
  return "unknown";
}

Error::Error(std::string phase, std::string message)
    : std::runtime_error(phase + ": " + message),
      phase_(std::move(phase)),
      message_(std::move(message)) {}

}  // namespace proxyep
