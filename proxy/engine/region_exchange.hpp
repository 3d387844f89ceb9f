// Region exchange: every rank registers a buffer under the same region id and learns every
// peer's descriptor for it through the bootstrap (one allgather), filling its RegionTable.
#pragma once

#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "proxy/engine/region_table.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

// Collective: every rank calls it with the same `id` and `phase`. Adds `region` as local region
// `id` and each rank's region `id` (this rank's included) as a remote one. Throws
// proxyep::Error from the bootstrap (naming missing ranks) or for a malformed descriptor.
void share_region(control::Bootstrap& bootstrap, RegionTable& table, uint32_t id,
                  const fabric::MemoryRegion& region, std::string_view phase);
// The same where ranks may have no such region (`region` null): only the ranks that have one
// are added. Returns, by rank, whether it has one.
std::vector<bool> share_optional_region(control::Bootstrap& bootstrap, RegionTable& table,
                                        uint32_t id, const fabric::MemoryRegion* region,
                                        std::string_view phase);

}  // namespace proxyep::proxy
