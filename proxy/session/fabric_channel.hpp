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
//    nobody registered (FabricPoster::from_caller()); the caller's memory must then outlive the
//    write (the call's quiet);
//  - with a landing region, a chunk whose token bytes go straight into the receiver's recv_x:
//    first those bytes with counter immediate (epoch k, key = 3R + sender; the receiver expects
//    one per chunk), then the rest of the chunk to its slot with the stream immediate. The two
//    may land in either order: the slot's immediate says the chunk's rest arrived, the counter
//    that every token byte did.
// A staging slot is rewritten only after the write that read it has completed locally: the
// channel remembers the ring position of that write and asks the engine's retired prefix.
// During a device call the writes may go through a second ring that the device's stream pushes
// into (device_route.hpp; FabricPoster::set_route): positions then name their ring, and the last
// writes of a call are remembered per ring (FabricPoster::LastWrites), since each ring retires its
// own prefix. Where the session has a device staging area (FI_HMEM: device memory the NIC
// reads), such a call's chunks are packed there and written from there, slot for slot as in the
// staging area (FabricPoster::chunk_slot / post_chunk); records and eager bytes stay in host
// staging. Where the peer registered its device arena (FI_HMEM, device_arenas.hpp), such a call
// writes its eager bytes and chunks into that arena (region::kDeviceArena) instead,
// and the record's word carries kDeviceRowsBit, so the receiver reads them there.
// Credits are sent only while the sender still needs them: the peer's record of the next call
// proves it consumed the rest, so no write ever targets a rank that may already have left.
#pragma once

#include "control/counter_bank.hpp"
#include "control/sequence_window.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "proxy/session/device_arenas.hpp"
#include "proxy/session/fabric_poster.hpp"
#include "proxy/session/peer_channel.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace proxyep::proxy {

class FabricChannel final : public PeerChannel {
 public:
  // `landing`: every rank registered its landing region (region::kLanding).
  // `device_arenas`: this rank's (none: device calls' rows land in host arenas), and
  // `peer_device_arena`: the peer registered its device arena (region::kDeviceArena),
  // where this rank's device calls then write their eager bytes and chunks, the record's word
  // carrying kDeviceRowsBit (GPUDirect RDMA into the receiver's GPU).
  FabricChannel(int peer, const ArenaLayout& layout, std::byte* local_arena, FabricPoster& poster,
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
  bool sends_from_caller() const override { return poster_.from_caller(); }
  bool posts_in_stream_order() const override { return poster_.routed(); }
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
  static constexpr uint64_t kNeverPosted = FabricPoster::kNeverPosted;
  uint32_t eager_key(int sender) const;
  uint32_t release_key(int receiver) const;
  uint32_t landing_key(int sender) const;
  // Takes the next credit (the stream's sequence number) for a chunk about to be posted.
  uint16_t take_credit(std::string_view phase);
  // Records and eager bytes of a call's parity are staged in their own slots: remember the
  // last writes that read them.
  void note_parity_write(uint64_t call, uint64_t position) {
    FabricPoster::note(parity_posted_[call % 2], position);
  }
  uint32_t next_staging_slot() const;
  // Whether this rank's call `call` writes its rows into the peer's device arena, and the
  // region its rows go to.
  bool sends_to_device(uint64_t call) const {
    return peer_device_arena_ && device_arenas_->device_call(call);
  }
  uint32_t rows_region(uint64_t call) const {
    return sends_to_device(call) ? region::kDeviceArena : region::kArena;
  }
  // Where the `bytes` at `offset` the peer sent in `call` are here (DeviceArenas::received).
  const std::byte* rows_here(uint64_t call, uint64_t offset, uint64_t bytes) const;

  FabricPoster& poster_;
  const bool landing_;
  DeviceArenas* device_arenas_;
  const bool peer_device_arena_;
  std::unique_ptr<control::SequenceWindow> window_;  // chunks from the peer
  std::unique_ptr<control::SenderCredits> credits_;  // chunks to the peer
  // Ring position of the write that last read each staging slot (kNeverPosted before the first).
  std::vector<uint64_t> staged_at_;
  FabricPoster::LastWrites parity_posted_[2];
  uint64_t call_ = 0;
  uint64_t consumed_total_ = 0;  // chunks of the peer's stream consumed, over all calls
  uint64_t receive_base_ = 0;    // consumed_total_ when this call's streams began
  uint64_t credited_ = 0;        // this call's chunks whose credit was sent
};

}  // namespace proxyep::proxy
