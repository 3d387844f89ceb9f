// The typed parameter registry: every knob of ProxyEP is one Param<T> declared once in
// common/params.hpp with its type, default, description and environment name (PROXYEP_<NAME>,
// dots become underscores) and the values it accepts (Valid<T>: a range, a set of names, a
// syntax). Values come from, in rising precedence: the default, a JSON config file, the
// environment, the command line, and code (tests, the Python module). A lower source never
// overwrites a higher one, so the order in which sources are loaded does not matter. Every value
// is checked against what the parameter accepts when it is set, from any source, before it is
// stored: a parameter never holds a value outside its range, and the error names the parameter,
// its environment variable, the source, the value and what is valid.
// `proxyep config` prints every value and where it came from.
//
// Thread safety: get() and set() may be called from any thread; each Param guards its value.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace proxyep::config {

enum class Source { default_value, config_file, environment, command_line, code };
std::string_view to_string(Source source);

// A secret parameter's value is never shown: value_string() (what `proxyep config`, its JSON and
// every message print) reads "<redacted>" once it is set, and a malformed value is not echoed.
// It is taken only from the environment or code: a command line is readable by every user of the
// host (/proc/PID/cmdline) and config files get copied around, so those sources are refused.
enum class Sensitivity { plain, secret };

// The values a parameter accepts, declared with it. `text` says what is valid ("1..64",
// "trace, debug, info, ..."), for error messages, `proxyep config` and docs/CONFIG.md; `check`
// returns "" for a valid value and otherwise why it is not ("must be between 1 and 64").
template <typename T>
struct Valid {
  std::string text;
  std::function<std::string(const T&)> check;
};

// lo..hi, both included. Sizes print with the suffix the parser takes ("4K..1G").
Valid<int64_t> in_range(int64_t lo, int64_t hi);
// lo or more.
Valid<int64_t> at_least(int64_t lo);
// lo..hi, both included (NaN is never valid).
Valid<double> in_real_range(double lo, double hi);
// Exactly one of `names`.
Valid<std::string> one_of(std::vector<std::string> names);
// Any text (names and filters whose meaning only the code that uses them can judge).
Valid<std::string> any_text(std::string text = "any text");
// A syntax of its own: `check` returns "" or why the text does not fit `text`.
Valid<std::string> matching(std::string text, std::function<std::string(const std::string&)> check);

class ParamBase {
 public:
  ParamBase(std::string name, std::string type_name, std::string description,
            Sensitivity sensitivity = Sensitivity::plain);
  virtual ~ParamBase() = default;
  ParamBase(const ParamBase&) = delete;
  ParamBase& operator=(const ParamBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& env_name() const { return env_name_; }
  const std::string& type_name() const { return type_name_; }
  const std::string& description() const { return description_; }
  bool secret() const { return sensitivity_ == Sensitivity::secret; }
  Source source() const;

  virtual std::string value_string() const = 0;
  virtual std::string default_string() const = 0;
  // What the parameter accepts ("1..64"), as declared with it.
  virtual std::string valid_text() const = 0;
  // "" when `text` parses for this parameter's type and is a value it accepts; otherwise why not.
  virtual std::string check_text(std::string_view text) const = 0;

  // Parses `text` for this parameter's type, checks it against the declared range and stores
  // it when `source` ranks at least as high as the current one. Throws proxyep::Error naming the
  // parameter, its env name, the source, the value and what is valid; the old value stays.
  void set_text(std::string_view text, Source source);
  // Back to the default value and source (tests).
  void reset();

 protected:
  virtual void store_parsed(std::string_view text) = 0;  // throws std::invalid_argument
  virtual void restore_default() = 0;
  // Throws the Error of set_text for a value `reason` rejects.
  [[noreturn]] void reject(std::string_view text, Source source, std::string_view reason) const;
  mutable std::mutex mutex_;
  Source source_ = Source::default_value;

 private:
  std::string name_;
  std::string env_name_;
  std::string type_name_;
  std::string description_;
  Sensitivity sensitivity_;
};

// Supported types: bool, int64_t, double, std::string. Every type but bool declares what it
// accepts (a bool's values are its type's).
template <typename T>
class Param final : public ParamBase {
 public:
  Param(std::string name, T default_value,
        std::string description) requires std::is_same_v<T, bool>;
  Param(std::string name, T default_value, Valid<T> valid, std::string description,
        Sensitivity sensitivity = Sensitivity::plain) requires(!std::is_same_v<T, bool>);

  T get() const;
  // Throws proxyep::Error (as set_text) for a value outside the declared range.
  void set(T value, Source source = Source::code);
  std::string value_string() const override;  // "<redacted>" for a secret that is set
  std::string default_string() const override;
  std::string valid_text() const override;
  std::string check_text(std::string_view text) const override;

 private:
  void store_parsed(std::string_view text) override;
  void restore_default() override;
  std::string problem(const T& value) const;  // "" or why `value` is not accepted
  T default_value_;
  T value_;
  Valid<T> valid_;
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
  // Every invalid value is named in one Error (after the valid ones are stored). Before them,
  // the config file PROXYEP_CONFIG names (what `proxyep tune` writes), for the parameters still
  // at their defaults: a file of tuned values under anything set explicitly.
  void load_environment();
  static constexpr const char* kConfigFileVariable = "PROXYEP_CONFIG";
  // Variables of the Python RL layer (python/proxyep/rl: keys, URLs, tool paths): not runtime
  // parameters, so not reported as unknown ones.
  static constexpr const char* kRlVariablePrefix = "PROXYEP_RL_";
  // Loads once per process, on the first Param::get(); entry points may call it earlier to
  // surface malformed values before any work starts.
  void ensure_environment_loaded();
  // JSON object {"fabric.provider": "tcp", "bootstrap.timeout_ms": 5000, ...}. Every invalid
  // entry is named in one Error (after the valid ones are stored).
  void load_file(const std::string& path);
  // The same from a config file's text (what load_file reads); `origin` names it in errors.
  // `defaults_only`: parameters already set from another source keep their value.
  void load_text(std::string_view text, const std::string& origin, bool defaults_only = false);
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
