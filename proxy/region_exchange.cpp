#include "proxy/region_exchange.hpp"

#include <fmt/format.h>

namespace proxyep::proxy {

void share_region(control::Bootstrap& bootstrap, RegionTable& table, uint32_t id,
                  const fabric::MemoryRegion& region, std::string_view phase) {
  auto blobs =
      bootstrap.allgather(region.descriptor().serialize(), fmt::format("{}(region {})", phase, id));
  table.add_local(id, region);
  for (int rank = 0; rank < static_cast<int>(blobs.size()); ++rank)
    table.add_remote(rank, id,
                     fabric::RegionDescriptor::deserialize(blobs[static_cast<size_t>(rank)]));
}

}  // namespace proxyep::proxy
