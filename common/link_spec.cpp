#include "common/link_spec.hpp"

#include "common/error.hpp"

#include <charconv>
#include <cmath>

namespace proxyep {
namespace {

constexpr std::string_view kPhase = "launch.link";
constexpr std::string_view kPresetPrefix = "preset:";

// EFA: 3200 Gbit/s per node on all three (AWS's instance pages: p5 32 x 100G EFAv2, p5en
// 16 x 200G EFAv3, p6-b200 8 x 400G EFAv4), i.e. 400 Gbit/s = 50 GB/s per GPU. NVLink per
// direction: half of NVIDIA's bidirectional figure (H100 and H200 SXM 900 GB/s, B200 1.8 TB/s).
const std::vector<LinkPreset> kPresets = {
    {"p5", 8, 450, 50, "8 x H100 (NVLink 900 GB/s both ways), 32 x 100G EFAv2 per node"},
    {"p5en", 8, 450, 50, "8 x H200 (NVLink 900 GB/s both ways), 16 x 200G EFAv3 per node"},
    {"p6-b200", 8, 900, 50, "8 x B200 (NVLink 1.8 TB/s both ways), 8 x 400G EFAv4 per node"},
};

double parse_number(std::string_view text, std::string_view what, std::string_view whole) {
  double value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  require(error == std::errc() && end == text.data() + text.size() && std::isfinite(value), kPhase,
          "'{}': {} '{}' is not a number (expected GBPS[,LATENCY_US] or preset:NAME[,LATENCY_US])",
          whole, what, text);
  return value;
}

std::string preset_names() {
  std::string names;
  for (const auto& preset : kPresets)
    names += (names.empty() ? "" : ", ") + std::string(preset.name);
  return names;
}

}  // namespace

const std::vector<LinkPreset>& link_presets() {
  return kPresets;
}

const LinkPreset* find_link_preset(std::string_view name) {
  for (const auto& preset : kPresets)
    if (preset.name == name) return &preset;
  return nullptr;
}

LinkSpec parse_link_spec(std::string_view text) {
  LinkSpec spec;
  auto comma = text.find(',');
  std::string_view rate = text.substr(0, comma);
  if (comma != std::string_view::npos) {
    spec.latency_us = parse_number(text.substr(comma + 1), "latency", text);
    require(spec.latency_us >= 0 && spec.latency_us <= kMaxLinkLatencyUs, kPhase,
            "'{}': the latency must be between 0 and {} us", text, kMaxLinkLatencyUs);
  }
  if (rate.starts_with(kPresetPrefix)) {
    auto name = rate.substr(kPresetPrefix.size());
    spec.preset = find_link_preset(name);
    require(spec.preset != nullptr, kPhase, "'{}': no preset '{}' (presets: {})", text, name,
            preset_names());
    return spec;
  }
  spec.gbps = parse_number(rate, "rate", text);
  require(spec.gbps >= kMinLinkGbps && spec.gbps <= kMaxLinkGbps, kPhase,
          "'{}': the rate must be between {} and {} Gbit/s", text, kMinLinkGbps, kMaxLinkGbps);
  return spec;
}

std::string link_spec_problem(std::string_view text) {
  if (text.empty()) return "";
  try {
    parse_link_spec(text);
    return "";
  } catch (const Error& e) {
    return e.message();
  }
}

}  // namespace proxyep
