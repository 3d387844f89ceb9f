#include "common/registry.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>

extern char** environ;  // NOLINT: POSIX, for the scan for misspelt PROXYEP_* variables

namespace proxyep::config {
namespace {

std::string env_name_for(const std::string& name) {
  std::string env = "PROXYEP_";
  for (char c : name)
    env += (c == '.' || c == '-') ? '_' : static_cast<char>(std::toupper(c));
  return env;
}

bool parse_bool(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  throw std::invalid_argument("expected a boolean (1/0, true/false, yes/no, on/off)");
}

// Integers accept a binary size suffix: 4K, 64M, 2G.
int64_t parse_int(std::string_view text) {
  int64_t multiplier = 1;
  if (!text.empty()) {
    switch (std::toupper(static_cast<unsigned char>(text.back()))) {
      case 'K':
        multiplier = int64_t{1} << 10;
        break;
      case 'M':
        multiplier = int64_t{1} << 20;
        break;
      case 'G':
        multiplier = int64_t{1} << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || end != text.data() + text.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range))
    throw std::invalid_argument("expected an integer (optionally with a K, M or G suffix)");
  int64_t scaled = 0;
  if (ec == std::errc::result_out_of_range || __builtin_mul_overflow(value, multiplier, &scaled))
    throw std::invalid_argument("does not fit a 64-bit integer");
  return scaled;
}

double parse_double(std::string_view text) {
  std::string copy(text);
  char* end = nullptr;
  double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size())
    throw std::invalid_argument("expected a number");
  return value;
}

template <typename T>
T parse_value(std::string_view text) {
  if constexpr (std::is_same_v<T, bool>)
    return parse_bool(text);
  else if constexpr (std::is_same_v<T, int64_t>)
    return parse_int(text);
  else if constexpr (std::is_same_v<T, double>)
    return parse_double(text);
  else
    return std::string(text);
}

template <typename T>
std::string format_value(const T& value) {
  if constexpr (std::is_same_v<T, bool>)
    return value ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::string>)
    return value;
  else
    return fmt::format("{}", value);
}

// 4096 -> "4K", 1073741824 -> "1G", 1000 -> "1000", 86400000 -> "86400000" (not "84375K"):
// sizes the way the parser takes them, other numbers as they are.
std::string format_int(int64_t value) {
  constexpr std::pair<int64_t, char> kSuffixes[] = {
      {int64_t{1} << 30, 'G'}, {int64_t{1} << 20, 'M'}, {int64_t{1} << 10, 'K'}};
  for (auto [unit, suffix] : kSuffixes)
    if (value != 0 && value % unit == 0 && (value / unit < 1024 || suffix == 'G'))
      return fmt::format("{}{}", value / unit, suffix);
  return fmt::format("{}", value);
}

template <typename T>
constexpr const char* type_name_of() {
  if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_same_v<T, int64_t>)
    return "int";
  else if constexpr (std::is_same_v<T, double>)
    return "float";
  else
    return "string";
}

}  // namespace

std::string_view to_string(Source source) {
  switch (source) {
    case Source::default_value:
      return "default";
    case Source::config_file:
      return "config file";
    case Source::environment:
      return "environment";
    case Source::command_line:
      return "command line";
    case Source::code:
      return "code";
  }
  return "unknown";
}

Valid<int64_t> in_range(int64_t lo, int64_t hi) {
  std::string lo_text = format_int(lo);
  std::string hi_text = format_int(hi);
  std::string reason = fmt::format("must be between {} and {}", lo_text, hi_text);
  if (lo_text != std::to_string(lo) || hi_text != std::to_string(hi))
    reason += fmt::format(" ({} and {})", lo, hi);
  return {lo_text + ".." + hi_text, [lo, hi, reason](const int64_t& value) {
            return lo <= value && value <= hi ? "" : reason;
          }};
}

Valid<int64_t> at_least(int64_t lo) {
  std::string reason = fmt::format("must be at least {}", format_int(lo));
  return {fmt::format(">= {}", format_int(lo)),
          [lo, reason](const int64_t& value) { return value >= lo ? "" : reason; }};
}

Valid<double> in_real_range(double lo, double hi) {
  std::string reason = fmt::format("must be between {} and {}", lo, hi);
  return {fmt::format("{}..{}", lo, hi), [lo, hi, reason](const double& value) {
            return value >= lo && value <= hi ? "" : reason;  // false for NaN
          }};
}

