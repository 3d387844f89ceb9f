#include "common/error.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <unistd.h>

using namespace proxyep;
using config::Registry;
using config::Source;

namespace {
struct ResetRegistry {
  ~ResetRegistry() { Registry::global().reset_all(); }
};

// The message of the Error `action` throws ("" when it throws none).
template <typename Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The tests' own parameters are constructed at first use, not during static initialisation: the
// registry reads every registered parameter when one registers, and reading another file's
// globals while initialising is what ASan's init-order check (rightly) refuses.
// A parameter of every checked kind the catalogue does not use yet.
config::Param<double>& test_ratio() {
  static config::Param<double> param{"test.ratio", 0.5, config::in_real_range(0.0, 1.0),
                                     "a ratio, for the registry's own tests"};
  return param;
}
}  // namespace

TEST_CASE("parameters are declared once, with derived environment names") {
  auto& param = Registry::global().at("fabric.provider");
  CHECK(param.env_name() == "PROXYEP_FABRIC_PROVIDER");
  CHECK(param.type_name() == "string");
  CHECK(param.default_string() == "auto");
  CHECK_FALSE(param.description().empty());
  CHECK_THROWS_AS(config::Param<int64_t>("fabric.rails", 2, config::at_least(1), "duplicate"),
                  Error);
}

TEST_CASE("typed parsing with clear errors") {
  ResetRegistry reset;
  auto& registry = Registry::global();
  registry.set("fabric.rails", "3", Source::command_line);
  CHECK(params::fabric_rails.get() == 3);
  registry.set("fabric.cq_size", "4K", Source::command_line);
  CHECK(params::fabric_cq_size.get() == 4096);
  registry.set("fabric.reorder", "on", Source::command_line);
  CHECK(params::fabric_reorder.get());
  try {
    registry.set("bootstrap.timeout_ms", "soon", Source::environment);
    FAIL("no error");
  } catch (const Error& e) {
    std::string what = e.what();
    CHECK(what.find("bootstrap.timeout_ms") != std::string::npos);
    CHECK(what.find("PROXYEP_BOOTSTRAP_TIMEOUT_MS") != std::string::npos);
    CHECK(what.find("soon") != std::string::npos);
  }
  CHECK(params::bootstrap_timeout_ms.get() == 30000);  // a bad value leaves the old one
  CHECK_THROWS_AS(registry.set("fabric.reorder", "maybe", Source::code), Error);
  CHECK_THROWS_AS(registry.set("no.such.param", "1", Source::code), Error);
}

// Found with fuzz_config (tests/fuzz): "8589934592G" overflowed int64 (undefined behaviour, a
// negative size in practice) instead of being refused. A parameter of this test's own, which
// accepts every int64, so the parser's limits are what is checked.
config::Param<int64_t>& test_wide() {
  static config::Param<int64_t> param{"test.wide", 0, config::in_range(INT64_MIN, INT64_MAX),
                                      "any 64-bit integer, for this test"};
  return param;
}

