// Memory registration on every rail. One MR per rail (not per domain), because under
// FI_MR_ENDPOINT an MR is bound to one endpoint, and fake rails share a domain.
//
// What peers need, per rail (RegionDescriptor):
// - key: fi_mr_key under FI_MR_PROV_KEY; otherwise the key ProxyEP requested, unique per domain;
// - base address: the buffer's VA under FI_MR_VIRT_ADDR, else 0 (remote addresses are offsets
//   from the region start).
// CUDA memory goes through FI_HMEM (fi_mr_regattr with iface FI_HMEM_CUDA and the device that
// owns the pointer) and exists only in builds with PROXYEP_HAVE_CUDA.
#pragma once

#include "fabric/fabric.hpp"
#include "fabric/rail.hpp"

#include <memory>
#include <vector>

namespace proxyep::fabric {

// Registers [data, data + size) on every rail. Throws proxyep::Error("fabric.register").
std::unique_ptr<MemoryRegion> register_region(const std::vector<Rail*>& rails, void* data,
                                              size_t size, MemoryKind kind);

}  // namespace proxyep::fabric