Valid<std::string> one_of(std::vector<std::string> names) {
  std::string list = fmt::format("{}", fmt::join(names, ", "));
  return {list, [names = std::move(names), list](const std::string& value) {
            return std::find(names.begin(), names.end(), value) != names.end()
                       ? std::string()
                       : "must be one of " + list;
          }};
}

Valid<std::string> any_text(std::string text) {
  return {std::move(text), [](const std::string&) { return std::string(); }};
}

Valid<std::string> matching(std::string text,
                            std::function<std::string(const std::string&)> check) {
  return {std::move(text), std::move(check)};
}

ParamBase::ParamBase(std::string name, std::string type_name, std::string description,
                     Sensitivity sensitivity)
    : name_(std::move(name)),
      env_name_(env_name_for(name_)),
      type_name_(std::move(type_name)),
      description_(std::move(description)),
      sensitivity_(sensitivity) {}

Source ParamBase::source() const {
  std::lock_guard lock(mutex_);
  return source_;
}

void ParamBase::reject(std::string_view text, Source source, std::string_view reason) const {
  // A secret's value is never echoed, not even a malformed one.
  fail("config", "invalid value '{}' for {} (env {}, from {}): {}",
       secret() ? std::string_view("<redacted>") : text, name_, env_name_, to_string(source),
       reason);
}

void ParamBase::set_text(std::string_view text, Source source) {
  // Checked before the precedence test: a bad value is an error even where a higher source
  // would have won, so a typo in a config file never hides behind an environment variable.
  if (std::string reason = check_text(text); !reason.empty()) reject(text, source, reason);
  std::lock_guard lock(mutex_);
  if (secret()) {
    require(source == Source::environment || source == Source::code, "config",
            "{} is a secret and is not taken from the {}: every user of this host can read a "
            "command line, and config files get copied; set {} in the environment or use a file "
            "only you can read (see docs/SECURITY.md)",
            name_, to_string(source), env_name_);
  }
  if (source < source_) return;  // a higher-precedence source already set it
  store_parsed(text);
  source_ = source;
}

void ParamBase::reset() {
  std::lock_guard lock(mutex_);
  restore_default();
  source_ = Source::default_value;
}

template <typename T>
Param<T>::Param(std::string name, T default_value,
                std::string description) requires std::is_same_v<T, bool>
    : ParamBase(std::move(name), type_name_of<T>(), std::move(description)),
      default_value_(default_value),
      value_(default_value),
      valid_{"true, false (also 1/0, yes/no, on/off)", [](const T&) { return std::string(); }} {
  Registry::global().add(this);
}

template <typename T>
Param<T>::Param(std::string name, T default_value, Valid<T> valid, std::string description,
                Sensitivity sensitivity) requires(!std::is_same_v<T, bool>)
    : ParamBase(std::move(name), type_name_of<T>(), std::move(description), sensitivity),
      default_value_(default_value),
      value_(std::move(default_value)),
      valid_(std::move(valid)) {
  Registry::global().add(this);
}

template <typename T>
T Param<T>::get() const {
  Registry::global().ensure_environment_loaded();
  std::lock_guard lock(mutex_);
  return value_;
}

template <typename T>
void Param<T>::set(T value, Source source) {
  if (std::string reason = problem(value); !reason.empty())
    reject(format_value(value), source, reason);
  std::lock_guard lock(mutex_);
  if (source < source_) return;
  value_ = std::move(value);
  source_ = source;
}

template <typename T>
std::string Param<T>::problem(const T& value) const {
  return valid_.check ? valid_.check(value) : std::string();
}

template <typename T>
std::string Param<T>::valid_text() const {
  return valid_.text;
}

