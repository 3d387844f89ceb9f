// The job identity and secret `proxyep launch` gives its ranks, so that only they can join the
// job's rendezvous (control/rendezvous_auth.hpp; docs/SECURITY.md).
//
// - Job id: "launch-" and 16 random hex digits, as PROXYEP_BOOTSTRAP_JOB_ID, unless the
//   launcher's own configuration already names one (bootstrap.job_id).
// - Secret: 32 bytes from the CSPRNG, as 64 hex digits in a file only the user can read: a fresh
//   directory (mkdtemp, mode 0700) under $XDG_RUNTIME_DIR (a per-user tmpfs), else $TMPDIR, else
//   /tmp, holding `secret` (created exclusively, mode 0600), named to the ranks as
//   PROXYEP_BOOTSTRAP_SECRET_FILE; unless a secret is configured already (bootstrap.secret_file or
//   bootstrap.secret, which the ranks then inherit). The secret itself is never in an
//   environment, a command line or a message.
// The destructor removes the file and its directory (when the job ends, whatever way it ends
// short of SIGKILL of the launcher itself).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace proxyep::tools {

class LaunchCredentials {
 public:
  // Creates what the configuration does not already provide. Throws proxyep::Error("launch").
  LaunchCredentials();
  ~LaunchCredentials();
  LaunchCredentials(const LaunchCredentials&) = delete;
  LaunchCredentials& operator=(const LaunchCredentials&) = delete;

  // Variables for every rank (empty when the configuration provides both).
  const std::vector<std::pair<std::string, std::string>>& environment() const { return env_; }
  const std::string& secret_file() const { return file_; }  // "" when none was created

 private:
  void create_secret_file();
  void remove() noexcept;

  std::vector<std::pair<std::string, std::string>> env_;
  std::string directory_;
  std::string file_;
};

}  // namespace proxyep::tools
