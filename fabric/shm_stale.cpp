#include "fabric/shm_stale.hpp"

#include "common/log.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

namespace proxyep::fabric {

namespace {

// The pid a region is named after ("<pid>:..."), or -1 for any other name.
pid_t region_pid(const char* name) {
  char* end = nullptr;
  errno = 0;
  long pid = std::strtol(name, &end, 10);
  if (end == name || *end != ':' || errno != 0 || pid <= 0 || name[0] < '0' || name[0] > '9')
    return -1;
  return static_cast<pid_t>(pid);
}

// Calls remove(dirfd, name, pid) for each region in `dir` (regular file, named "<pid>:...",
// owned by this process's effective user: another user's region is not ours to judge, even when
// root could remove it) and collects the paths it says it removed.
template <typename Remove>
std::vector<std::string> sweep(const std::string& dir, Remove&& remove) {
  std::vector<std::string> removed;
  DIR* stream = ::opendir(dir.c_str());
  if (stream == nullptr) return removed;
  const uid_t user = ::geteuid();
  while (const dirent* entry = ::readdir(stream)) {
    pid_t pid = region_pid(entry->d_name);
    if (pid < 0) continue;
    struct stat info {};
    if (::fstatat(::dirfd(stream), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (info.st_uid != user || !S_ISREG(info.st_mode)) continue;
    if (remove(::dirfd(stream), entry->d_name, pid)) removed.push_back(dir + "/" + entry->d_name);
  }
  ::closedir(stream);
  return removed;
}

// How long a sweep waits for another process's sweep of the same directory.
constexpr std::chrono::seconds kSweepLockWait{2};

// A process that is running: not gone, and not a zombie (whose memory, its mappings with it, is
// gone already; a container's init may take its time to reap the orphans of a killed job).
bool process_running(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // cannot tell: keep its regions
  // "pid (comm) state ...": comm may hold spaces and parentheses, so the state follows the last
  // ')'.
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

// Unlinks `name` if nobody has it open or mapped (see the header: the write lease). O_NONBLOCK:
// a file another sweeper holds a lease on fails at once instead of waiting for it.
bool unlink_if_unused(int dir_fd, const char* name) {
  int fd = ::openat(dir_fd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  bool removed = false;
  if (::fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
    removed = ::unlinkat(dir_fd, name, 0) == 0;
    (void)::fcntl(fd, F_SETLEASE, F_UNLCK);
  }
  ::close(fd);
  return removed;
}

}  // namespace

std::vector<std::string> remove_shm_regions_of(pid_t pid, const std::string& dir) {
  return sweep(dir, [pid](int dir_fd, const char* name, pid_t owner) {
    return owner == pid && ::unlinkat(dir_fd, name, 0) == 0;
  });
}

std::vector<std::string> remove_unused_shm_regions(const std::string& dir) {
  // One sweeper at a time on the node: two that open the same region at once each see the
  // other's open file and are both refused the lease, so the region would stay (every rank of a
  // job starts at once). The lock is on the directory itself; waited for with a bound, after
  // which the sweep goes ahead (contention only ever keeps a region, never removes a live one).
  int lock_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_fd >= 0) {
    const auto deadline = std::chrono::steady_clock::now() + kSweepLockWait;
    while (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto removed = sweep(dir, [](int dir_fd, const char* name, pid_t owner) {
    return !process_running(owner) && unlink_if_unused(dir_fd, name);
  });
  if (lock_fd >= 0) ::close(lock_fd);  // releases the lock
  return removed;
}

void remove_stale_shm_regions() {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      for (const auto& path : remove_shm_regions_of(::getpid()))
        log::info("fabric: removed {}, a shm region left by an earlier process with this pid",
                  path);
      for (const auto& path : remove_unused_shm_regions())
        log::info("fabric: removed {}, a shm region its process left when it died (nobody maps it)",
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