template <typename T>
std::string Param<T>::check_text(std::string_view text) const {
  try {
    return problem(parse_value<T>(text));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

template <typename T>
std::string Param<T>::value_string() const {
  std::lock_guard lock(mutex_);
  if (secret() && value_ != default_value_) return "<redacted>";
  return format_value(value_);
}

template <typename T>
std::string Param<T>::default_string() const {
  return format_value(default_value_);
}

template <typename T>
void Param<T>::store_parsed(std::string_view text) {  // check_text() accepted it
  value_ = parse_value<T>(text);
}

template <typename T>
void Param<T>::restore_default() {
  value_ = default_value_;
}

template class Param<bool>;
template class Param<int64_t>;
template class Param<double>;
template class Param<std::string>;

Registry& Registry::global() {
  static Registry registry;
  return registry;
}

void Registry::add(ParamBase* param) {
  std::lock_guard lock(mutex_);
  for (auto* existing : params_)
    require(existing->name() != param->name(), "config", "parameter {} declared twice",
            param->name());
  params_.push_back(param);
}

ParamBase* Registry::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  for (auto* param : params_)
    if (param->name() == name || param->env_name() == name) return param;
  return nullptr;
}

ParamBase& Registry::at(std::string_view name) const {
  if (auto* param = find(name)) return *param;
  std::string known;
  for (auto* param : all())
    known += (known.empty() ? "" : ", ") + param->name();
  fail("config", "unknown parameter '{}' (known: {})", name, known);
}

std::vector<ParamBase*> Registry::all() const {
  std::lock_guard lock(mutex_);
  auto sorted = params_;
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name() < b->name(); });
  return sorted;
}

void Registry::set(std::string_view name, std::string_view text, Source source) {
  at(name).set_text(text, source);
}

namespace {

std::string read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "config", "cannot open config file '{}'", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Sets every (parameter, text) pair; throws one Error naming every value that was refused.
void set_all(const std::vector<std::pair<ParamBase*, std::string>>& values, Source source) {
  std::vector<std::string> refused;
  for (const auto& [param, text] : values) {
    try {
      param->set_text(text, source);
    } catch (const Error& e) {
      refused.push_back(e.message());
    }
  }
  if (refused.size() == 1) fail("config", "{}", refused[0]);
  if (!refused.empty())
    fail("config", "{} invalid parameter values: {}", refused.size(), fmt::join(refused, "; "));
}

}  // namespace

void Registry::load_environment() {
  // A tuned configuration (`proxyep tune`) first, under everything set explicitly.
  if (const char* path = std::getenv(kConfigFileVariable))
    load_text(read_config_file(path), path, /*defaults_only=*/true);
  std::vector<std::pair<ParamBase*, std::string>> values;
  for (auto* param : all())
    if (const char* value = std::getenv(param->env_name().c_str()))
      values.emplace_back(param, value);
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view var(*entry);
    if (var.rfind("PROXYEP_", 0) != 0) continue;
    auto name = var.substr(0, var.find('='));
    if (name != kConfigFileVariable && name.rfind(kRlVariablePrefix, 0) != 0 && !find(name))
      log::warn("environment variable {} is not a ProxyEP parameter (ignored)", name);
  }
  set_all(values, Source::environment);
}

void Registry::ensure_environment_loaded() {
  std::call_once(environment_once_, [this] {
    load_environment();
    log::apply_params();
  });
}

void Registry::load_file(const std::string& path) {
  load_text(read_config_file(path), path);
}

void Registry::load_text(std::string_view text, const std::string& origin, bool defaults_only) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    fail("config", "config file '{}' is not valid JSON: {}", origin, e.what());
  }
  require(doc.is_object(), "config", "config file '{}' must hold a JSON object", origin);
  std::vector<std::pair<ParamBase*, std::string>> values;
  for (auto& [name, value] : doc.items()) {
    std::string value_text = value.is_string() ? value.get<std::string>() : value.dump();
    ParamBase& param = at(name);
    if (defaults_only && param.source() != Source::default_value) continue;
    values.emplace_back(&param, std::move(value_text));
  }
  set_all(values, Source::config_file);
}

nlohmann::json Registry::to_json() const {
  auto out = nlohmann::json::array();
  for (auto* param : all()) {
    out.push_back({{"name", param->name()},
                   {"value", param->value_string()},
                   {"default", param->default_string()},
                   {"type", param->type_name()},
                   {"valid", param->valid_text()},
                   {"source", std::string(to_string(param->source()))},
                   {"env", param->env_name()},
                   {"description", param->description()}});
  }
  return out;
}

void Registry::reset_all() {
  for (auto* param : all())
    param->reset();
}

std::optional<std::string> read_environment(const char* name) {
  if (const char* value = std::getenv(name)) return std::string(value);
  return std::nullopt;
}

}  // namespace proxyep::config
