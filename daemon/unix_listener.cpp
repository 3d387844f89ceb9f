#include "daemon/unix_listener.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "control/unix_socket.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string_view>

namespace proxyep::daemon {
namespace {

constexpr std::string_view kPhase = "daemon.socket";
constexpr mode_t kDirectoryMode = 0750;
constexpr int kBacklog = 128;

// Creates each missing directory of `dir` with mode 0750 (exactly: chmod after mkdir, whatever
// the umask).
void ensure_directory(const std::filesystem::path& dir) {
  if (dir.empty()) return;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    require(S_ISDIR(st.st_mode), kPhase, "{} exists and is not a directory", dir.string());
    return;
  }
  require(errno == ENOENT, kPhase, "cannot reach directory {}: {}", dir.string(),
          control::errno_text(errno));
  ensure_directory(dir.parent_path() == dir ? std::filesystem::path() : dir.parent_path());
  if (::mkdir(dir.c_str(), kDirectoryMode) != 0 && errno != EEXIST)
    fail(std::string(kPhase), "cannot create directory {}: {}", dir.string(),
         control::errno_text(errno));
  if (::chmod(dir.c_str(), kDirectoryMode) != 0)
    fail(std::string(kPhase), "cannot set mode 0750 on {}: {}", dir.string(),
         control::errno_text(errno));
  log::info("proxyepd: created directory {} (mode 0750)", dir.string());
}

// Holds <path>.lock, writing this process's pid into it; Error naming the holder if another
// process has it.
control::Socket take_lock(const std::string& path) {
  const std::string lock_path = path + ".lock";
  control::Socket lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  require(lock.valid(), kPhase, "cannot open lock file {}: {}", lock_path,
          control::errno_text(errno));
  if (::flock(lock.fd(), LOCK_EX | LOCK_NB) != 0) {
    require(errno == EWOULDBLOCK, kPhase, "cannot lock {}: {}", lock_path,
            control::errno_text(errno));
    char holder[32] = {};
    const ssize_t n = ::pread(lock.fd(), holder, sizeof holder - 1, 0);
    fail(std::string(kPhase), "another proxyepd serves {} (pid {}, which holds {})", path,
         n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("unknown"), lock_path);
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock.fd(), 0) != 0 ||
      ::pwrite(lock.fd(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    log::warn("proxyepd: cannot write the pid into {}: {}", lock_path, control::errno_text(errno));
  return lock;
}

// Removes a stale socket file at `path`; Error if the path is served or is not a socket.
void clear_path(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    require(errno == ENOENT, kPhase, "cannot inspect {}: {}", path, control::errno_text(errno));
    return;
  }
  require(S_ISSOCK(st.st_mode), kPhase,
          "{} exists and is not a socket; proxyepd does not remove it (choose another "
          "daemon.socket, or remove it yourself)",
          path);
  int error = 0;
  control::Socket probe = control::connect_unix(path, Deadline::after_ms(100), error);
  if (error == 0 || error == EAGAIN)
    fail(std::string(kPhase), "another proxyepd serves {} (it {} a connection)", path,
         error == 0 ? "accepted" : "has a full backlog and did not refuse");
  require(error == ECONNREFUSED, kPhase, "cannot tell whether {} is served: connect: {}", path,
          control::errno_text(error));
  require(::unlink(path.c_str()) == 0 || errno == ENOENT, kPhase,
          "cannot remove the stale socket {}: {}", path, control::errno_text(errno));
  log::warn("proxyepd: replaced the stale socket {} (nothing accepted on it: its daemon died)",
            path);
}

}  // namespace

UnixListener& UnixListener::operator=(UnixListener&& other) noexcept {
  if (this != &other) {
    close();
    socket_ = std::move(other.socket_);
    lock_ = std::move(other.lock_);
    path_ = std::move(other.path_);
    other.path_.clear();  // the moved-from listener owns no file
    dev_ = other.dev_;
    ino_ = other.ino_;
  }
  return *this;
}

UnixListener UnixListener::open(const std::string& path, mode_t mode) {
  const control::UnixAddress address = control::unix_address(path, std::string(kPhase));
  ensure_directory(std::filesystem::path(path).parent_path());
  UnixListener listener;
  listener.lock_ = take_lock(path);
  clear_path(path);
  listener.socket_ =
      control::Socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  require(listener.socket_.valid(), kPhase, "socket: {}", control::errno_text(errno));
  if (::bind(listener.socket_.fd(), reinterpret_cast<const sockaddr*>(&address.addr),
             address.len) != 0)
    fail(std::string(kPhase), "cannot bind {}: {}", path, control::errno_text(errno));
  struct stat st {};
  require(::stat(path.c_str(), &st) == 0, kPhase, "cannot stat {} after bind: {}", path,
          control::errno_text(errno));
  listener.path_ = path;  // from here on close() removes the file
  listener.dev_ = st.st_dev;
  listener.ino_ = st.st_ino;
  require(::chmod(path.c_str(), mode) == 0, kPhase, "cannot set mode {:04o} on {}: {}", mode, path,
          control::errno_text(errno));
  require(::listen(listener.socket_.fd(), kBacklog) == 0, kPhase, "cannot listen on {}: {}", path,
          control::errno_text(errno));
  return listener;
}

void UnixListener::close() noexcept {
  if (socket_.valid()) socket_.close();
  if (!path_.empty()) {
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
      ::unlink(path_.c_str());
    path_.clear();
  }
  lock_.close();
}

}  // namespace proxyep::daemon
