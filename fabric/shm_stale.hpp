// libfabric 1.17's shm provider names each endpoint's shared-memory region after the process
// ("/dev/shm/<pid>:<endpoint>:<n>") and refuses to enable an endpoint whose name already exists
// (fi_enable: -FI_EBUSY). A process that died without closing its endpoints (killed, _exit)
// leaves its regions behind, so a later process that happens to get the same pid cannot open shm
// at all. Regions named after this process's own pid can only be such leftovers (no live process
// but this one has the pid, and this one has not created them yet), so they are safe to remove.
#pragma once

namespace proxyep::fabric {

// Removes /dev/shm entries named "<this pid>:..." once per process, before the first shm
// endpoint is enabled. Logs what it removed; never throws.
void remove_stale_shm_regions();

}  // namespace proxyep::fabric
