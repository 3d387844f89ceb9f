// The catalogue of every ProxyEP parameter (see common/registry.hpp for the mechanism).
// One place lists them all so `proxyep config` and docs/CONFIG.md are complete by construction.
// Environment names are derived: fabric.provider -> PROXYEP_FABRIC_PROVIDER.
#pragma once

#include "common/registry.hpp"

namespace proxyep::params {

using config::Param;
using config::Valid;

// fabric/
extern Param<std::string> fabric_provider;
extern Param<std::string> fabric_domain;
extern Param<int64_t> fabric_rails;
extern Param<int64_t> fabric_cq_size;
extern Param<int64_t> fabric_cq_batch;
extern Param<bool> fabric_reorder;
extern Param<int64_t> fabric_reorder_seed;
extern Param<int64_t> fabric_reorder_segment_bytes;
extern Param<int64_t> fabric_reorder_max_held;
extern Param<int64_t> fabric_rxm_buffer_bytes;

// control/
extern Param<int64_t> bootstrap_timeout_ms;
extern Param<std::string> bootstrap_interface;
extern Param<std::string> bootstrap_job_id;
extern Param<std::string> bootstrap_secret_file;
extern Param<std::string> bootstrap_secret;  // Sensitivity::secret: never printed

// common
extern Param<std::string> log_level;

// proxy/
extern Param<int64_t> proxy_threads;
extern Param<std::string> proxy_mode;
extern Param<bool> proxy_pin;
extern Param<std::string> proxy_cpus;
extern Param<int64_t> proxy_burst;
extern Param<int64_t> proxy_spin_passes;
extern Param<int64_t> proxy_yield_passes;
extern Param<int64_t> proxy_idle_sleep_us;
extern Param<bool> proxy_graph_polling;
extern Param<int64_t> proxy_credits_writes;
extern Param<int64_t> proxy_credits_bytes;
extern Param<int64_t> proxy_peer_timeout_ms;
extern Param<int64_t> proxy_wait_spin_us;
extern Param<int64_t> proxy_wait_drive_us;

// ep.* : the Buffer (integrations/buffer.hpp)
extern Param<int64_t> ep_timeout_ms;
extern Param<int64_t> ep_host_threads;
extern Param<int64_t> ep_chunk_bytes;
extern Param<int64_t> ep_eager_bytes;
extern Param<int64_t> ep_eager_budget_bytes;
extern Param<int64_t> ep_landing_bytes;
extern Param<std::string> ep_landing_fabric;
extern Param<std::string> ep_send_from_x;
extern Param<std::string> ep_internode;
extern Param<std::string> ep_async_wait;

// device.* : the devices the front ends open by name (gpu_side/device/open_device.hpp)
extern Param<bool> device_simulated_gate;

// metrics.* : the metrics endpoint (metrics/metrics_exporter.hpp)
extern Param<int64_t> metrics_port;
extern Param<std::string> metrics_address;

// daemon.* : proxyepd, the per-node proxy daemon (daemon/, docs/DAEMON.md)
extern Param<std::string> daemon_socket;
extern Param<std::string> daemon_socket_mode;
extern Param<int64_t> daemon_io_timeout_ms;
extern Param<int64_t> daemon_drain_timeout_ms;
extern Param<std::string> daemon_allow_uids;
extern Param<std::string> daemon_allow_gids;
extern Param<int64_t> daemon_max_connections;

// launch.* : the local launcher (tools/launcher.hpp)
extern Param<int64_t> launch_max_ranks;
extern Param<std::string> launch_link;
extern Param<double> launch_link_copy_gbytes;
extern Param<double> testbed_link_gbps;
extern Param<std::string> testbed_namespaces;

}  // namespace proxyep::params
