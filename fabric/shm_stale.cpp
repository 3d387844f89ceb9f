#include "fabric/shm_stale.hpp"

#include "common/log.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace proxyep::fabric {

std::vector<std::string> remove_shm_regions_of(pid_t pid, const std::string& dir) {
  std::vector<std::string> removed;
  const std::string prefix = std::to_string(pid) + ":";
  DIR* stream = ::opendir(dir.c_str());
  if (stream == nullptr) return removed;
  const uid_t user = ::geteuid();
  while (const dirent* entry = ::readdir(stream)) {
    if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    // Another user's region is not ours to judge, even when root could remove it.
    struct stat info {};
    if (::fstatat(::dirfd(stream), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (info.st_uid != user || !S_ISREG(info.st_mode)) continue;
    if (::unlinkat(::dirfd(stream), entry->d_name, 0) == 0)
      removed.push_back(dir + "/" + entry->d_name);
  }
  ::closedir(stream);
  return removed;
}

void remove_stale_shm_regions() {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      for (const auto& path : remove_shm_regions_of(::getpid()))
        log::info("fabric: removed {}, a shm region left by an earlier process with this pid",
                  path);
    } catch (const std::exception&) {
      // Only allocation can throw here; the leftovers then stay, as before this existed.
    }
  });
}

void remove_own_shm_regions_at_exit() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] {
      try {
        (void)remove_shm_regions_of(::getpid());
      } catch (const std::exception&) {
        // Only allocation can throw here; the regions then stay, as before this existed.
      }
    });
  });
}

}  // namespace proxyep::fabric
