#include "tools/launch_credentials.hpp"

#include "common/crypto.hpp"
#include "common/error.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"
#include "control/tcp_socket.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <span>
#include <vector>

namespace proxyep::tools {
namespace {

constexpr const char* kPhase = "launch";
constexpr size_t kSecretBytes = 32;

// $XDG_RUNTIME_DIR is the user's own tmpfs (mode 0700, never on disk); else $TMPDIR; else /tmp.
std::string base_directory() {
  for (const char* name : {"XDG_RUNTIME_DIR", "TMPDIR"}) {
    auto value = config::read_environment(name);
    struct stat info {};
    if (value && !value->empty() && ::stat(value->c_str(), &info) == 0 && S_ISDIR(info.st_mode) &&
        ::access(value->c_str(), W_OK | X_OK) == 0)
      return *value;
  }
  return "/tmp";
}

void write_all(int fd, std::span<const uint8_t> bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, kPhase, "cannot write the job's secret to '{}': {}", path,
            control::errno_text(errno));
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
}

}  // namespace

LaunchCredentials::LaunchCredentials() {
  if (params::bootstrap_job_id.get().empty()) {
    std::array<uint8_t, 8> id{};
    secure_random_bytes(id);
    env_.emplace_back(params::bootstrap_job_id.env_name(), "launch-" + hex_string(id));
  }
  if (params::bootstrap_secret_file.get().empty() && params::bootstrap_secret.get().empty()) {
    try {
      create_secret_file();
    } catch (...) {
      remove();  // the destructor does not run for a constructor that throws
      throw;
    }
    env_.emplace_back(params::bootstrap_secret_file.env_name(), file_);
  }
}

void LaunchCredentials::create_secret_file() {
  std::string pattern = base_directory() + "/proxyep-launch-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  // mkdtemp creates the directory with mode 0700: nobody else can list or enter it.
  require(::mkdtemp(name.data()) != nullptr, kPhase,
          "cannot create a private directory for the job's secret ('{}'): {}", pattern,
          control::errno_text(errno));
  directory_ = name.data();
  file_ = directory_ + "/secret";
  int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  require(fd >= 0, kPhase, "cannot create the job's secret file '{}': {}", file_,
          control::errno_text(errno));
  SecretBytes secret = SecretBytes::random_hex(kSecretBytes);
  try {
    write_all(fd, secret.bytes(), file_);
  } catch (...) {
    ::close(fd);
    throw;
  }
  require(::close(fd) == 0, kPhase, "cannot write the job's secret to '{}': {}", file_,
          control::errno_text(errno));
}

void LaunchCredentials::remove() noexcept {
  if (!file_.empty()) ::unlink(file_.c_str());
  if (!directory_.empty()) ::rmdir(directory_.c_str());
  file_.clear();
  directory_.clear();
}

LaunchCredentials::~LaunchCredentials() {
  remove();
}

}  // namespace proxyep::tools
