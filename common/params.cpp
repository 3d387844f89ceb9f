#include "common/params.hpp"

#include "common/error.hpp"
#include "common/link_spec.hpp"
#include "common/topology.hpp"

#include <algorithm>
#include <cctype>

namespace proxyep::params {
namespace {

constexpr int64_t kDayMs = int64_t{24} * 3600 * 1000;

// "auto" or a libfabric provider name as fi_getinfo takes it ("tcp", "tcp;ofi_rxm", "efa-direct").
// Whether this host's libfabric has it is fabric/'s question (fabric::require_provider).
Valid<std::string> provider_name() {
  return config::matching(
      "auto, or a libfabric provider name (letters, digits, '_', '-'; 'core;utility')",
      [](const std::string& name) -> std::string {
        bool chars_ok = std::all_of(name.begin(), name.end(), [](unsigned char c) {
          return std::isalnum(c) || c == '_' || c == '-' || c == ';';
        });
        if (name.empty() || !chars_ok || name.front() == ';' || name.back() == ';')
          return "must be auto or a provider name such as efa, tcp, shm or tcp;ofi_rxm";
        return "";
      });
}

Valid<std::string> host_or_empty() {
  return config::matching("empty, or an address or host name", [](const std::string& host) {
    bool spaces = std::any_of(host.begin(), host.end(),
                              [](unsigned char c) { return std::isspace(c) || !std::isprint(c); });
    return spaces || host.size() > 253 ? std::string("must be an address or host name")
                                       : std::string();
  });
}

Valid<std::string> cpu_list_or_empty() {
  return config::matching("empty, or a cpu list like 0-3,8", [](const std::string& list) {
    if (list.empty()) return std::string();
    try {
      topology::parse_cpu_list(list);
      return std::string();
    } catch (const Error& e) {
      return e.message();
    }
  });
}

}  // namespace

using config::any_text;
using config::at_least;
using config::in_range;
using config::one_of;

// clang-format off
Param<std::string> fabric_provider{"fabric.provider", "auto", provider_name(),
    "libfabric provider by name (efa, efa-direct, verbs, tcp, shm, ...); 'auto' picks efa-direct, "
    "then efa, when present, else shm"};
Param<std::string> fabric_domain{"fabric.domain", "", any_text(),
    "only use NICs (libfabric domains) named this, or if none is, whose name contains it; empty = "
    "any but the loopback interface (unless it is the only one). For tcp a domain is a network "
    "interface and the endpoints listen on its address: 'lo' keeps a one-host job on 127.0.0.1, "
    "a multi-node job needs the interface the other nodes reach"};
Param<int64_t> fabric_rails{"fabric.rails", 1, in_range(1, 64),
    "NICs (domain + endpoint + CQ + AV each) per rank; memory is registered on every one. On "
    "providers with one NIC, several rails open several endpoints on it"};
Param<int64_t> fabric_cq_size{"fabric.cq_size", 16384, in_range(1, int64_t{1} << 24),
    "completion queue entries per rail; EFA does not protect against CQ overrun, so size for the "
    "largest burst of remote and local completions"};
Param<int64_t> fabric_cq_batch{"fabric.cq_batch", 64, in_range(1, 4096),
    "completions drained per fi_cq_read call"};
Param<bool> fabric_reorder{"fabric.reorder", false,
    "reorder shim: split writes into segments posted in random order and deliver completions in "
    "random order, reproducing EFA SRD semantics on tcp and shm"};
Param<int64_t> fabric_reorder_seed{"fabric.reorder_seed", 0, at_least(0),
    "seed of the reorder shim's generator; 0 = derive one from the clock and the rank and log it"};
Param<int64_t> fabric_reorder_segment_bytes{"fabric.reorder_segment_bytes", 4096,
    in_range(1, int64_t{1} << 30),
    "size of the segments the reorder shim splits each write into"};
Param<int64_t> fabric_reorder_max_held{"fabric.reorder_max_held", 32, in_range(0, 65536),
    "completions the reorder shim may hold back before it must release one"};
Param<int64_t> fabric_rxm_buffer_bytes{"fabric.rxm_buffer_bytes", 2048, in_range(0, 1 << 20),
    "tcp;ofi_rxm (and verbs;ofi_rxm): size of the utility provider's message buffers "
    "(FI_OFI_RXM_BUFFER_SIZE, set before libfabric loads its providers unless the environment "
    "has it). ProxyEP moves data by RMA, never by messages, and libfabric's 16 KiB default cost "
    "~80 MiB of buffer pools per rank; 0 = libfabric's default"};

Param<int64_t> bootstrap_timeout_ms{"bootstrap.timeout_ms", 30000, in_range(1, kDayMs),
    "deadline of every bootstrap wait (rendezvous, allgather, barrier, broadcast), in ms"};
Param<std::string> bootstrap_interface{"bootstrap.interface", "", host_or_empty(),
    "address the rendezvous server of rank 0 binds to; empty = MASTER_ADDR"};
Param<std::string> bootstrap_job_id{"bootstrap.job_id", "",
    any_text("empty, or printable ASCII without spaces, at most 256 bytes (checked with TORCHELASTIC_RUN_ID when the bootstrap reads it)"),
    "identity of the job, the same on every rank: rank 0 refuses (and logs) ranks of another job, "
    "and those fail naming both ids; a label, not a secret; empty = torchrun's "
    "TORCHELASTIC_RUN_ID when set, else none. `proxyep launch` gives each launch its own"};
Param<std::string> bootstrap_secret_file{"bootstrap.secret_file", "", any_text("empty, or a file path"),
    "file holding the job's secret (16..4096 bytes, trailing newlines ignored; owned by the job's "
    "user, mode 0600): ranks and rank 0 prove they know it (HMAC-SHA256 over the rendezvous "
    "handshake) or are refused; empty = no secret (only bootstrap.job_id keeps jobs apart). "
    "`proxyep launch` writes one per launch and removes it afterwards. See docs/SECURITY.md"};
Param<std::string> bootstrap_secret{"bootstrap.secret", "", any_text("any text"),
    "the job's secret itself, instead of bootstrap.secret_file: taken only from the environment, "
    "never printed; processes the ranks start inherit it, so prefer the file",
    config::Sensitivity::secret};

Param<std::string> log_level{"log.level", "info",
    one_of({"trace", "debug", "info", "warn", "error", "critical", "off"}),
    "log level: trace, debug, info, warn, error, critical, off"};

// proxy/
Param<int64_t> proxy_threads{"proxy.threads", 0, in_range(0, 256),
    "proxy threads per rank; 0 = one per NIC (libfabric domain), at most cores - 1. Rails that "
    "share a domain are driven by one thread (FI_THREAD_DOMAIN), so more threads than domains "
    "are not started"};
Param<std::string> proxy_mode{"proxy.mode", "in-process", one_of({"in-process", "daemon"}),
    "where the proxy threads of ranks on several nodes run: in-process (each rank runs its own) "
    "or daemon (this node's proxyepd at daemon.socket serves every local rank; every rank of a "
    "job must use the same mode)"};
Param<bool> proxy_pin{"proxy.pin", true,
    "pin each proxy thread to the cores nearest its NIC (hwloc), or to proxy.cpus"};
Param<std::string> proxy_cpus{"proxy.cpus", "", cpu_list_or_empty(),
    "CPUs the proxy threads may be pinned to, as a cpu list (\"2-3,6\"); empty = the cores "
    "nearest each thread's NIC"};
Param<int64_t> proxy_burst{"proxy.burst", 32, in_range(1, 4096),
    "descriptors a proxy thread pops from one ring per pass; all but the last write of a burst "
    "are posted with FI_MORE"};
Param<int64_t> proxy_spin_passes{"proxy.spin_passes", 64, in_range(0, 1000000000),
    "empty passes a proxy thread busy-polls before it starts to back off (long spins starve "
    "the threads it waits for when threads outnumber cores)"};
Param<int64_t> proxy_yield_passes{"proxy.yield_passes", 2000, in_range(0, 1000000000),
    "empty passes with sched_yield() between them, after spinning and before sleeping"};
Param<int64_t> proxy_idle_sleep_us{"proxy.idle_sleep_us", 5000, in_range(1, 1000000),
    "longest sleep of an idle proxy thread (nothing in flight, nobody waiting) before it polls "
    "its completion queues again; ring doorbells and waiters wake it at once. Each wake-up costs "
    "~35 us of CPU on a small VM: 5 ms keeps an idle thread near 0.5% of a core"};
Param<bool> proxy_graph_polling{"proxy.graph_polling", true,
    "once a Buffer captured low-latency calls between nodes, its proxy threads keep polling "
    "(yielding between empty passes) instead of sleeping up to proxy.idle_sleep_us: a graph's "
    "writes and arrivals ring no doorbell, so a sleeping proxy would add up to that to a step"};
Param<int64_t> proxy_credits_writes{"proxy.credits_writes", 64, in_range(1, 65536),
    "writes a proxy thread may have in flight to one destination rank"};
Param<int64_t> proxy_credits_bytes{"proxy.credits_bytes", 8 << 20,
    in_range(1, int64_t{1} << 40),
    "bytes a proxy thread may have in flight to one destination rank (a larger single write "
    "goes alone)"};
Param<int64_t> proxy_peer_timeout_ms{"proxy.peer_timeout_ms", 30000, in_range(1, kDayMs),
    "a destination whose writes make no progress for this long is declared failed, and every "
    "waiter gets an error naming it"};
Param<int64_t> proxy_wait_spin_us{"proxy.wait_spin_us", -1, in_range(-1, 1000000),
    "a thread waiting on the proxy engine (flag, quiet) polls this long, yielding the core, "
    "before it sleeps until a proxy thread signals progress; -1 = 50 on hosts with 4 or more "
    "cores, 0 below (a polling waiter there steals the core its proxy needs)"};
Param<int64_t> proxy_wait_drive_us{"proxy.wait_drive_us", -1, in_range(-1, 1000000),
    "a thread waiting on the proxy engine first runs the proxy threads' passes itself this long "
    "(they sleep meanwhile): no wake-up of a sleeping proxy, no hand-off back to the waiter; 0 = "
    "never; -1 = 2000, except 0 on shared-memory transports (shm), whose progress calls may block "
    "on a dead peer"};
Param<int64_t> ep_timeout_ms{"ep.timeout_ms", 100000, in_range(1, kDayMs),
    "a Buffer call (dispatch, combine, construction) waits this long for its peers before it "
    "fails naming the ranks that did not arrive (DeepEP's CPU timeout is 100 s)"};
Param<int64_t> ep_host_threads{"ep.host_threads", 0, in_range(0, 64),
    "threads of a rank's CPU executor (the CPU twins of the EP kernels), the calling thread "
    "included; 0 = the cores of this host divided by the ranks on the node, at least 1, at most 8"};
Param<int64_t> ep_chunk_bytes{"ep.chunk_bytes", 1 << 20, in_range(4096, int64_t{1} << 30),
    "largest chunk of a Buffer stream between nodes (one fabric write; smaller when num_nvl_bytes "
    "or num_rdma_bytes leave less per peer), so the first chunks are on the wire while later rows "
    "are still being packed; every rank must use the same value"};
Param<int64_t> ep_eager_bytes{"ep.eager_bytes", 128 << 10, in_range(0, 64 << 20),
    "a Buffer call's rows from one rank to another that fit this many bytes travel with the "
    "call's notify record instead of after it (one synchronisation per call instead of two); "
    "costs 2 x ranks x this in every arena and staging area (capped by ep.eager_budget_bytes); "
    "0 = never; every rank must use the same value"};
Param<int64_t> ep_eager_budget_bytes{"ep.eager_budget_bytes", 8 << 20,
    in_range(0, int64_t{1} << 34),
    "most bytes of eager slots in one arena or staging area: a pair's eager size is "
    "min(ep.eager_bytes, this / (2 x ranks)), so large groups (where each pair's rows shrink "
    "anyway) do not pay 2 x ranks x ep.eager_bytes per area (128 KiB pairs up to 32 ranks at the "
    "default, 32 KiB at 128, 8 KiB at 512); every rank must use the same value"};
Param<int64_t> ep_landing_bytes{"ep.landing_bytes", int64_t{32} << 30,
    in_range(0, int64_t{1} << 46),
    "address space of a rank's landing region, where a normal-mode dispatch's recv_x lives when "
    "the node's other ranks can store their rows straight into it (one copy instead of two); "
    "memory the node's ranks share, reserved, not committed: a page is committed when an output "
    "first uses it and stays with the Buffer for later outputs; 0 = off (rows land in the arena "
    "and are copied out); every rank must use the same value"};

Param<std::string> ep_landing_fabric{"ep.landing_fabric", "auto", one_of({"auto", "on", "off"}),
    "whether rows from other nodes are written straight into recv_x too: the landing region is "
    "then registered with the fabric, all of it (ep.landing_bytes); auto = on for providers that "
    "register without pinning memory (tcp, shm, ...), off for efa and verbs, which would pin the "
    "whole region (there, set ep.landing_bytes to what recv_x needs and this to on)"};

Param<std::string> ep_send_from_x{"ep.send_from_x", "auto", one_of({"auto", "off"}),
    "whether a normal-mode combine writes its rows for other nodes straight from the caller's x "
    "(no copy into the staging area; when no topk_weights travel): auto = where the provider "
    "reads memory nobody registered (tcp, shm, ...: no FI_MR_LOCAL), never on efa or verbs; "
    "off = always through the staging area"};
Param<std::string> ep_internode{"ep.internode", "hierarchical", one_of({"hierarchical", "per_rank"}),
    "how normal mode crosses nodes: hierarchical = as DeepEP's internode kernels, a token goes "
    "once to each node that needs it, to the rank with the sender's local index there, which "
    "forwards it inside its node (combine reduces inside the node first), and a rank talks over "
    "the fabric only to those counterparts; per_rank = a token goes to every rank on another node "
    "that needs it; hierarchical needs full nodes of more than one rank and a Buffer without "
    "low_latency_mode (host or device tensors alike), and falls back to per_rank otherwise (BufferStats::internode "
    "says which ran); every rank must use the same value"};
Param<std::string> ep_async_wait{"ep.async_wait", "host", one_of({"host", "device"}),
    "how a caller's stream waits for an async_finish call with device tensors "
    "(EventOverlap.current_stream_wait): host = the calling thread waits for the call, then its "
    "outputs are complete on every stream; device = the caller's stream waits for a device "
    "point (a one-thread kernel spinning on a word the call raises when it ends) and the thread "
    "goes on at once, as DeepEP's does. device only where the Buffer's streams have hardware "
    "queues of their own: where they share one (CUDA_DEVICE_MAX_CONNECTIONS=1, Megatron's "
    "setting, or more streams than connections) the call's later kernels queue behind the spin "
    "and the call fails at its deadline"};

// device.* : the devices the front ends open by name (gpu_side/device/open_device.hpp)
Param<bool> device_simulated_gate{"device.simulated_gate", true,
    "the simulated device (--device simulated, deep_ep on device=\"simulated\") where the CPU "
    "has no memory protection keys: keep its memory PROT_NONE while its streams run nothing, so "
    "host code that touches it faults. Each opening and closing is an mprotect, which takes the "
    "process's memory-map lock, as libfabric shm's cross-process copies into this process do: "
    "off only where such timing matters more than the check (with keys, always protected)"};

// metrics/
Param<int64_t> metrics_port{"metrics.port", -1, in_range(-1, 65535),
    "serve Prometheus metrics over HTTP (GET /metrics) from every Buffer: -1 = off; 0 = any free "
    "port (logged at info level, and Buffer.metrics_port); N = port N + the rank's LOCAL_RANK, so "
    "that the ranks of one host do not collide (proxyepd serves on N itself)"};
Param<std::string> metrics_address{"metrics.address", "127.0.0.1", host_or_empty(),
    "the IPv4 address the metrics endpoint listens on (127.0.0.1: this host only; 0.0.0.0: every "
    "interface, for a Prometheus server elsewhere)"};

// daemon.* : proxyepd, the per-node proxy daemon (daemon/, docs/DAEMON.md)
Param<std::string> daemon_socket{"daemon.socket", "/run/proxyep/proxyepd.sock",
    config::matching("an absolute path of at most 107 bytes (a Unix socket's limit)",
        [](const std::string& path) {
          return path.empty() || path.front() != '/' || path.size() > 107 || path.back() == '/'
                     ? std::string("must be an absolute file path of at most 107 bytes")
                     : std::string();
        }),
    "the Unix socket proxyepd serves, `proxyep status` asks and ranks with proxy.mode daemon "
    "attach to; its directory is created (mode 0750) when missing. For ranks, \"{node}\" in the "
    "path becomes the node's index (rank / ranks per node), so emulated nodes on one machine "
    "each reach their own daemon"};
Param<std::string> daemon_socket_mode{"daemon.socket_mode", "0660",
    config::matching("octal permission bits, 0000..0777", [](const std::string& mode) {
      bool octal = !mode.empty() && mode.size() <= 4 &&
                   mode.find_first_not_of("01234567") == std::string::npos;
      if (octal && std::stoi(mode, nullptr, 8) <= 0777) return std::string();
      return std::string("must be octal, 0000..0777");
    }),
    "permission bits of proxyepd's socket file (who may connect at all; the peer-credential "
    "check of daemon.allow_uids / daemon.allow_gids comes after)"};
Param<int64_t> daemon_io_timeout_ms{"daemon.io_timeout_ms", 5000, in_range(10, kDayMs),
    "proxyepd drops a client that has not sent its hello, or not taken the answer, within this "
    "time; a stalled client never blocks the daemon"};
Param<int64_t> daemon_drain_timeout_ms{"daemon.drain_timeout_ms", 10000, in_range(0, kDayMs),
    "on SIGTERM/SIGINT proxyepd stops accepting at once and gives the connections in progress "
    "this long to finish, then exits 0"};
Param<std::string> daemon_allow_uids{"daemon.allow_uids", "",
    config::matching("empty, or user ids separated by commas: 0,1000", [](const std::string& ids) {
      return ids.find_first_not_of("0123456789, ") == std::string::npos
                 ? std::string()
                 : std::string("must be numeric user ids separated by commas");
    }),
    "user ids proxyepd serves (checked with SO_PEERCRED on every connection); empty = the "
    "daemon's own uid and root. A client whose uid is not listed is still served when its gid "
    "is in daemon.allow_gids"};
Param<std::string> daemon_allow_gids{"daemon.allow_gids", "",
    config::matching("empty, or group ids separated by commas: 0,27", [](const std::string& ids) {
      return ids.find_first_not_of("0123456789, ") == std::string::npos
                 ? std::string()
                 : std::string("must be numeric group ids separated by commas");
    }),
    "primary group ids proxyepd also serves (SO_PEERCRED's gid); empty = none beyond "
    "daemon.allow_uids"};
Param<int64_t> daemon_max_connections{"daemon.max_connections", 256, in_range(1, 65536),
    "connections proxyepd handles at once; more wait in the socket's backlog until one ends"};

// tools/ (the local launcher, tools/launcher.hpp)
Param<int64_t> launch_max_ranks{"launch.max_ranks", 256, in_range(1, 65536),
    "most ranks `proxyep launch` (and a benchmark that starts its own ranks) starts on this "
    "machine; more are refused before any starts (`proxyep launch --max-ranks` raises it)"};
Param<std::string> launch_link{"launch.link", "",
    config::matching("empty, or GBPS[,LATENCY_US] or preset:NAME[,LATENCY_US] (p5, p5en, p6-b200)",
                     [](const std::string& text) { return link_spec_problem(text); }),
    "run each emulated node in its own network namespace, joined to the others by links shaped "
    "to this rate (Gbit/s per node and direction) and latency (docs/TESTBED.md); a preset keeps "
    "a machine's NVLink:EFA ratio; empty = every rank in this host's network, no shaping"};
Param<double> launch_link_copy_gbytes{"launch.link_copy_gbytes", 0, config::in_real_range(0, 1000),
    "GB/s one core copies in shared memory here, which a launch.link preset divides by the "
    "machine's NVLink:EFA ratio; 0 = measured at each launch (set it to repeat a run's links)"};
Param<double> testbed_link_gbps{"testbed.link_gbps", 0, config::in_real_range(0, kMaxLinkGbps),
    "set by the launcher for the ranks it starts on the testbed: each node's link rate (Gbit/s "
    "per direction) that benchmarks report utilisation against; 0 = not on the testbed"};
Param<std::string> testbed_namespaces{"testbed.namespaces", "", any_text("comma-separated names"),
    "set by the launcher for the ranks it starts on the testbed: the network namespace of each "
    "node, in node order (the MPI baseline starts its ranks in them); empty = not on the testbed"};
// clang-format on

}  // namespace proxyep::params
