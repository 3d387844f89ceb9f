// RegionDescriptor: what a peer needs to write into one of our registered regions (a
// MemoryRegion, fabric.hpp): its length and, per rail, the base address to add offsets to (VA
// or 0) and the key. Serialised for the bootstrap's allgather (format in region_descriptor.cpp).
// Not to be confused with gpu_side/descriptor.hpp, the transfer descriptor a ring carries.
#pragma once

#include "fabric/transport.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace proxyep::fabric {

struct RegionDescriptor {
  uint64_t length = 0;
  std::vector<RemoteTarget> rails;

  RemoteTarget target(int rail, uint64_t offset) const;  // throws if offset is out of range
  Bytes serialize() const;
  static RegionDescriptor deserialize(std::span<const uint8_t> bytes);  // throws on malformed
};

}  // namespace proxyep::fabric
