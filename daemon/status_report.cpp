#include "daemon/status_report.hpp"

#include "control/daemon_handshake.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#ifndef PROXYEP_BUILD_VERSION
#define PROXYEP_BUILD_VERSION "unknown"
#endif

namespace proxyep::daemon {

nlohmann::json status_report(const DaemonStats& stats, const std::string& socket_path,
                             const std::string& metrics_url) {
  const auto started_unix =
      std::chrono::duration_cast<std::chrono::seconds>(stats.started_at.time_since_epoch()).count();
  const std::time_t started = static_cast<std::time_t>(started_unix);
  return {
      {"proxyep", "status"},
      {"version", control::kProtocolVersion},
      {"build_version", PROXYEP_BUILD_VERSION},
      {"pid", stats.pid},
      {"uid", stats.uid},
      {"gid", stats.gid},
      {"started_at", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(started))},
      {"started_unix", started_unix},
      {"uptime_s", stats.uptime_s()},
      {"socket", socket_path},
      {"clients_attached", stats.clients_attached.load(std::memory_order_relaxed)},
      {"connections",
       {{"accepted", stats.accepted.load(std::memory_order_relaxed)},
        {"refused", stats.refused.load(std::memory_order_relaxed)},
        {"bad_handshake", stats.bad_handshake.load(std::memory_order_relaxed)}}},
      {"draining", stats.draining.load(std::memory_order_relaxed)},
      {"metrics_url", metrics_url.empty() ? nlohmann::json(nullptr) : nlohmann::json(metrics_url)},
      {"capabilities", control::daemon_capabilities()},
  };
}

}  // namespace proxyep::daemon
