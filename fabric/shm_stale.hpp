// libfabric 1.17's shm provider names each endpoint's shared-memory region after the process
// ("/dev/shm/<pid>:<endpoint>:<n>") and refuses to enable an endpoint whose name already exists
// (fi_enable: -FI_EBUSY). A process that dies without closing its endpoints (killed, _exit)
// leaves its regions behind: each holds RAM (16 MiB) until someone removes it, and a later
// process that happens to get the same pid cannot open shm at all.
//
// Two ways to know a region is dead:
// - By pid, where no live process has it and none can get it while we look: this process's own
//   pid before its first shm endpoint (no other process has the pid, and this one has not
//   created them yet), or a child that has exited but is not yet reaped (a zombie keeps its pid
//   from reuse) — how the local launcher cleans up after its ranks (tools/launcher.hpp).
// - By use, for everyone else's leftovers (a launcher killed with its ranks, a rank killed by
//   its parent-death signal): the kernel grants a write lease (fcntl F_SETLEASE) only on a file
//   that no other open file holds, and a mapping holds its file, so a region the lease is
//   granted on is mapped by nobody: not by its owner, not by a peer. That holds across pid
//   namespaces (a region's pid means nothing in another one) and pid reuse. While the lease is
//   held, anyone else's open() of the file waits for us, so nobody starts using it between the
//   check and the unlink. The named pid must also name no running process in this pid
//   namespace (gone, or a zombie): a second guard, for kernels whose lease check misses
//   read-only mappings.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace proxyep::fabric {

// Removes the entries of `dir` named "<pid>:..." that belong to this process's effective user,
// and returns their paths. Only call it for a pid no live process has (above). A directory that
// cannot be read removes nothing; only an allocation failure throws.
std::vector<std::string> remove_shm_regions_of(pid_t pid, const std::string& dir = "/dev/shm");

// Removes the entries of `dir` named "<pid>:..." that belong to this process's effective user,
// that no process has open or mapped, and whose pid names no running process here (above); returns
// their paths. Safe at any time, from any process. Only an allocation failure throws.
std::vector<std::string> remove_unused_shm_regions(const std::string& dir = "/dev/shm");

// Once per process, before its first fabric endpoint: remove_shm_regions_of(getpid()), then
// remove_unused_shm_regions() (every start of a ProxyEP process sweeps what dead ones left on
// the node). Logs what it removed; never throws.
void remove_stale_shm_regions();

// Registers (once per process) the removal of this process's own regions when it exits
// normally (exit(), return from main). For a process that abandons a fabric on purpose -- a proxy
// thread stuck inside the provider keeps its endpoints for the rest of the process's life -- whose
// shm provider then never unlinks them. Nothing uses them once the process has ended.
void remove_own_shm_regions_at_exit();

}  // namespace proxyep::fabric
