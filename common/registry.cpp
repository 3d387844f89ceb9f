#include "common/registry.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

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
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw std::invalid_argument("expected an integer (optionally with a K, M or G suffix)");
  if (value > std::numeric_limits<int64_t>::max() / multiplier ||
      value < std::numeric_limits<int64_t>::min() / multiplier)
    throw std::invalid_argument("out of the 64-bit integer range");
  return value * multiplier;
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

ParamBase::ParamBase(std::string name, std::string type_name, std::string description)
    : name_(std::move(name)),
      env_name_(env_name_for(name_)),
      type_name_(std::move(type_name)),
      description_(std::move(description)) {}

Source ParamBase::source() const {
  std::lock_guard lock(mutex_);
  return source_;
}

void ParamBase::set_text(std::string_view text, Source source) {
  std::lock_guard lock(mutex_);
  if (source < source_) return;  // a higher-precedence source already set it
  try {
    store_parsed(text);
  } catch (const std::invalid_argument& e) {
    fail("config", "invalid value '{}' for {} (env {}, from {}): {}", text, name_, env_name_,
         to_string(source), e.what());
  }
  source_ = source;
}

void ParamBase::reset() {
  std::lock_guard lock(mutex_);
  restore_default();
  source_ = Source::default_value;
}

template <typename T>
Param<T>::Param(std::string name, T default_value, std::string description)
    : ParamBase(std::move(name), type_name_of<T>(), std::move(description)),
      default_value_(default_value),
      value_(std::move(default_value)) {
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
  std::lock_guard lock(mutex_);
  if (source < source_) return;
  value_ = std::move(value);
  source_ = source;
}

template <typename T>
std::string Param<T>::value_string() const {
  std::lock_guard lock(mutex_);
  return format_value(value_);
}

template <typename T>
std::string Param<T>::default_string() const {
  return format_value(default_value_);
}

template <typename T>
void Param<T>::store_parsed(std::string_view text) {
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

void Registry::load_environment() {
  for (auto* param : all())
    if (const char* value = std::getenv(param->env_name().c_str()))
      param->set_text(value, Source::environment);
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view var(*entry);
    if (var.rfind("PROXYEP_", 0) != 0) continue;
    auto name = var.substr(0, var.find('='));
    if (!find(name))
      log::warn("environment variable {} is not a ProxyEP parameter (ignored)", name);
  }
}

void Registry::ensure_environment_loaded() {
  std::call_once(environment_once_, [this] {
    load_environment();
    log::apply_params();
  });
}

void Registry::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "config", "cannot open config file '{}'", path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  load_text(text, path);
}

void Registry::load_text(std::string_view text, const std::string& origin) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    fail("config", "config file '{}' is not valid JSON: {}", origin, e.what());
  }
  require(doc.is_object(), "config", "config file '{}' must hold a JSON object", origin);
  for (auto& [name, value] : doc.items()) {
    const std::string value_text = value.is_string() ? value.get<std::string>() : value.dump();
    set(name, value_text, Source::config_file);
  }
}

nlohmann::json Registry::to_json() const {
  auto out = nlohmann::json::array();
  for (auto* param : all()) {
    out.push_back({{"name", param->name()},
                   {"value", param->value_string()},
                   {"default", param->default_string()},
                   {"type", param->type_name()},
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
