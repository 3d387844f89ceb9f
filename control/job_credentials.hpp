// The job's identity and secret as the bootstrap reads them (control/rendezvous_auth.hpp says
// what they protect; docs/SECURITY.md says it for users).
//
// Job id: bootstrap.job_id when set, else torchrun's TORCHELASTIC_RUN_ID, else none (""). At
// most wire::kMaxJobIdBytes printable ASCII characters.
// Secret: bootstrap.secret_file (preferred) or bootstrap.secret (the environment only), not both.
// A secret file must be a regular file owned by this user (or root) that neither group nor
// others may read or write (chmod 600), like ssh's keys; its content, less trailing newlines,
// is the secret, kMinSecretBytes..kMaxSecretBytes long. The secret never appears in a message.
// Errors: proxyep::Error with phase "bootstrap.secret" or "bootstrap.env".
#pragma once

#include "common/crypto.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace proxyep::control {

constexpr size_t kMinSecretBytes = 16;
constexpr size_t kMaxSecretBytes = 4096;

struct JobCredentials {
  std::string job_id;                         // "" = none
  std::shared_ptr<const SecretBytes> secret;  // null = none

  // From the parameter registry and the environment (see above).
  static JobCredentials from_environment();
};

// Checks the file's owner and mode, then reads it. `what` names the setting in messages.
SecretBytes read_secret_file(const std::string& path, std::string_view what);
// Length checks for a secret however it was given; throws naming `what`.
void check_secret(const SecretBytes& secret, std::string_view what);
// Throws proxyep::Error("bootstrap.env") naming `what` unless `job_id` is acceptable.
void check_job_id(std::string_view job_id, std::string_view what);

// What binds a rank's place on a node's proxyepd to its job (daemon/attached_client.hpp): the
// hex of HMAC-SHA256 under the job's secret of "proxyepd job" and the job id. Only holders of
// the secret can compute it, and it says nothing of the secret; the daemon compares tags and
// lets a rank's endpoint be named only by clients with its tag. "" without a secret (then the
// daemon can tell jobs apart only by their address lists: docs/SECURITY.md).
std::string daemon_job_tag(const JobCredentials& credentials);

}  // namespace proxyep::control
