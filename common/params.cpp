#include "common/params.hpp"

namespace proxyep::params {

// clang-format off
Param<std::string> fabric_provider{"fabric.provider", "auto",
    "libfabric provider by name (efa, efa-direct, verbs, tcp, shm, ...); 'auto' picks efa-direct, "
    "then efa, when present, else shm"};
Param<std::string> fabric_domain{"fabric.domain", "",
    "only use NICs (libfabric domains) whose name contains this text; empty = any"};
Param<int64_t> fabric_rails{"fabric.rails", 1,
    "NICs (domain + endpoint + CQ + AV each) per rank; memory is registered on every one. On "
    "providers with one NIC, several rails open several endpoints on it"};
Param<int64_t> fabric_cq_size{"fabric.cq_size", 16384,
    "completion queue entries per rail; EFA does not protect against CQ overrun, so size for the "
    "largest burst of remote and local completions"};
Param<int64_t> fabric_cq_batch{"fabric.cq_batch", 64,
    "completions drained per fi_cq_read call"};
Param<bool> fabric_reorder{"fabric.reorder", false,
    "reorder shim: split writes into segments posted in random order and deliver completions in "
    "random order, reproducing EFA SRD semantics on tcp and shm"};
Param<int64_t> fabric_reorder_seed{"fabric.reorder_seed", 0,
    "seed of the reorder shim's generator; 0 = derive one from the clock and the rank and log it"};
Param<int64_t> fabric_reorder_segment_bytes{"fabric.reorder_segment_bytes", 4096,
    "size of the segments the reorder shim splits each write into"};
Param<int64_t> fabric_reorder_max_held{"fabric.reorder_max_held", 32,
    "completions the reorder shim may hold back before it must release one"};

Param<int64_t> bootstrap_timeout_ms{"bootstrap.timeout_ms", 30000,
    "deadline of every bootstrap wait (rendezvous, allgather, barrier, broadcast), in ms"};
Param<std::string> bootstrap_interface{"bootstrap.interface", "",
    "address the rendezvous server of rank 0 binds to; empty = MASTER_ADDR"};

Param<std::string> log_level{"log.level", "info",
    "log level: trace, debug, info, warn, error, off"};
// clang-format on

}  // namespace proxyep::params
