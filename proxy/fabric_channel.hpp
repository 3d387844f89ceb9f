// FabricChannel: the PeerChannel to a rank on another node. Every write is a transfer descriptor
// pushed into the session's ring; a proxy thread posts it as an RMA write with a 32-bit
// immediate (control/imm_layout.hpp) from this rank's staging area into the peer's arena. Only
// the receiver's completion of that immediate proves the bytes landed (EFA completes writes in
// any order), so:
//  - a record of call k: one write with counter immediate (epoch k, key = sender), expected once;
//  - eager bytes of call k: one write with counter immediate (epoch k, key = R + sender);
//  - a release of call k: a signal (no bytes) with counter immediate (epoch k + 1, key =
//    2R + receiver), expected once by the sender of call k before it writes call k + 2;
//  - chunk j of a stream: one write with stream immediate (stream = sender, 16-bit sequence
//    numbered across calls); the receiver's SequenceWindow turns completions in any order into a
//    landed prefix, and it returns credits (credit immediates, stream = receiver) to the sender's
//    SenderCredits, which keep the sender within the receiver's window;
//  - a chunk that is a run of the caller's own memory (a combine's rows without weights) may be
//    written straight from there, with the stream immediate, when the provider reads memory
//    nobody registered (FabricLink::from_caller()); the caller's memory must then outlive the
//    write (the call's quiet);
//  - with a landing region, a chunk whose token bytes go straight into the receiver's recv_x:
//    first those bytes with counter immediate (epoch k, key = 3R + sender; the receiver expects
//    one per chunk), then the rest of the chunk to its slot with the stream immediate. The two
//    may land in either order: the slot's immediate says the chunk's rest arrived, the counter
//    that every token byte did.
// A staging slot is rewritten only after the write that read it has completed locally: the
// channel remembers the ring position of that write and asks the engine's retired prefix.
// During a device call the writes may go through a second ring that the device's stream pushes
// into (device_route.hpp; FabricLink::set_route): positions then name their ring, and the last
// writes of a call are remembered per ring (FabricLink::LastWrites), since each ring retires its
// own prefix. Where the session has a device staging area (FI_HMEM: device memory the NIC
// reads), such a call's chunks are packed there and written from there, slot for slot as in the
// staging area (FabricLink::chunk_slot / post_chunk); records and eager bytes stay in host
// staging. Where the peer registered its device arena (FI_HMEM, device_arenas.hpp), such a call
// writes its eager bytes and chunks into that arena (FabricLink::kDeviceArenaRegion) instead,
// and the record's word carries kDeviceRowsBit, so the receiver reads them there.
// Credits are sent only while the sender still needs them: the peer's record of the next call
// proves it consumed the rest, so no write ever targets a rank that may already have left.
#pragma once

#include "control/counter_bank.hpp"
#include "control/sequence_window.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/device_arenas.hpp"
#include "proxy/device_route.hpp"
#include "proxy/peer_channel.hpp"
#include "proxy/proxy_engine.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace proxyep::proxy {

// What the fabric channels of one session share: the staging area they pack into, the ring they
// post through (one producer: the session's protocol thread), the device route that replaces it
// during a device call, and the counter bank that counts records and eager bytes.
class FabricLink {
 public:
  // A position with this bit names a write of the device route's ring.
  static constexpr uint64_t kDeviceRing = uint64_t{1} << 62;
  static constexpr uint64_t kNeverPosted = ~uint64_t{0};
  // The last write of each ring that read some staging (kNeverPosted: none yet).
  struct LastWrites {
    uint64_t host = kNeverPosted, device = kNeverPosted;
  };

  static constexpr uint32_t kArenaRegion = 0;    // every rank's arena, remote target
  static constexpr uint32_t kStagingRegion = 1;  // this rank's staging, local source
  static constexpr uint32_t kLandingRegion = 2;  // every rank's landing region, remote target
  // This process's address space, unregistered (RegionTable::add_local_address_space): a
  // local source only, and only when from_caller().
  static constexpr uint32_t kCallerMemory = 3;
  // This rank's device staging (set_device_staging), local source.
  static constexpr uint32_t kDeviceStagingRegion = 4;
  // The device arenas of the ranks that registered theirs (device_arenas.hpp, FI_HMEM), remote
  // target of a device call's eager bytes and chunks.
  static constexpr uint32_t kDeviceArenaRegion = 5;

  // Whoever drains the ring (this process's proxy engine, or the node daemon) throws
  // proxyep::Error(phase) from it once it has failed; a push that finds the ring full asks it
  // between short waits, so a dead proxy fails the push at once rather than at the deadline.
  using CheckDrain = std::function<void(std::string_view phase)>;
  // `ring`: the ring `producer` pushes into; its header's retired prefix says which writes
  // completed (gpu_side/ring_layout.hpp). `from_caller`: the proxy's region table has
  // kCallerMemory.
  FabricLink(gpu_side::Ring ring, gpu_side::RingProducer& producer, std::byte* staging,
             control::CounterBank& counters, std::chrono::milliseconds timeout, bool from_caller,
             CheckDrain check_drain);

