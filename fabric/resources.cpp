#include "fabric/resources.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

#include <rdma/fi_errno.h>

namespace proxyep::fabric {

namespace detail {

void close_fid(fid* object, std::string_view kind) noexcept {
  int rc = fi_close(object);
  if (rc != 0) {
    try {
      log::warn("fabric: closing the {} failed: {}", kind, fi_error_text(rc));
    } catch (...) {
      // Logging itself failed (out of memory): nothing more a destructor can do.
    }
  }
}

}  // namespace detail

InfoPtr duplicate_info(const fi_info& info) {
  InfoPtr copy(fi_dupinfo(&info));
  require(copy != nullptr, "fabric.open", "fi_dupinfo failed (out of memory)");
  return copy;
}

std::string fi_error_text(int64_t rc) {
  int code = static_cast<int>(rc < 0 ? -rc : rc);
  return fmt::format("{} (-{})", fi_strerror(code), code);
}

void check_fi(int rc, std::string_view phase, std::string_view what) {
  if (rc < 0) fail(std::string(phase), "{} failed: {}", what, fi_error_text(rc));
}

}  // namespace proxyep::fabric
