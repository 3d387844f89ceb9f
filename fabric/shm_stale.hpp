// libfabric 1.17's shm provider names each endpoint's shared-memory region after the process
// ("/dev/shm/<pid>:<endpoint>:<n>") and refuses to enable an endpoint whose name already exists
// (fi_enable: -FI_EBUSY). A process that dies without closing its endpoints (killed, _exit)
// leaves its regions behind: each holds RAM (16 MiB) until someone removes it, and a later
// process that happens to get the same pid cannot open shm at all.
//
// Regions named after a pid are safe to remove when no live process has that pid and none can
// get it while we look: this process's own pid before its first shm endpoint (no other process
// has the pid, and this one has not created them yet), or a child that has exited but is not
// yet reaped (a zombie keeps its pid from reuse) — how the local launcher cleans up after its
// ranks (tools/launcher.hpp).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace proxyep::fabric {

// Removes the entries of `dir` named "<pid>:..." that belong to this process's effective user,
// and returns their paths. Only call it for a pid no live process has (above). A directory that
// cannot be read removes nothing; only an allocation failure throws.
std::vector<std::string> remove_shm_regions_of(pid_t pid, const std::string& dir = "/dev/shm");

// remove_shm_regions_of(getpid()) once per process, before the first shm endpoint is enabled.
// Logs what it removed; never throws.
void remove_stale_shm_regions();

// Registers (once per process) the removal of this process's own regions when it exits
// normally (exit(), return from main). For a process that abandons a fabric on purpose -- a proxy
// thread stuck inside the provider keeps its endpoints for the rest of the process's life -- whose
// shm provider then never unlinks them. Nothing uses them once the process has ended.
void remove_own_shm_regions_at_exit();

}  // namespace proxyep::fabric