  // Posts `length` bytes at `staging_offset` to `arena_offset` of `destination`'s arena,
  // carrying `imm`; with length 0 only the immediate (a signal). Returns the write's ring
  // position.
  uint64_t post(int destination, uint64_t staging_offset, uint64_t arena_offset, uint64_t length,
                uint64_t call, uint32_t imm, std::string_view phase) {
    return post_to(kArenaRegion, destination, staging_offset, arena_offset, length, call, imm,
                   phase);
  }
  // The same into `remote_region` of `destination`.
  uint64_t post_to(uint32_t remote_region, int destination, uint64_t staging_offset,
                   uint64_t remote_offset, uint64_t length, uint64_t call, uint32_t imm,
                   std::string_view phase) {
    return post_from(kStagingRegion, staging_offset, remote_region, destination, remote_offset,
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
  // (which starts at `data_base` of the staging area), registered as kDeviceStagingRegion.
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
    return post_from(kDeviceStagingRegion, staging_offset - data_base_, remote_region, destination,
                     remote_offset, length, call, imm, phase);
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

class FabricChannel final : public PeerChannel {
 public:
  // `landing`: every rank registered its landing region (FabricLink::kLandingRegion).
  // `device_arenas`: this rank's (none: device calls' rows land in host arenas), and
  // `peer_device_arena`: the peer registered its device arena (FabricLink::kDeviceArenaRegion),
  // where this rank's device calls then write their eager bytes and chunks, the record's word
  // carrying kDeviceRowsBit (GPUDirect RDMA into the receiver's GPU).
  FabricChannel(int peer, const ArenaLayout& layout, std::byte* local_arena, FabricLink& link,
                bool landing, DeviceArenas* device_arenas = nullptr,
                bool peer_device_arena = false);

  // The receiving window and the sending credits, for the session's signal router.
  control::SequenceWindow& window() { return *window_; }
  control::SenderCredits& credits() { return *credits_; }

  PeerPath path() const override { return PeerPath::fabric; }
  bool background() const override { return true; }
  SlotGeometry slots() const override { return layout().remote_slots(); }

  std::span<std::byte> record_buffer(uint64_t call) override;
  void send_record(uint64_t call, uint64_t bytes, std::string_view phase) override;
  void expect_record(uint64_t call, std::string_view phase) override;
  bool record_arrived(uint64_t call) const override;

  std::byte* eager_buffer(uint64_t call) override;
  void send_eager(uint64_t call, uint64_t bytes, std::string_view phase) override;
  void expect_eager(uint64_t call, std::string_view phase) override;
  bool eager_arrived(uint64_t call) const override;
  const std::byte* eager(uint64_t call) const override;

  void begin_streams(uint64_t call, std::string_view phase) override;
  bool can_send(uint64_t chunk, const SlotShape& shape) const override;
  std::byte* send_buffer(uint64_t chunk, const SlotShape& shape) override;
  void send_chunk(uint64_t chunk, const SlotShape& shape, uint64_t bytes,
                  std::string_view phase) override;
  uint64_t landed() const override;
  const std::byte* chunk(uint64_t chunk, const SlotShape& shape) const override;
  void consumed(uint64_t upto, uint64_t chunks, const SlotShape& shape,
                std::string_view phase) override;
  std::string send_progress() const override;
  bool sends_from_caller() const override { return link_.from_caller(); }
  bool posts_in_stream_order() const override { return link_.routed(); }
  void send_chunk_from(uint64_t chunk, const SlotShape& shape, const std::byte* source,
                       uint64_t bytes, std::string_view phase) override;

  bool lands_in_place() const override { return landing_; }
  void send_chunk_in_place(uint64_t chunk, const SlotShape& shape, uint64_t x_bytes,
                           uint64_t landing_offset, uint64_t rest_offset, uint64_t rest_bytes,
                           std::string_view phase) override;
  void expect_in_place(uint64_t call, uint64_t chunks, std::string_view phase) override;
  bool in_place_landed(uint64_t call) const override;

  void release(uint64_t call, std::string_view phase) override;
  void expect_release(uint64_t call, std::string_view phase) override;
  bool released(uint64_t call) const override;
  void forget(uint64_t call) override;

 private:
  static constexpr uint64_t kNeverPosted = FabricLink::kNeverPosted;
  uint32_t eager_key(int sender) const;
  uint32_t release_key(int receiver) const;
  uint32_t landing_key(int sender) const;
  // Takes the next credit (the stream's sequence number) for a chunk about to be posted.
  uint16_t take_credit(std::string_view phase);
  // Records and eager bytes of a call's parity are staged in their own slots: remember the
  // last writes that read them.
  void note_parity_write(uint64_t call, uint64_t position) {
    FabricLink::note(parity_posted_[call % 2], position);
  }
  uint32_t next_staging_slot() const;
  // Whether this rank's call `call` writes its rows into the peer's device arena, and the
  // region its rows go to.
  bool sends_to_device(uint64_t call) const {
    return peer_device_arena_ && device_arenas_->device_call(call);
  }
  uint32_t rows_region(uint64_t call) const {
    return sends_to_device(call) ? FabricLink::kDeviceArenaRegion : FabricLink::kArenaRegion;
  }
  // Where the `bytes` at `offset` the peer sent in `call` are here (DeviceArenas::received).
  const std::byte* rows_here(uint64_t call, uint64_t offset, uint64_t bytes) const;

  FabricLink& link_;
  const bool landing_;
  DeviceArenas* device_arenas_;
  const bool peer_device_arena_;
  std::unique_ptr<control::SequenceWindow> window_;  // chunks from the peer
  std::unique_ptr<control::SenderCredits> credits_;  // chunks to the peer
  // Ring position of the write that last read each staging slot (kNeverPosted before the first).
  std::vector<uint64_t> staged_at_;
  FabricLink::LastWrites parity_posted_[2];
  uint64_t call_ = 0;
  uint64_t consumed_total_ = 0;  // chunks of the peer's stream consumed, over all calls
  uint64_t receive_base_ = 0;    // consumed_total_ when this call's streams began
  uint64_t credited_ = 0;        // this call's chunks whose credit was sent
};

}  // namespace proxyep::proxy
