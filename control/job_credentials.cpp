#include "control/job_credentials.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"
#include "control/bootstrap_wire.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace proxyep::control {
namespace {

constexpr const char* kSecretPhase = "bootstrap.secret";

// Closes the descriptor and wipes the buffer on every path out of read_secret_file.
struct SecretFile {
  int fd = -1;
  std::vector<uint8_t> buffer;
  ~SecretFile() {
    if (fd >= 0) ::close(fd);
    SecretBytes wipe{std::move(buffer)};  // zeroed by its destructor
  }
};

}  // namespace

SecretBytes read_secret_file(const std::string& path, std::string_view what) {
  SecretFile file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  require(file.fd >= 0, kSecretPhase, "{} '{}' cannot be opened: {}", what, path,
          std::strerror(errno));
  struct stat info {};
  require(::fstat(file.fd, &info) == 0, kSecretPhase, "{} '{}': fstat failed: {}", what, path,
          std::strerror(errno));
  require(S_ISREG(info.st_mode), kSecretPhase, "{} '{}' is not a regular file", what, path);
  require(info.st_uid == ::geteuid() || info.st_uid == 0, kSecretPhase,
          "{} '{}' belongs to uid {}, not to this user (uid {}) or root: a secret must be the "
          "job user's own",
          what, path, info.st_uid, ::geteuid());
  require((info.st_mode & 077) == 0, kSecretPhase,
          "{} '{}' has mode {:04o}: other users may read or change it; make it readable by its "
          "owner only (chmod 600 '{}')",
          what, path, info.st_mode & 07777, path);
  require(info.st_size <= static_cast<off_t>(kMaxSecretBytes) + 2, kSecretPhase,
          "{} '{}' holds {} bytes; a secret is {}..{} bytes", what, path, info.st_size,
          kMinSecretBytes, kMaxSecretBytes);
  file.buffer.resize(kMaxSecretBytes + 3);
  size_t have = 0;
  while (have < file.buffer.size()) {
    ssize_t n = ::read(file.fd, file.buffer.data() + have, file.buffer.size() - have);
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, kSecretPhase, "{} '{}' cannot be read: {}", what, path, std::strerror(errno));
    have += static_cast<size_t>(n);
  }
  // `echo`/`openssl rand -hex` end the file with a newline; it is not part of the secret.
  while (have > 0 && (file.buffer[have - 1] == '\n' || file.buffer[have - 1] == '\r'))
    --have;
  SecretBytes secret(std::span<const uint8_t>(file.buffer.data(), have));
  check_secret(secret, fmt::format("{} '{}'", what, path));
  return secret;
}

void check_secret(const SecretBytes& secret, std::string_view what) {
  require(secret.size() >= kMinSecretBytes && secret.size() <= kMaxSecretBytes, kSecretPhase,
          "{} holds a secret of {} bytes; it must be {}..{} bytes (e.g. 32 random bytes as hex: "
          "openssl rand -hex 32)",
          what, secret.size(), kMinSecretBytes, kMaxSecretBytes);
}

void check_job_id(std::string_view job_id, std::string_view what) {
  require(job_id.size() <= wire::kMaxJobIdBytes, "bootstrap.env",
          "{} is {} bytes long; a job id is at most {}", what, job_id.size(), wire::kMaxJobIdBytes);
  for (char c : job_id) {
    auto byte = static_cast<unsigned char>(c);
    require(byte >= 0x20 && byte < 0x7f, "bootstrap.env",
            "{} holds the byte 0x{:02x}; a job id is printable ASCII", what, byte);
  }
}

JobCredentials JobCredentials::from_environment() {
  JobCredentials credentials;
  const auto& id_param = params::bootstrap_job_id;
  if (auto id = id_param.get(); !id.empty()) {
    check_job_id(id, fmt::format("{} ({})", id_param.name(), id_param.env_name()));
    credentials.job_id = std::move(id);
  } else if (auto run_id = config::read_environment("TORCHELASTIC_RUN_ID")) {
    check_job_id(*run_id, "TORCHELASTIC_RUN_ID");
    credentials.job_id = std::move(*run_id);
  }
  const auto& file_param = params::bootstrap_secret_file;
  const auto& raw_param = params::bootstrap_secret;
  std::string path = file_param.get();
  std::string raw = raw_param.get();
  require(path.empty() || raw.empty(), kSecretPhase,
          "both {} ({}) and {} ({}) are set: give the job's secret one way", file_param.name(),
          file_param.env_name(), raw_param.name(), raw_param.env_name());
  if (!path.empty()) {
    credentials.secret = std::make_shared<const SecretBytes>(
        read_secret_file(path, fmt::format("{} ({})", file_param.name(), file_param.env_name())));
  } else if (!raw.empty()) {
    SecretBytes secret(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));
    check_secret(secret, fmt::format("{} ({})", raw_param.name(), raw_param.env_name()));
    credentials.secret = std::make_shared<const SecretBytes>(std::move(secret));
  }
  return credentials;
}

std::string daemon_job_tag(const JobCredentials& credentials) {
  if (!credentials.secret || credentials.secret->empty()) return "";
  // The label keeps this MAC from standing for any other message the secret signs (the
  // rendezvous' "hello" and "welcome"); the NUL ends the label, so no job id can extend it.
  std::string message("proxyepd job");
  message.push_back('\0');
  message += credentials.job_id;
  const auto bytes = std::span(reinterpret_cast<const uint8_t*>(message.data()), message.size());
  return hex_string(hmac_sha256(credentials.secret->bytes(), bytes));
}

}  // namespace proxyep::control
