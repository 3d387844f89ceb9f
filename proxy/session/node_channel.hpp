// NodeChannel: the PeerChannel to a rank on this node (or to the rank itself): ordinary stores
// into the peer's arena, mapped here through NodeMemory (the CPU analog of NVLink through CUDA
// IPC). No proxy and no fabric: a write is done when the store is.
//
// Publishing, and the memory order that makes it safe:
//  - a record: the sender stores the payload, then release-stores the record's word (call + 1)
//    in the peer's arena; the receiver's acquire load of that word sees the payload. Eager bytes
//    are stored before the record, so the same release publishes them.
//  - a chunk stream: the sender stores chunk j into its slot in the receiver's arena, then
//    release-stores published[sender] = word(call, j + 1) there; the receiver acquire-loads it,
//    copies chunks out, then release-stores consumed[receiver] = word(call, upto) in the
//    sender's arena (its credit), which the sender acquire-loads before reusing a slot.
// Stream words hold (call + 1) << 24 | count, so a word left by an earlier call reads as 0.
//
// Rows in device memory (device_arenas.hpp): in a call of the device the arenas belong to, the
// eager bytes and chunks go to the peer's device arena when it has one reachable here; the
// record's word then carries kDeviceRowsBit, so the receiver reads them from its own device
// arena. A receiver whose call is a host call (ranks may mix: rank 0's tensors in host memory,
// the others' on their GPUs) cannot read device memory: its device copies the slot into the
// same slot of its host arena, unused in that call, and it reads that. Records and every word
// stay in the host arenas.
//
// A relay lane (hierarchical internode, arena_layout.hpp) is a NodeChannel to a node peer whose
// arena keys are not the two ranks but lane keys: it stores under `keys.self` in the peer's
// arena and reads under `keys.peer` in its own, so that the peer sees the lane as the stream of
// the rank `keys.self` names. Everything else (the mapping, liveness, the device-rows bit of the
// peer's own record) is the real peer's.
#pragma once

#include "proxy/session/device_arenas.hpp"
#include "proxy/session/node_memory.hpp"
#include "proxy/session/peer_channel.hpp"

#include <memory>

namespace proxyep::proxy {

// The arena keys a NodeChannel writes and reads under.
struct ChannelKeys {
  int self = -1;  // this rank's key in the peer's arena (-1: this rank)
  int peer = -1;  // the peer's key in this rank's arena (-1: the peer)
};

class NodeChannel final : public PeerChannel {
 public:
  // `node` maps `peer`'s arena (the rank itself: its own), `device` its device arena if any.
  // `keys`: a relay lane's (the top of this file); by default the two ranks.
  NodeChannel(int peer, const ArenaLayout& layout, const NodeMemory& node, DeviceArenas& device,
              ChannelKeys keys = {});

  PeerPath path() const override { return relay_ ? PeerPath::relay : PeerPath::node; }
  bool background() const override { return false; }
  SlotGeometry slots() const override { return layout().node_slots(); }

  std::span<std::byte> record_buffer(uint64_t call) override;
  void send_record(uint64_t call, uint64_t bytes, std::string_view phase) override;
  void expect_record(uint64_t, std::string_view) override {}
  bool record_arrived(uint64_t call) const override;

  std::byte* eager_buffer(uint64_t call) override;
  void send_eager(uint64_t call, uint64_t bytes, std::string_view phase) override;
  void expect_eager(uint64_t, std::string_view) override {}
  // Stored before the record, whose release store published them.
  bool eager_arrived(uint64_t) const override { return true; }
  const std::byte* eager(uint64_t call) const override;

  void begin_streams(uint64_t call, std::string_view) override { call_ = call; }
  bool can_send(uint64_t chunk, const SlotShape& shape) const override;
  std::byte* send_buffer(uint64_t chunk, const SlotShape& shape) override;
  void send_chunk(uint64_t chunk, const SlotShape& shape, uint64_t bytes,
                  std::string_view phase) override;
  uint64_t landed() const override;
  const std::byte* chunk(uint64_t chunk, const SlotShape& shape) const override;
  void consumed(uint64_t upto, uint64_t chunks, const SlotShape& shape,
                std::string_view phase) override;
  std::string send_progress() const override;

  // The receiver release-stores released[receiver][call % 2] = call + 1 in the sender's arena
  // after its reads; the sender's acquire load orders its next writes after them.
  void release(uint64_t call, std::string_view phase) override;
  void expect_release(uint64_t, std::string_view) override {}
  bool released(uint64_t call) const override;

  std::optional<std::string> departed() const override;

 private:
  uint64_t* word_in_peer(uint64_t offset) const;
  uint64_t* word_here(uint64_t offset) const;
  // Whether this rank's call `call` stores its rows to the peer in the peer's device arena.
  bool sends_to_device(uint64_t call) const {
    return device_.device_call(call) && device_remote_ != nullptr;
  }
  // Where this rank stores its rows of `call` for the peer.
  std::byte* rows_in_peer(uint64_t call) const {
    return sends_to_device(call) ? device_remote_ : remote_;
  }
  // Where the `bytes` at `offset` the peer sent in `call` are here (see above).
  const std::byte* rows_here(uint64_t call, uint64_t offset, uint64_t bytes) const;

  const NodeMemory& node_;
  DeviceArenas& device_;
  int self_key_;              // where this rank's stores go in the peer's arena
  int peer_key_;              // where the peer's stores are in this rank's arena
  bool relay_;                // keys other than the two ranks'
  std::byte* remote_;         // the peer's arena, mapped here
  std::byte* device_remote_;  // the peer's device arena as this rank's device reaches it, or null
  uint64_t call_ = 0;         // the call whose streams run (begin_streams)
};

// The channel to rank `r` that goes through node memory: a NodeChannel for a rank of this node
// (this rank included), a relay lane for a rank of another node that is not a fabric peer
// (hierarchical: through the node peer that forwards for it, ArenaLayout::forwarder_of), and
// null for a fabric peer.
std::unique_ptr<PeerChannel> node_memory_channel(int r, const ArenaLayout& layout,
                                                 const NodeMemory& node, DeviceArenas& device);

}  // namespace proxyep::proxy
