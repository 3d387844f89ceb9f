#include "common/error.hpp"
#include "control/launch_env.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

using proxyep::Error;
using proxyep::control::LaunchEnv;

namespace {

constexpr const char* kVariables[] = {"MASTER_ADDR", "MASTER_PORT", "RANK",
                                      "WORLD_SIZE",  "LOCAL_RANK",  "LOCAL_WORLD_SIZE"};

// Sets exactly the given torchrun variables (unsetting the others) and restores the previous
// environment when it goes out of scope, so the tests neither see nor leak launcher variables.
class ScopedLaunchEnv {
 public:
  explicit ScopedLaunchEnv(const std::map<std::string, std::string>& values) {
    for (const char* name : kVariables) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(name);
    }
    for (const auto& [name, value] : values)
      setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedLaunchEnv() {
    for (const auto& [name, value] : saved_) {
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

std::map<std::string, std::string> good_env() {
  return {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "5"},
          {"WORLD_SIZE", "8"},          {"LOCAL_RANK", "1"},      {"LOCAL_WORLD_SIZE", "4"}};
}

// The error from_environment() throws for `values`; fails the test when it does not throw.
Error error_for(const std::map<std::string, std::string>& values) {
  ScopedLaunchEnv scoped(values);
  try {
    LaunchEnv::from_environment();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no error for a bad environment");
  return Error("", "");
}

void check_rejected(std::map<std::string, std::string> values, const std::string& variable,
                    const std::string& value) {
  CAPTURE(variable);
  CAPTURE(value);
  auto error = error_for(values);
  std::string what = error.what();
  CAPTURE(what);
  CHECK(error.phase() == "bootstrap.env");
  CHECK(what.find(variable) != std::string::npos);
  CHECK(what.find(value) != std::string::npos);
}

void check_rejected_value(const std::string& variable, const std::string& value) {
  auto values = good_env();
  values[variable] = value;
  check_rejected(values, variable, value);
}

}  // namespace

TEST_CASE("launch env: torchrun variables are read") {
  ScopedLaunchEnv scoped(good_env());
  auto env = LaunchEnv::from_environment();
  CHECK(env.master_addr == "127.0.0.1");
  CHECK(env.master_port == 29500);
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 4);
  CHECK(env.node() == 1);
  CHECK(env.num_nodes() == 2);
}

TEST_CASE("launch env: missing LOCAL_* means one node") {
  auto values = good_env();
  values.erase("LOCAL_RANK");
  values.erase("LOCAL_WORLD_SIZE");
  ScopedLaunchEnv scoped(values);
  auto env = LaunchEnv::from_environment();
  CHECK(env.local_rank == 5);
  CHECK(env.local_world_size == 8);
  CHECK(env.node() == 0);
  CHECK(env.num_nodes() == 1);
}

TEST_CASE("launch env: no launcher variables at all is a world of one") {
  ScopedLaunchEnv scoped({});
  auto env = LaunchEnv::from_environment();
  CHECK(env.rank == 0);
  CHECK(env.world_size == 1);
  CHECK(env.local_world_size == 1);
  CHECK(env.master_addr.empty());
}

TEST_CASE("launch env: a world of one needs no master") {
  ScopedLaunchEnv scoped({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  auto env = LaunchEnv::from_environment();
  CHECK(env.world_size == 1);
  CHECK(env.master_port == 0);
}

TEST_CASE("launch env: malformed numbers name the variable and the value") {
  for (const char* variable :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"}) {
    for (const char* value :
         {"abc", "-1", "3x", " 3", "3 ", "", "+2", "0x10", "1.5", "99999999999999999999"}) {
      check_rejected_value(variable, value);
    }
  }
}

TEST_CASE("launch env: inconsistent values are rejected") {
  check_rejected_value("RANK", "8");  // RANK >= WORLD_SIZE
  check_rejected_value("WORLD_SIZE", "0");
  check_rejected_value("MASTER_PORT", "0");
  check_rejected_value("MASTER_PORT", "65536");
  check_rejected_value("LOCAL_RANK", "2");        // 5 % 4 == 1
  check_rejected_value("LOCAL_RANK", "4");        // outside the node
  check_rejected_value("LOCAL_WORLD_SIZE", "3");  // 8 ranks are not whole nodes of 3
  check_rejected_value("LOCAL_WORLD_SIZE", "0");
}

TEST_CASE("launch env: half-given pairs and a missing master are errors") {
  auto values = good_env();
  values.erase("LOCAL_WORLD_SIZE");
  check_rejected(values, "LOCAL_WORLD_SIZE", "LOCAL_RANK");

  values = good_env();
  values.erase("LOCAL_RANK");
  check_rejected(values, "LOCAL_RANK", "LOCAL_WORLD_SIZE");

  values = good_env();
  values.erase("WORLD_SIZE");
  check_rejected(values, "WORLD_SIZE", "RANK");

  values = good_env();
  values.erase("MASTER_ADDR");
  check_rejected(values, "MASTER_ADDR", "WORLD_SIZE=8");

  values = good_env();
  values.erase("MASTER_PORT");
  check_rejected(values, "MASTER_PORT", "WORLD_SIZE=8");
}

TEST_CASE("launch env: validate() checks given values the same way") {
  LaunchEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = 29500;
  env.rank = 3;
  env.world_size = 4;
  env.local_rank = 1;
  env.local_world_size = 2;
  CHECK_NOTHROW(env.validate());

  auto bad = env;
  bad.rank = 4;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("RANK=4"), Error);
  bad = env;
  bad.local_rank = 0;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("LOCAL_RANK=0"), Error);
  bad = env;
  bad.master_port = 70000;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("MASTER_PORT=70000"), Error);
  bad = env;
  bad.master_addr.clear();
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("MASTER_ADDR"), Error);
  bad = env;
  bad.local_world_size = 3;
  bad.local_rank = 0;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("LOCAL_WORLD_SIZE=3"), Error);
}
