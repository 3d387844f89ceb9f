#include "proxy/engine/region_exchange.hpp"

#include <fmt/format.h>

namespace proxyep::proxy {

void share_region(control::Bootstrap& bootstrap, RegionTable& table, uint32_t id,
                  const fabric::MemoryRegion& region, std::string_view phase) {
  (void)share_optional_region(bootstrap, table, id, &region, phase);
}

std::vector<bool> share_optional_region(control::Bootstrap& bootstrap, RegionTable& table,
                                        uint32_t id, const fabric::MemoryRegion* region,
                                        std::string_view phase) {
  // A rank without the region sends nothing (a descriptor is never empty).
  auto blobs =
      bootstrap.allgather(region != nullptr ? region->descriptor().serialize() : fabric::Bytes{},
                          fmt::format("{}(region {})", phase, id));
  if (region != nullptr) table.add_local(id, *region);
  std::vector<bool> has(blobs.size(), false);
  for (int rank = 0; rank < static_cast<int>(blobs.size()); ++rank) {
    const auto& blob = blobs[static_cast<size_t>(rank)];
    if (blob.empty()) continue;
    table.add_remote(rank, id, fabric::RegionDescriptor::deserialize(blob));
    has[static_cast<size_t>(rank)] = true;
  }
  return has;
}

}  // namespace proxyep::proxy
