// FabricPoster: how a session's writes to other nodes leave: each is a transfer descriptor
// pushed into the session's descriptor ring (or, during a device call, handed to the device
// route's ring: device_route.hpp), which a proxy thread posts as an RMA write with immediate
// from a local region (staging, device staging, the caller's memory) into a peer's region
// (arena, landing, device arena). It numbers the writes by ring position, so that a staging
// slot is reused only once the write that read it has retired. Every FabricChannel of the
// session (one per peer on another node: fabric_channel.hpp) posts through the one poster; the
// poster knows no peer's protocol.
#pragma once

#include "control/counter_bank.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/region_ids.hpp"
#include "proxy/session/device_route.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace proxyep::proxy {

// What the fabric channels of one session share: the staging area they pack into, the ring they
// post through (one producer: the session's protocol thread), the device route that replaces it
// during a device call, and the counter bank that counts records and eager bytes.
class FabricPoster {
 public:
  // A position with this bit names a write of the device route's ring.
  static constexpr uint64_t kDeviceRing = uint64_t{1} << 62;
  static constexpr uint64_t kNeverPosted = ~uint64_t{0};
  // The last write of each ring that read some staging (kNeverPosted: none yet).
  struct LastWrites {
    uint64_t host = kNeverPosted, device = kNeverPosted;
  };

  // Whoever drains the ring (this process's proxy engine, or the node daemon) throws
  // proxyep::Error(phase) from it once it has failed; a push that finds the ring full asks it
  // between short waits, so a dead proxy fails the push at once rather than at the deadline.
  using CheckDrain = std::function<void(std::string_view phase)>;
  // `ring`: the ring `producer` pushes into; its header's retired prefix says which writes
  // completed (gpu_side/ring_layout.hpp). `from_caller`: the proxy's region table has
  // region::kCallerMemory.
  FabricPoster(gpu_side::Ring ring, gpu_side::RingProducer& producer, std::byte* staging,
               control::CounterBank& counters, std::chrono::milliseconds timeout, bool from_caller,
               CheckDrain check_drain);

  // Posts `length` bytes at `staging_offset` to `arena_offset` of `destination`'s arena,
  // carrying `imm`; with length 0 only the immediate (a signal). Returns the write's ring
  // position.
  uint64_t post(int destination, uint64_t staging_offset, uint64_t arena_offset, uint64_t length,
                uint64_t call, uint32_t imm, std::string_view phase) {
    return post_to(region::kArena, destination, staging_offset, arena_offset, length, call, imm,
                   phase);
  }
  // The same into `remote_region` of `destination`.
  uint64_t post_to(uint32_t remote_region, int destination, uint64_t staging_offset,
                   uint64_t remote_offset, uint64_t length, uint64_t call, uint32_t imm,
                   std::string_view phase) {
    return post_from(region::kStaging, staging_offset, remote_region, destination, remote_offset,
                     length, call, imm, phase);
  }
  // `length` bytes at `source` in the caller's memory to `remote_offset` of `destination`'s
  // `remote_region` (its arena or device arena); only when from_caller().
  uint64_t post_from_caller(const std::byte* source, uint32_t remote_region, int destination,
                            uint64_t remote_offset, uint64_t length, uint64_t call, uint32_t imm,
                            std::string_view phase);
  // Whether writes may read the caller's memory as it is: the provider needs no registration
  // of a write's source (no FI_MR_LOCAL) and ep.send_from_x is not off.
  bool from_caller() const { return from_caller_; }
  // Has the write at `position` (as post() returned it) completed locally (its staging is free)?
  bool retired(uint64_t position) const {
    if (position == kNeverPosted) return true;
    if (position & kDeviceRing) return device_ring_->retired(position & ~kDeviceRing);
    return gpu_side::atomic(ring_.header().consumer.retired).load(std::memory_order_acquire) >
           position;
  }
  // Remembers `position` as the last write of its ring in `writes`; have they all completed?
  static void note(LastWrites& writes, uint64_t position) {
    (position & kDeviceRing ? writes.device : writes.host) = position;
  }
  bool retired(const LastWrites& writes) const {
    return retired(writes.host) && retired(writes.device);
  }
  // From set_route(route) until set_route(nullptr), every post goes to `route` (the device's
  // stream pushes it in order after the work queued before it); the route must outlive the
  // link's use of its positions.
  void set_route(DeviceRoute* route) {
    route_ = route;
    if (route != nullptr) device_ring_ = route;
  }
  bool routed() const { return route_ != nullptr; }
  // FI_HMEM: device memory of `device` that the NIC reads, as large as the staging data area
  // (which starts at `data_base` of the staging area), registered as region::kDeviceStaging.
  // While a device call of that device posts through the route, its chunks are packed there
  // and written from there (GPUDirect RDMA); otherwise they bounce through the staging area.
  void set_device_staging(const gpu_side::device::DeviceRuntime& device, std::byte* staging,
                          uint64_t data_base) {
    staging_device_ = &device;
    device_staging_ = staging;
    data_base_ = data_base;
  }
  // Where the chunk slot at `staging_offset` (inside the staging data area) is packed now.
  std::byte* chunk_slot(uint64_t staging_offset) const {
    return chunks_on_device() ? device_staging_ + (staging_offset - data_base_)
                              : staging_ + staging_offset;
  }
  // post_to() of the chunk slot at `staging_offset`, from where chunk_slot() packed it.
  uint64_t post_chunk(uint32_t remote_region, int destination, uint64_t staging_offset,
                      uint64_t remote_offset, uint64_t length, uint64_t call, uint32_t imm,
                      std::string_view phase) {
    if (!chunks_on_device())
      return post_to(remote_region, destination, staging_offset, remote_offset, length, call, imm,
                     phase);
    ++device_chunks_;
    return post_from(region::kDeviceStaging, staging_offset - data_base_, remote_region,
                     destination, remote_offset, length, call, imm, phase);
  }
  // Chunks written straight from device staging so far.
  uint64_t device_chunks() const { return device_chunks_; }
  // Descriptors pushed into the session's own ring so far (the ring position of the next one).
  uint64_t pushed() const { return pushed_; }

  std::byte* staging() const { return staging_; }
  control::CounterBank& counters() const { return counters_; }

 private:
  uint64_t post_from(uint32_t local_region, uint64_t local_offset, uint32_t remote_region,
                     int destination, uint64_t remote_offset, uint64_t length, uint64_t call,
                     uint32_t imm, std::string_view phase);

  gpu_side::Ring ring_;
  gpu_side::RingProducer& producer_;
  std::byte* staging_;
  control::CounterBank& counters_;
  std::chrono::milliseconds timeout_;
  bool from_caller_;
  CheckDrain check_drain_;
  uint64_t pushed_ = 0;           // descriptors pushed so far = the ring position of the next one
  DeviceRoute* route_ = nullptr;  // while a device call posts
  const DeviceRoute* device_ring_ = nullptr;  // the route that numbered kDeviceRing positions
  bool chunks_on_device() const {
    return route_ != nullptr && device_staging_ != nullptr && &route_->device() == staging_device_;
  }
  const gpu_side::device::DeviceRuntime* staging_device_ = nullptr;
  std::byte* device_staging_ = nullptr;
  uint64_t data_base_ = 0;
  uint64_t device_chunks_ = 0;
};

}  // namespace proxyep::proxy
