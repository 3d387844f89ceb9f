// Fuzzes RegionDescriptor::deserialize (fabric/region_descriptor.hpp): every rank decodes the
// descriptors its peers contributed to the bootstrap's allgather, and turns them into the
// addresses and keys it writes to. Any input must be rejected with proxyep::Error or decode to a
// descriptor that serialises back to the same bytes; target() must then stay inside it.
#include "common/error.hpp"
#include "fabric/region_descriptor.hpp"
#include "tests/fuzz/fuzz_check.hpp"

#include <cstdint>
#include <span>

using proxyep::fabric::RegionDescriptor;
using proxyep::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  RegionDescriptor descriptor;
  try {
    descriptor = RegionDescriptor::deserialize(input);
  } catch (const proxyep::Error&) {
    return 0;
  }
  check(descriptor.serialize() == proxyep::fabric::Bytes(input.begin(), input.end()),
        "a decoded region descriptor does not serialise back to its bytes");
  const int rails = static_cast<int>(descriptor.rails.size());
  for (int rail : {-1, 0, rails - 1, rails}) {
    for (uint64_t offset :
         {uint64_t{0}, descriptor.length / 2, descriptor.length, descriptor.length + 1}) {
      const bool inside = rail >= 0 && rail < rails && offset <= descriptor.length;
      try {
        const auto target = descriptor.target(rail, offset);
        check(inside, "target() accepted a rail or offset outside the region");
        const auto& base = descriptor.rails[static_cast<size_t>(rail)];
        check(target.address == base.address + offset && target.key == base.key,
              "target() is not the rail's base plus the offset");
      } catch (const proxyep::Error&) {
        check(!inside, "target() refused a rail and offset inside the region");
      }
    }
  }
  return 0;
}
