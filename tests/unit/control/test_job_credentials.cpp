// The job id and secret as the bootstrap reads them (control/job_credentials.hpp): where they
// come from, what a secret file must look like, and that the secret never shows in a message.
#include "common/error.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"
#include "control/job_credentials.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace proxyep;
using namespace proxyep::control;

namespace {

struct ResetParams {
  ~ResetParams() {
    params::bootstrap_job_id.reset();
    params::bootstrap_secret_file.reset();
    params::bootstrap_secret.reset();
    unsetenv("TORCHELASTIC_RUN_ID");
  }
};

// A file in a fresh private directory, removed afterwards.
class TempFile {
 public:
  TempFile(const std::string& content, mode_t mode) {
    char pattern[] = "/tmp/proxyep-test-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    directory_ = pattern;
    path_ = directory_ + "/secret";
    std::ofstream(path_) << content;
    REQUIRE(chmod(path_.c_str(), mode) == 0);
  }
  ~TempFile() { std::filesystem::remove_all(directory_); }
  const std::string& path() const { return path_; }

 private:
  std::string directory_;
  std::string path_;
};

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::string kSecret = "0123456789abcdef0123456789abcdef";

}  // namespace

TEST_CASE("job id: bootstrap.job_id, else TORCHELASTIC_RUN_ID, else none") {
  ResetParams reset;
  CHECK(JobCredentials::from_environment().job_id.empty());
  setenv("TORCHELASTIC_RUN_ID", "torchrun-42", 1);
  CHECK(JobCredentials::from_environment().job_id == "torchrun-42");
  params::bootstrap_job_id.set("mine");
  CHECK(JobCredentials::from_environment().job_id == "mine");
  params::bootstrap_job_id.set("bad\nid");
  CHECK(contains(error_of([] { JobCredentials::from_environment(); }), "printable ASCII"));
  params::bootstrap_job_id.set(std::string(300, 'x'));
  CHECK(contains(error_of([] { JobCredentials::from_environment(); }), "at most 256"));
}

TEST_CASE("secret file: read when only its owner may read it; trailing newlines dropped") {
  ResetParams reset;
  TempFile file(kSecret + "\n", 0600);
  params::bootstrap_secret_file.set(file.path());
  auto credentials = JobCredentials::from_environment();
  REQUIRE(credentials.secret);
  CHECK(std::string(credentials.secret->bytes().begin(), credentials.secret->bytes().end()) ==
        kSecret);
  TempFile read_only(kSecret, 0400);
  CHECK(read_secret_file(read_only.path(), "test").size() == kSecret.size());
}

TEST_CASE("secret file: refused when others may read it, too short, or not a file") {
  ResetParams reset;
  TempFile open_to_all(kSecret, 0644);
  auto error = error_of([&] { read_secret_file(open_to_all.path(), "bootstrap.secret_file"); });
  CHECK(contains(error, "bootstrap.secret: bootstrap.secret_file"));
  CHECK(contains(error, "mode 0644"));
  CHECK(contains(error, "chmod 600"));
  TempFile group(kSecret, 0640);
  CHECK(contains(error_of([&] { read_secret_file(group.path(), "x"); }), "mode 0640"));

  TempFile short_secret("short-secret", 0600);
  error = error_of([&] { read_secret_file(short_secret.path(), "x"); });
  CHECK(contains(error, "12 bytes"));
  CHECK_FALSE(contains(error, "short-secret"));  // never the secret itself

  TempFile huge(std::string(5000, 'k'), 0600);
  CHECK(contains(error_of([&] { read_secret_file(huge.path(), "x"); }), "5000 bytes"));

  CHECK(
      contains(error_of([] { read_secret_file("/nonexistent/secret", "x"); }), "cannot be opened"));
  CHECK(contains(error_of([] { read_secret_file("/tmp", "x"); }), "not a regular file"));
}

TEST_CASE("secret: from the environment only, never echoed, and not both ways") {
  ResetParams reset;
  auto& registry = config::Registry::global();
  // A command line and a config file are no place for a secret.
  auto error =
      error_of([&] { registry.set("bootstrap.secret", kSecret, config::Source::command_line); });
  CHECK(contains(error, "is a secret"));
  CHECK_FALSE(contains(error, kSecret));
  CHECK_THROWS_AS(registry.set("bootstrap.secret", kSecret, config::Source::config_file), Error);
  CHECK(params::bootstrap_secret.get().empty());

  registry.set("bootstrap.secret", kSecret, config::Source::environment);
  CHECK(params::bootstrap_secret.value_string() == "<redacted>");
  CHECK_FALSE(contains(registry.to_json().dump(), kSecret));
  auto credentials = JobCredentials::from_environment();
  REQUIRE(credentials.secret);
  CHECK(credentials.secret->size() == kSecret.size());

  TempFile file(kSecret, 0600);
  params::bootstrap_secret_file.set(file.path());
  error = error_of([] { JobCredentials::from_environment(); });
  CHECK(contains(error, "give the job's secret one way"));
  CHECK_FALSE(contains(error, kSecret));

  params::bootstrap_secret_file.reset();
  registry.set("bootstrap.secret", "tiny-secret", config::Source::environment);
  error = error_of([] { JobCredentials::from_environment(); });
  CHECK(contains(error, "11 bytes"));
  CHECK_FALSE(contains(error, "tiny-secret"));
}

TEST_CASE("daemon job tag: only the secret's holders can make it, one per job") {
  auto with = [](std::string job_id, std::string secret) {
    control::JobCredentials credentials;
    credentials.job_id = std::move(job_id);
    if (!secret.empty())
      credentials.secret = std::make_shared<const SecretBytes>(
          std::span(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()));
    return control::daemon_job_tag(credentials);
  };
  const std::string tag = with("job-1", "0123456789abcdef0123456789abcdef");
  CHECK(tag.size() == 64);
  CHECK(tag.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(tag == with("job-1", "0123456789abcdef0123456789abcdef"));  // every rank the same
  CHECK(tag != with("job-2", "0123456789abcdef0123456789abcdef"));  // another job id
  CHECK(tag != with("job-1", "fedcba9876543210fedcba9876543210"));  // another secret
  CHECK(with("job-1", "").empty());  // no secret: no tag (the daemon compares address lists)
}
