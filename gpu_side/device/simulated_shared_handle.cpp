// The simulated device's shared-memory handle (simulated_shared_handle.hpp), and the NIC's view
// of such memory, which needs nothing of a device (SimulatedDevice::open_for_nic).
#include "gpu_side/device/simulated_shared_handle.hpp"

#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "common/wire.hpp"
#include "gpu_side/device/simulated_device.hpp"

#include <memory>
#include <string>

namespace proxyep::gpu_side::device {

namespace {

constexpr uint32_t kMagic = 0x44535850;  // "PXSD" read as little-endian bytes
constexpr uint16_t kVersion = 1;
constexpr uint16_t kNicReads = 1;

}  // namespace

std::vector<uint8_t> encode_shared_handle(const SimulatedSharedHandle& handle) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(handle.nic_reads ? kNicReads : 0);
  w.u64(handle.pid);
  w.u64(handle.fd);
  w.u64(handle.bytes);
  return out;
}

SimulatedSharedHandle read_shared_handle(std::span<const uint8_t> handle, uint64_t bytes,
                                         std::string_view what, std::string_view phase) {
  ByteReader r(handle, std::string(phase));
  // A handle too short to hold the fields fails in the reader, naming the field.
  require(r.u32("magic") == kMagic && r.u16("version") == kVersion, phase,
          "{}: the handle is not a simulated device's", what);
  SimulatedSharedHandle h;
  h.nic_reads = (r.u16("flags") & kNicReads) != 0;
  h.pid = r.u64("pid");
  h.fd = r.u64("fd");
  h.bytes = r.u64("bytes");
  r.expect_end("shared memory handle");
  require(h.bytes >= bytes, phase, "{}: the owner shared {} bytes, {} are needed", what, h.bytes,
          bytes);
  return h;
}

NicMemory SimulatedDevice::open_for_nic(std::span<const uint8_t> handle, int fd, uint64_t bytes,
                                        std::string_view phase) {
  const SimulatedSharedHandle h = read_shared_handle(handle, bytes, "open_for_nic", phase);
  require(h.nic_reads, phase,
          "open_for_nic: the owner's device does not let a NIC reach this memory");
  require(fd >= 0, phase, "open_for_nic: no descriptor came with the simulated device's memory");
  auto file = std::make_shared<HostMemory>(HostMemory::map_fd(fd));
  require(file->size() >= bytes, phase,
          "open_for_nic: the descriptor holds {} bytes, {} are needed", file->size(), bytes);
  auto* memory = static_cast<std::byte*>(file->host());
  // The mapping goes with the last owner of `memory`.
  return {.memory = std::shared_ptr<std::byte[]>(memory, [file](std::byte*) {}),
          .bytes = bytes,
          .registers_as_host = true};
}

}  // namespace proxyep::gpu_side::device
