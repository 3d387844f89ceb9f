// The typed parameter registry: every knob of ProxyEP is one Param<T> declared once in
// common/params.hpp with its type, default, description and environment name (PROXYEP_<NAME>,
// dots become underscores). Values come from, in rising precedence: the default, a JSON config
// file, the environment, the command line, and code (tests, the Python module). A lower source
// never overwrites a higher one, so the order in which sources are loaded does not matter.
// `proxyep config` prints every value and where it came from.
//
// Thread safety: get() and set() may be called from any thread; each Param guards its value.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::config {

enum class Source { default_value, config_file, environment, command_line, code };
std::string_view to_string(Source source);

class ParamBase {
 public:
  ParamBase(std::string name, std::string type_name, std::string description);
  virtual ~ParamBase() = default;
  ParamBase(const ParamBase&) = delete;
  ParamBase& operator=(const ParamBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& env_name() const { return env_name_; }
  const std::string& type_name() const { return type_name_; }
  const std::string& description() const { return description_; }
  Source source() const;

  virtual std::string value_string() const = 0;
  virtual std::string default_string() const = 0;

  // Parses `text` for this parameter's type and stores it when `source` ranks at least as high
  // as the current one. Throws proxyep::Error naming the parameter, its env name and the value.
  void set_text(std::string_view text, Source source);
  // Back to the default value and source (tests).
  void reset();

 protected:
  virtual void store_parsed(std::string_view text) = 0;  // throws std::invalid_argument
  virtual void restore_default() = 0;
  mutable std::mutex mutex_;
  Source source_ = Source::default_value;

 private:
  std::string name_;
  std::string env_name_;
  std::string type_name_;
  std::string description_;
};

// Supported types: bool, int64_t, double, std::string.
template <typename T>
class Param final : public ParamBase {
 public:
  Param(std::string name, T default_value, std::string description);

  T get() const;
  void set(T value, Source source = Source::code);
  std::string value_string() const override;
  std::string default_string() const override;

 private:
  void store_parsed(std::string_view text) override;
  void restore_default() override;
  T default_value_;
  T value_;
};

class Registry {
 public:
  static Registry& global();

  void add(ParamBase* param);  // throws on a duplicate name: every knob is declared once
  ParamBase* find(std::string_view name) const;
  ParamBase& at(std::string_view name) const;  // throws, listing the known names
  std::vector<ParamBase*> all() const;         // sorted by name

  void set(std::string_view name, std::string_view text, Source source);
  // Reads PROXYEP_<NAME> for every parameter; warns about PROXYEP_* variables nobody declared.
  void load_environment();
  // Loads once per process, on the first Param::get(); entry points may call it earlier to
  // surface malformed values before any work starts.
  void ensure_environment_loaded();
  // JSON object {"fabric.provider": "tcp", "bootstrap.timeout_ms": 5000, ...}.
  void load_file(const std::string& path);
  // The same from a config file's text (what load_file reads); `origin` names it in errors.
  void load_text(std::string_view text, const std::string& origin);
  nlohmann::json to_json() const;
  void reset_all();

 private:
  Registry() = default;
  mutable std::mutex mutex_;
  std::vector<ParamBase*> params_;
  std::once_flag environment_once_;
};

// The one way for library code to read a process environment variable that is not a ProxyEP
// parameter (torchrun's MASTER_ADDR, RANK, ...). Keeps getenv in one place.
std::optional<std::string> read_environment(const char* name);

}  // namespace proxyep::config
