// Logging goes through spdlog with one pattern for the whole library:
// "[time] [rank R] [level] message". The rank is set by the bootstrap once it is known.
#pragma once

#include <spdlog/spdlog.h>

namespace proxyep::log {

spdlog::logger& logger();
void set_rank(int rank);
void set_level(std::string_view level);  // throws proxyep::Error on an unknown level name
// Applies log.level from the registry (called once the environment is loaded).
void apply_params();

template <typename... Args>
void trace(spdlog::format_string_t<Args...> f, Args&&... a) {
  logger().trace(f, std::forward<Args>(a)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> f, Args&&... a) {
  logger().debug(f, std::forward<Args>(a)...);
}
template <typename... Args>
void info(spdlog::format_string_t<Args...> f, Args&&... a) {
  logger().info(f, std::forward<Args>(a)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> f, Args&&... a) {
  logger().warn(f, std::forward<Args>(a)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> f, Args&&... a) {
  logger().error(f, std::forward<Args>(a)...);
}

}  // namespace proxyep::log
