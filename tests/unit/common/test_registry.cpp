#include "common/error.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>

using namespace proxyep;
using config::Registry;
using config::Source;

namespace {
struct ResetRegistry {
  ~ResetRegistry() { Registry::global().reset_all(); }
};
}  // namespace

TEST_CASE("parameters are declared once, with derived environment names") {
  auto& param = Registry::global().at("fabric.provider");
  CHECK(param.env_name() == "PROXYEP_FABRIC_PROVIDER");
  CHECK(param.type_name() == "string");
  CHECK(param.default_string() == "auto");
  CHECK_FALSE(param.description().empty());
  CHECK_THROWS_AS(config::Param<int64_t>("fabric.rails", 2, "duplicate"), Error);
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
// negative size in practice) instead of being refused.
TEST_CASE("a size suffix that overflows 64 bits is refused; the limits are accepted") {
  ResetRegistry reset;
  auto& registry = Registry::global();
  registry.set("ep.chunk_bytes", "8589934591G", Source::code);  // 2^63 - 2^30
  CHECK(params::ep_chunk_bytes.get() == INT64_MAX - (int64_t{1} << 30) + 1);
  registry.set("ep.chunk_bytes", "-8589934592G", Source::code);  // -2^63
  CHECK(params::ep_chunk_bytes.get() == INT64_MIN);
  for (const std::string text :
       {"8589934592G", "-8589934593G", "9007199254740992K", "9223372036854775807M"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(registry.set("ep.chunk_bytes", text, Source::code),
                         doctest::Contains(text.c_str()), Error);
  }
  CHECK(params::ep_chunk_bytes.get() == INT64_MIN);  // a refused value leaves the old one
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
