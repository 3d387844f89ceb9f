// File descriptors a job's size needs. Rank 0 of the rendezvous holds one connection per rank
// (and, in the ranks-as-threads tests and benchmarks, every rank's sockets live in one process),
// while the usual soft RLIMIT_NOFILE is 1024: a 1024-rank job would otherwise fail with EMFILE
// in accept(), which reads as ranks that never arrived.
#pragma once

#include <cstdint>
#include <string>

namespace proxyep {

// Makes sure this process may open `needed` descriptors in all: raises the soft RLIMIT_NOFILE
// (never above the hard limit, never lowers it) when it is below. Throws proxyep::Error(phase)
// naming both limits when the hard limit is too low. Returns the soft limit in force.
uint64_t reserve_descriptors(uint64_t needed, const std::string& phase);

}  // namespace proxyep
