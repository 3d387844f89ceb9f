// Fuzzes the config file parser (config::Registry::load_text, what `proxyep --config FILE`
// reads): any text must load or be refused with proxyep::Error. After a load, every parameter's
// printed value (what `proxyep config` shows) must read back as itself.
#include "common/error.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"
#include "tests/fuzz/fuzz_check.hpp"

#include <cstdint>
#include <string>
#include <string_view>

using proxyep::config::Registry;
using proxyep::config::Source;
using proxyep::fuzz::check;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Refers to the catalogue (common/params.cpp), so that its parameters are linked in and
  // registered: without them every name would be unknown and no value parser reached.
  check(Registry::global().find(proxyep::params::fabric_rails.name()) != nullptr,
        "the parameter catalogue is not registered");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Registry& registry = Registry::global();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    registry.load_text(text, "fuzz input");
  } catch (const proxyep::Error&) {
    // Refused, naming the file and the parameter: fine (values set before the bad one stay).
  }
  for (auto* param : registry.all()) {
    // A secret is never printed ("<redacted>") nor taken from a file, by design.
    if (param->secret()) continue;
    const std::string shown = param->value_string();
    try {
      param->set_text(shown, Source::config_file);
    } catch (const proxyep::Error&) {
      check(false, "a value `proxyep config` prints does not read back");
    }
    check(param->value_string() == shown, "a printed value reads back as another value");
  }
  registry.reset_all();
  return 0;
}
