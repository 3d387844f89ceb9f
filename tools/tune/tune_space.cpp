#include "tools/tune/tune_space.hpp"

#include "common/error.hpp"
#include "common/params.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>

namespace proxyep::tools::tune {
namespace {

// More values than this in one list is a typo ("1..1000"), not a search anyone wants to wait for.
constexpr size_t kMaxListValues = 64;

std::string trim(std::string_view text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  size_t end = text.find_last_not_of(" \t");
  return std::string(text.substr(begin, end - begin + 1));
}

std::vector<std::string> split_items(const std::string& option, const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string item = trim(std::string_view(text).substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    require(!item.empty(), "tune", "{} '{}': an empty item (expected a list like 1,2,4)", option,
            text);
    items.push_back(std::move(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

// An integer with the registry's optional K/M/G suffix; nullopt when `text` is not one.
std::optional<int64_t> parse_size(std::string_view text) {
  int shift = 0;
  if (!text.empty()) {
    switch (std::toupper(static_cast<unsigned char>(text.back()))) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      default:
        break;
    }
    if (shift != 0) text.remove_suffix(1);
  }
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (value > (INT64_MAX >> shift) || value < (INT64_MIN >> shift)) return std::nullopt;
  return value * (int64_t{1} << shift);
}

// One value for `param`, checked the way the registry will check it in the child run.
int64_t checked_value(const std::string& option, const std::string& list, const std::string& item,
                      const config::ParamBase& param) {
  auto value = parse_size(item);
  require(value.has_value(), "tune", "{} '{}': '{}' is not an integer (K, M, G suffixes allowed)",
          option, list, item);
  std::string reason = param.check_text(std::to_string(*value));
  require(reason.empty(), "tune", "{} '{}': {} is refused by {}: {}", option, list, item,
          param.name(), reason);
  return *value;
}

std::vector<int64_t> sorted_unique(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

void require_size(const std::string& option, const std::string& list, size_t count) {
  require(count <= kMaxListValues, "tune",
          "{} '{}': {} values, at most {} (each is a benchmark run)", option, list, count,
          kMaxListValues);
}

std::vector<int64_t> parse_threads(const std::string& list) {
  const std::string option = "--threads";
  std::vector<int64_t> values;
  for (const auto& item : split_items(option, list)) {
    size_t dots = item.find("..");
    int64_t lo = 0;
    int64_t hi = 0;
    if (dots == std::string::npos) {
      lo = hi = checked_value(option, list, item, params::proxy_threads);
    } else {
      lo = checked_value(option, list, trim(item.substr(0, dots)), params::proxy_threads);
      hi = checked_value(option, list, trim(item.substr(dots + 2)), params::proxy_threads);
      require(lo <= hi, "tune", "{} '{}': the range {} runs backwards", option, list, item);
    }
    // proxy.threads=0 means "one per NIC": a count the explicit ones already cover, and one the
    // fewer-threads tie rule could not rank.
    require(lo >= 1, "tune",
            "{} '{}': 0 is proxy.threads' automatic choice (one per NIC); tune compares explicit "
            "counts of 1 or more",
            option, list);
    require_size(option, list, values.size() + static_cast<size_t>(hi - lo + 1));
    for (int64_t t = lo; t <= hi; ++t)
      values.push_back(t);
  }
  return sorted_unique(std::move(values));
}

std::vector<bool> parse_pin(const std::string& list) {
  bool seen[2] = {false, false};
  for (const auto& item : split_items("--pin", list)) {
    std::string lower = item;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "1" || lower == "true" || lower == "yes" || lower == "on")
      seen[1] = true;
    else if (lower == "0" || lower == "false" || lower == "no" || lower == "off")
      seen[0] = true;
    else
      fail("tune", "--pin '{}': '{}' is refused by proxy.pin: {}", list, item,
           params::proxy_pin.check_text(item));
  }
  std::vector<bool> values;
  if (seen[1]) values.push_back(true);  // pinned first: the parameter's default
  if (seen[0]) values.push_back(false);
  return values;
}

std::vector<int64_t> parse_sizes(const std::string& option, const std::string& list,
                                 const config::ParamBase& param) {
  std::vector<int64_t> values;
  for (const auto& item : split_items(option, list)) {
    require(item.find("..") == std::string::npos, "tune",
            "{} '{}': ranges are for --threads only; list the sizes to try (e.g. 512K,1M,2M)",
            option, list);
    values.push_back(checked_value(option, list, item, param));
  }
  require_size(option, list, values.size());
  return sorted_unique(std::move(values));
}

// The value in force now, half and double: those the parameter accepts.
std::vector<int64_t> around(int64_t current, const config::ParamBase& param) {
  std::vector<int64_t> values;
  for (int64_t value : {current / 2, current, current * 2})
    if (param.check_text(std::to_string(value)).empty()) values.push_back(value);
  return sorted_unique(std::move(values));
}

// The current value when the list holds it (the search then starts from what runs today);
// otherwise the middle of the list, so that coordinate descent looks both ways.
template <typename T>
T start_value(const std::vector<T>& values, T current) {
  if (std::find(values.begin(), values.end(), current) != values.end()) return current;
  return values[(values.size() - 1) / 2];
}

}  // namespace

int usable_cores() {
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) return std::max(1, CPU_COUNT(&mask));
  return 1;
}

SearchSpace make_search_space(const SpaceOptions& options, int cores, const Candidate& current) {
  SearchSpace space;
  // One core stays with the application thread (proxy.threads' own default caps there too).
  space.threads = options.threads.empty()
                      ? parse_threads(fmt::format("1..{}", std::max(1, cores - 1)))
                      : parse_threads(options.threads);
  space.pin = options.pin.empty() ? std::vector<bool>{true, false} : parse_pin(options.pin);
  space.chunk_bytes =
      options.chunk_bytes.empty()
          ? around(current.chunk_bytes, params::ep_chunk_bytes)
          : parse_sizes("--chunk-bytes", options.chunk_bytes, params::ep_chunk_bytes);
  space.eager_bytes =
      options.eager_bytes.empty()
          ? around(current.eager_bytes, params::ep_eager_bytes)
          : parse_sizes("--eager-bytes", options.eager_bytes, params::ep_eager_bytes);
  space.start.threads = start_value(space.threads, current.threads);
  space.start.pin = start_value(space.pin, current.pin);
  space.start.chunk_bytes = start_value(space.chunk_bytes, current.chunk_bytes);
  space.start.eager_bytes = start_value(space.eager_bytes, current.eager_bytes);
  return space;
}

Candidate current_values() {
  Candidate c;
  c.threads = params::proxy_threads.get();
  c.pin = params::proxy_pin.get();
  c.chunk_bytes = params::ep_chunk_bytes.get();
  c.eager_bytes = params::ep_eager_bytes.get();
  return c;
}

std::string format_bytes(int64_t value) {
  constexpr std::pair<int, char> kUnits[] = {{30, 'G'}, {20, 'M'}, {10, 'K'}};
  for (auto [shift, suffix] : kUnits) {
    int64_t unit = int64_t{1} << shift;
    if (value != 0 && value % unit == 0) return fmt::format("{}{}", value / unit, suffix);
  }
  return std::to_string(value);
}

std::string describe(const Candidate& c) {
  return fmt::format("threads={} pin={} chunk={} eager={}", c.threads, c.pin,
                     format_bytes(c.chunk_bytes), format_bytes(c.eager_bytes));
}

}  // namespace proxyep::tools::tune