TEST_CASE("a size suffix that overflows 64 bits is refused; the limits are accepted") {
  (void)test_wide();  // registered before it is set by name
  ResetRegistry reset;
  auto& registry = Registry::global();
  registry.set("test.wide", "8589934591G", Source::code);  // 2^63 - 2^30
  CHECK(test_wide().get() == INT64_MAX - (int64_t{1} << 30) + 1);
  registry.set("test.wide", "-8589934592G", Source::code);  // -2^63
  CHECK(test_wide().get() == INT64_MIN);
  for (const std::string text :
       {"8589934592G", "-8589934593G", "9007199254740992K", "9223372036854775807M"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(registry.set("test.wide", text, Source::code),
                         doctest::Contains(text.c_str()), Error);
  }
  CHECK(test_wide().get() == INT64_MIN);  // a refused value leaves the old one
  test_wide().reset();
}

TEST_CASE("precedence: default < config file < environment < command line < code") {
  ResetRegistry reset;
  auto& registry = Registry::global();
  auto& param = registry.at("fabric.provider");
  registry.set("fabric.provider", "tcp", Source::environment);
  registry.set("fabric.provider", "shm", Source::config_file);  // lower: ignored
  CHECK(params::fabric_provider.get() == "tcp");
  CHECK(param.source() == Source::environment);
  registry.set("fabric.provider", "efa", Source::command_line);
  CHECK(params::fabric_provider.get() == "efa");
  param.reset();
  CHECK(params::fabric_provider.get() == "auto");
  CHECK(param.source() == Source::default_value);
}

TEST_CASE("environment variables feed the registry") {
  ResetRegistry reset;
  ::setenv("PROXYEP_FABRIC_RAILS", "4", 1);
  Registry::global().load_environment();
  ::unsetenv("PROXYEP_FABRIC_RAILS");
  CHECK(params::fabric_rails.get() == 4);
  CHECK(Registry::global().at("fabric.rails").source() == Source::environment);
}

TEST_CASE("PROXYEP_CONFIG's file fills what nothing else set, and variables win over it") {
  ResetRegistry reset;
  char path[] = "/tmp/proxyep-test-config-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << R"({"fabric.rails": 3, "fabric.cq_batch": 16, "ep.chunk_bytes": 65536})";
  params::ep_chunk_bytes.set(8192, Source::command_line);  // --set: kept
  ::setenv("PROXYEP_CONFIG", path, 1);
  ::setenv("PROXYEP_FABRIC_CQ_BATCH", "32", 1);  // a variable: wins over the file
  Registry::global().load_environment();
  ::unsetenv("PROXYEP_CONFIG");
  ::unsetenv("PROXYEP_FABRIC_CQ_BATCH");
  CHECK(params::fabric_rails.get() == 3);
  CHECK(Registry::global().at("fabric.rails").source() == Source::config_file);
  CHECK(params::fabric_cq_batch.get() == 32);
  CHECK(Registry::global().at("fabric.cq_batch").source() == Source::environment);
  CHECK(params::ep_chunk_bytes.get() == 8192);
  CHECK(Registry::global().at("ep.chunk_bytes").source() == Source::command_line);
  std::remove(path);
  // A file that is not there is an error naming it.
  ResetRegistry again;
  ::setenv("PROXYEP_CONFIG", path, 1);
  try {
    Registry::global().load_environment();
    FAIL("a missing PROXYEP_CONFIG file was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(path) != std::string::npos);
  }
  ::unsetenv("PROXYEP_CONFIG");
}

TEST_CASE("config files are JSON objects of name: value") {
  ResetRegistry reset;
  const char* path = "test_registry_config.json";
  {
    std::ofstream out(path);
    out << R"({"fabric.reorder": true, "fabric.reorder_seed": 42, "log.level": "warn"})";
  }
  Registry::global().load_file(path);
  CHECK(params::fabric_reorder.get());
  CHECK(params::fabric_reorder_seed.get() == 42);
  CHECK(Registry::global().at("log.level").source() == Source::config_file);
  {
    std::ofstream out(path);
    out << "[1, 2";
  }
  CHECK_THROWS_AS(Registry::global().load_file(path), Error);
  std::remove(path);
  CHECK_THROWS_AS(Registry::global().load_file("/nonexistent/proxyep.json"), Error);
}

TEST_CASE("config text loads as a file does, and errors name where it came from") {
  ResetRegistry reset;
  auto& registry = Registry::global();
  registry.load_text(R"({"fabric.rails": 2, "fabric.provider": "tcp"})", "inline.json");
  CHECK(params::fabric_rails.get() == 2);
  CHECK(params::fabric_provider.get() == "tcp");
  CHECK(registry.at("fabric.rails").source() == Source::config_file);
  for (const std::string text : {"[1, 2", "[1, 2]"}) {
    CAPTURE(text);
    try {
      registry.load_text(text, "inline.json");
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("inline.json") != std::string::npos);
    }
  }
}

TEST_CASE("to_json lists every parameter with value, source and env name") {
  auto doc = Registry::global().to_json();
  REQUIRE(doc.is_array());
  CHECK(doc.size() == Registry::global().all().size());
  bool found = false;
  for (auto& entry : doc)
    if (entry["name"] == "bootstrap.timeout_ms") {
      found = true;
      CHECK(entry["env"] == "PROXYEP_BOOTSTRAP_TIMEOUT_MS");
      CHECK(entry["source"] == "default");
    }
  CHECK(found);
}

// A secret of this test's own (bootstrap.secret is the real one).
config::Param<std::string>& test_secret() {
  static config::Param<std::string> param{"test.secret", "", config::any_text(),
                                          "a secret for this test", config::Sensitivity::secret};
  return param;
}

TEST_CASE("a secret parameter is never shown and comes from the environment only") {
  (void)test_secret();  // registered before it is set by name
  ResetRegistry reset;
  auto& registry = Registry::global();
  CHECK(test_secret().secret());
  CHECK_FALSE(registry.at("fabric.provider").secret());
  CHECK(test_secret().value_string().empty());  // unset: nothing to hide
  const std::string value = "a-secret-value-0123456789";
  for (Source source : {Source::command_line, Source::config_file}) {
    try {
      registry.set("test.secret", value, source);
      FAIL("a secret was taken from " << config::to_string(source));
    } catch (const Error& e) {
      std::string what = e.what();
      CHECK(what.find("is a secret") != std::string::npos);
      CHECK(what.find(value) == std::string::npos);
    }
  }
  CHECK(test_secret().get().empty());
  ::setenv("PROXYEP_TEST_SECRET", value.c_str(), 1);
  registry.load_environment();
  ::unsetenv("PROXYEP_TEST_SECRET");
  CHECK(test_secret().get() == value);                  // the code gets it
  CHECK(test_secret().value_string() == "<redacted>");  // every printer does not
  CHECK(registry.to_json().dump().find(value) == std::string::npos);
}

TEST_CASE("every parameter declares what it accepts, and its default is accepted") {
  for (auto* param : Registry::global().all()) {
    CAPTURE(param->name());
    CHECK_FALSE(param->valid_text().empty());
    CHECK(param->check_text(param->default_string()) == "");
  }
}

TEST_CASE("ranges are checked for every source, naming parameter, source, value and range") {
  ResetRegistry reset;
  auto& registry = Registry::global();

  // The environment: every invalid value is named, the valid ones are still stored.
  ::setenv("PROXYEP_EP_CHUNK_BYTES", "0", 1);
  ::setenv("PROXYEP_FABRIC_CQ_SIZE", "-1", 1);
  ::setenv("PROXYEP_FABRIC_RAILS", "2", 1);
  std::string env_error = error_of([&] { registry.load_environment(); });
  ::unsetenv("PROXYEP_EP_CHUNK_BYTES");
  ::unsetenv("PROXYEP_FABRIC_CQ_SIZE");
  ::unsetenv("PROXYEP_FABRIC_RAILS");
  CHECK(contains(env_error, "2 invalid parameter values"));
  CHECK(contains(env_error,
                 "invalid value '0' for ep.chunk_bytes (env PROXYEP_EP_CHUNK_BYTES, "
                 "from environment): must be between 4K and 1G (4096 and 1073741824)"));
  CHECK(contains(env_error,
                 "invalid value '-1' for fabric.cq_size (env PROXYEP_FABRIC_CQ_SIZE, "
                 "from environment): must be between 1 and 16M (1 and 16777216)"));
  CHECK(params::ep_chunk_bytes.get() == 1 << 20);  // refused: the default stays
  CHECK(params::fabric_rails.get() == 2);          // valid: stored

  // A config file.
  const char* path = "test_registry_ranges.json";
  {
    std::ofstream out(path);
    out << R"({"ep.eager_bytes": -5, "log.level": "loud"})";
  }
  std::string file_error = error_of([&] { registry.load_file(path); });
  std::remove(path);
  CHECK(contains(file_error,
                 "invalid value '-5' for ep.eager_bytes (env PROXYEP_EP_EAGER_BYTES, "
                 "from config file): must be between 0 and 64M (0 and 67108864)"));
  CHECK(contains(file_error,
                 "invalid value 'loud' for log.level (env PROXYEP_LOG_LEVEL, from "
                 "config file): must be one of trace, debug, info, warn, error, "
                 "critical, off"));
  CHECK(params::log_level.get() == "info");

  // The command line (--set, a command's flags).
  CHECK(error_of([&] { registry.set("ep.timeout_ms", "0", Source::command_line); }) ==
        "config: invalid value '0' for ep.timeout_ms (env PROXYEP_EP_TIMEOUT_MS, from command "
        "line): must be between 1 and 86400000");
  CHECK(params::ep_timeout_ms.get() == 100000);

  // Code, typed: no way around the range.
  CHECK(error_of([] { params::ep_host_threads.set(100000); }) ==
        "config: invalid value '100000' for ep.host_threads (env PROXYEP_EP_HOST_THREADS, from "
        "code): must be between 0 and 64");
  CHECK(error_of([] { params::fabric_rails.set(0); }) != "");
  CHECK(params::fabric_rails.get() == 2);
  params::ep_host_threads.set(64);
  CHECK(params::ep_host_threads.get() == 64);

  // A bad value is refused even where a higher source already set the parameter.
  registry.set("proxy.burst", "8", Source::code);
  CHECK(error_of([&] { registry.set("proxy.burst", "0", Source::config_file); }) != "");
  registry.set("proxy.burst", "16", Source::config_file);  // valid, lower: ignored
  CHECK(params::proxy_burst.get() == 8);
}

TEST_CASE("names, syntaxes and real ranges") {
  ResetRegistry reset;
  auto& registry = Registry::global();
  auto& provider = registry.at("fabric.provider");
  for (const char* good : {"auto", "tcp", "tcp;ofi_rxm", "efa-direct", "shm"})
    CHECK(provider.check_text(good) == "");
  for (const char* bad : {"", "t cp", ";tcp", "tcp;", "shm\n"}) {
    CAPTURE(bad);
    CHECK(provider.check_text(bad) != "");
  }
  auto& cpus = registry.at("proxy.cpus");
  CHECK(cpus.check_text("") == "");
  CHECK(cpus.check_text("0-3,8") == "");
  CHECK(contains(cpus.check_text("3-1"), "backwards"));
  CHECK(contains(cpus.check_text("0-99999999"), "CPUs are numbered below"));
  CHECK(registry.at("bootstrap.interface").check_text("10.0.0.1") == "");
  CHECK(registry.at("bootstrap.interface").check_text("two words") != "");
  CHECK(registry.at("log.level").check_text("warn") == "");

  CHECK(test_ratio().valid_text() == "0..1");
  test_ratio().set(0.25);
  CHECK(test_ratio().get() == 0.25);
  CHECK(error_of([] { test_ratio().set(1.5); }) ==
        "config: invalid value '1.5' for test.ratio (env PROXYEP_TEST_RATIO, from code): must be "
        "between 0 and 1");
  CHECK(test_ratio().check_text("nan") == "must be between 0 and 1");
  CHECK(test_ratio().check_text("half") == "expected a number");
  test_ratio().reset();
}

TEST_CASE("integers that do not fit are refused, not wrapped") {
  auto& cq = Registry::global().at("fabric.cq_size");
  CHECK(cq.check_text("9223372036854775807G") == "does not fit a 64-bit integer");
  CHECK(cq.check_text("99999999999999999999") == "does not fit a 64-bit integer");
  CHECK(cq.check_text("16M") == "");
  CHECK(cq.check_text("16M1") != "");
}
