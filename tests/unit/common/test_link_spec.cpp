// The testbed's link syntax (common/link_spec.hpp): rates, latencies, presets, and the errors
// that name what is wrong before anything is built.
#include "common/error.hpp"
#include "common/link_spec.hpp"
#include "common/params.hpp"

#include <doctest/doctest.h>

#include <string>

using proxyep::Error;
using proxyep::find_link_preset;
using proxyep::link_spec_problem;
using proxyep::parse_link_spec;

TEST_CASE("link spec: a rate, with and without a latency") {
  auto plain = parse_link_spec("4");
  CHECK(plain.gbps == 4);
  CHECK(plain.latency_us == 0);
  CHECK(plain.preset == nullptr);
  auto with_latency = parse_link_spec("0.5,12.5");
  CHECK(with_latency.gbps == 0.5);
  CHECK(with_latency.latency_us == 12.5);
}

TEST_CASE("link spec: presets keep each machine's NVLink:EFA ratio") {
  auto p5en = parse_link_spec("preset:p5en");
  REQUIRE(p5en.preset != nullptr);
  CHECK(p5en.gbps == 0);  // scaled to the box at launch
  CHECK(p5en.preset->gpus_per_node == 8);
  CHECK(p5en.preset->ratio() == doctest::Approx(9));
  CHECK(find_link_preset("p5")->ratio() == doctest::Approx(9));
  CHECK(find_link_preset("p6-b200")->ratio() == doctest::Approx(18));
  CHECK(parse_link_spec("preset:p6-b200,20").latency_us == 20);
  for (const auto& preset : proxyep::link_presets())
    CHECK(!preset.source.empty());
}

TEST_CASE("link spec: bad input names the problem") {
  auto message = [](const char* text) {
    try {
      parse_link_spec(text);
    } catch (const Error& e) {
      CHECK(e.phase() == "launch.link");
      return e.message();
    }
    FAIL("accepted: " << text);
    return std::string();
  };
  CHECK(message("fast").find("rate 'fast' is not a number") != std::string::npos);
  CHECK(message("0").find("between") != std::string::npos);
  CHECK(message("-3").find("between") != std::string::npos);
  CHECK(message("4,-1").find("latency must be between") != std::string::npos);
  CHECK(message("4,x").find("latency 'x' is not a number") != std::string::npos);
  CHECK(message("preset:p4d").find("no preset 'p4d' (presets: p5, p5en, p6-b200)") !=
        std::string::npos);
  CHECK(message("4,").find("is not a number") != std::string::npos);
  CHECK(link_spec_problem("") == "");
  CHECK(link_spec_problem("16") == "");
}

TEST_CASE("link spec: the launch.link parameter refuses what does not parse") {
  CHECK(proxyep::params::launch_link.check_text("preset:p5en") == "");
  CHECK(proxyep::params::launch_link.check_text("nonsense") != "");
}
