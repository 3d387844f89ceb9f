#include "common/descriptor_limit.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace proxyep {

uint64_t reserve_descriptors(uint64_t needed, const std::string& phase) {
  rlimit limit{};
  require(::getrlimit(RLIMIT_NOFILE, &limit) == 0, phase, "getrlimit(RLIMIT_NOFILE): {}",
          std::strerror(errno));
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return limit.rlim_cur;
  require(limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed, phase,
          "this process needs {} file descriptors but its hard RLIMIT_NOFILE is {} (soft {}): "
          "raise it (ulimit -Hn, or LimitNOFILE= / the container's nofile ulimit)",
          needed, limit.rlim_max, limit.rlim_cur);
  const rlim_t previous = limit.rlim_cur;
  limit.rlim_cur = needed;
  require(::setrlimit(RLIMIT_NOFILE, &limit) == 0, phase,
          "raising the soft RLIMIT_NOFILE from {} to {}: {}", previous, needed,
          std::strerror(errno));
  log::debug("{}: raised the soft RLIMIT_NOFILE from {} to {}", phase, previous, needed);
  return limit.rlim_cur;
}

}  // namespace proxyep
