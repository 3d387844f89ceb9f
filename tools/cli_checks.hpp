// Range checks for command-line options, with messages people can read. CLI11's own
// (CLI::PositiveNumber, CLI::Range) print their bounds as doubles ("--nranks: Value 0 not in
// range 0.000000 to 1797693134862315708145274237317043567980705675258449965...").
// CLI11 puts the option's name in front of the message: "--ranks: must be at least 1, got 0".
#pragma once

#include "common/registry.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace proxyep::tools::cli_checks {

namespace detail {

inline std::optional<int64_t> parse_integer(const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

inline std::optional<double> parse_real(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || std::isnan(value)) return std::nullopt;
  return value;
}

}  // namespace detail

// An integer in lo..hi.
inline CLI::Validator in_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        auto value = detail::parse_integer(text);
        if (!value) return fmt::format("expected an integer, got '{}'", text);
        if (*value < lo || *value > hi)
          return fmt::format("must be between {} and {}, got {}", lo, hi, text);
        return "";
      },
      fmt::format("INT in {}..{}", lo, hi));
}

// An integer of at least lo.
inline CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        auto value = detail::parse_integer(text);
        if (!value) return fmt::format("expected an integer, got '{}'", text);
        if (*value < lo) return fmt::format("must be at least {}, got {}", lo, text);
        return "";
      },
      fmt::format("INT >= {}", lo));
}

// A number (not NaN) of at least lo.
inline CLI::Validator real_at_least(double lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        auto value = detail::parse_real(text);
        if (!value) return fmt::format("expected a number, got '{}'", text);
        if (*value < lo) return fmt::format("must be at least {}, got {}", lo, text);
        return "";
      },
      fmt::format("NUMBER >= {}", lo));
}

// What the registry accepts for `param`: an option that feeds a parameter is checked against the
// parameter's declared range when it is read ("--rails: must be between 1 and 64
// (fabric.rails), got 0").
inline CLI::Validator accepted_by(const config::ParamBase& param) {
  return CLI::Validator(
      [&param](std::string& text) -> std::string {
        std::string reason = param.check_text(text);
        if (reason.empty()) return "";
        return fmt::format("{} ({}), got {}", reason, param.name(), text);
      },
      fmt::format("{} ({})", param.valid_text(), param.name()));
}

}  // namespace proxyep::tools::cli_checks
