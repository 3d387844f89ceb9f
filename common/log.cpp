#include "common/log.hpp"

#include "common/error.hpp"
#include "common/params.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace proxyep::log {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  // stderr, so benchmark and --json output on stdout stays machine-readable.
  auto logger = spdlog::stderr_color_mt("proxyep");
  logger->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(spdlog::level::info);
  return logger;
}

}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto made = make_logger();
    // Read the level without Param::get(): that would load the environment, whose warnings log.
    auto level = spdlog::level::from_str(params::log_level.value_string());
    made->set_level(level);
    return made;
  }();
  return *instance;
}

void set_rank(int rank) {
  logger().set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
}

void set_level(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  require(parsed != spdlog::level::off || level == "off", "config", "unknown log level '{}'",
          level);
  logger().set_level(parsed);
}

void apply_params() {
  set_level(params::log_level.value_string());
}

}  // namespace proxyep::log
