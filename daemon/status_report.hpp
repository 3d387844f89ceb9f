// The status frame a `status` client gets after its welcome (and `proxyep status` prints):
//
//   {"proxyep":"status", "version":1, "build_version":"0.1.0", "pid":N, "uid":N, "gid":N,
//    "started_at":"2026-12-01T08:00:00Z", "started_unix":1796112000, "uptime_s":12.5,
//    "socket":"/run/proxyep/proxyepd.sock", "clients_attached":0,
//    "connections":{"accepted":N,"refused":N,"bad_handshake":N}, "draining":false,
//    "metrics_url":"http://127.0.0.1:9464/metrics" (null when metrics are off),
//    "capabilities":["status"]}
//
// `version` is the protocol's (handshake.hpp); the counts include the connection asking.
#pragma once

#include "daemon/daemon_stats.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace proxyep::daemon {

// `metrics_url` empty: metrics are off.
nlohmann::json status_report(const DaemonStats& stats, const std::string& socket_path,
                             const std::string& metrics_url);

}  // namespace proxyep::daemon
