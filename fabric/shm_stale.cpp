#include "fabric/shm_stale.hpp"

#include "common/log.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <string>

namespace proxyep::fabric {

void remove_stale_shm_regions() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string prefix = std::to_string(::getpid()) + ":";
    DIR* dir = ::opendir("/dev/shm");
    if (dir == nullptr) return;
    while (const dirent* entry = ::readdir(dir)) {
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) != 0) continue;
      std::string path = std::string("/dev/shm/") + entry->d_name;
      if (::unlink(path.c_str()) == 0)
        log::info("fabric: removed {}, a shm region left by an earlier process with this pid",
                  path);
    }
    ::closedir(dir);
  });
}

}  // namespace proxyep::fabric
