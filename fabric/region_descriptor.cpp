// RegionDescriptor wire format (little endian, see common/wire.hpp):
//   u32 magic "PXRD" | u16 version | u16 rail count | u64 length | per rail: u64 address, u64 key
// The magic and version make a blob from another build or a misrouted allgather fail loudly
// instead of turning into writes at wrong addresses.
#include "fabric/region_descriptor.hpp"

#include "common/wire.hpp"

namespace proxyep::fabric {
namespace {

constexpr uint32_t kDescriptorMagic = 0x44525850;  // "PXRD" read as little-endian bytes
constexpr uint16_t kDescriptorVersion = 1;
constexpr size_t kMaxRails = 256;  // far above any NIC count; bounds what a bad blob can claim
constexpr const char* kPhase = "fabric.descriptor";

}  // namespace

RemoteTarget RegionDescriptor::target(int rail, uint64_t offset) const {
  require(rail >= 0 && static_cast<size_t>(rail) < rails.size(), kPhase,
          "rail {} out of range (the region is registered on {} rails)", rail, rails.size());
  // offset == length is legal: a zero-length write (a pure signal) at the end of the region.
  require(offset <= length, kPhase, "offset {} is outside the region of {} bytes", offset, length);
  const RemoteTarget& base = rails[static_cast<size_t>(rail)];
  return RemoteTarget{base.address + offset, base.key};
}

Bytes RegionDescriptor::serialize() const {
  require(!rails.empty() && rails.size() <= kMaxRails, kPhase,
          "a descriptor needs 1 to {} rails (has {})", kMaxRails, rails.size());
  Bytes out;
  out.reserve(16 + rails.size() * 16);
  ByteWriter writer(out);
  writer.u32(kDescriptorMagic);
  writer.u16(kDescriptorVersion);
  writer.u16(static_cast<uint16_t>(rails.size()));
  writer.u64(length);
  for (const RemoteTarget& rail : rails) {
    writer.u64(rail.address);
    writer.u64(rail.key);
  }
  return out;
}

RegionDescriptor RegionDescriptor::deserialize(std::span<const uint8_t> bytes) {
  ByteReader reader(bytes, kPhase);
  uint32_t magic = reader.u32("magic");
  require(magic == kDescriptorMagic, kPhase, "not a region descriptor (magic {:#010x})", magic);
  uint16_t version = reader.u16("version");
  require(version == kDescriptorVersion, kPhase, "descriptor version {} (this build reads {})",
          version, kDescriptorVersion);
  uint16_t count = reader.u16("rail count");
  require(count >= 1 && count <= kMaxRails, kPhase, "descriptor claims {} rails", count);
  RegionDescriptor descriptor;
  descriptor.length = reader.u64("length");
  descriptor.rails.resize(count);
  for (RemoteTarget& rail : descriptor.rails) {
    rail.address = reader.u64("rail address");
    rail.key = reader.u64("rail key");
  }
  reader.expect_end("region descriptor");
  return descriptor;
}

}  // namespace proxyep::fabric
