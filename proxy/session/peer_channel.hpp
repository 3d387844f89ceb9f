// PeerChannel: everything one rank does to move a call's bytes to and from one peer. Protocol
// code (integrations/) talks to every peer through this interface and never asks where the peer
// lives; the session (session.hpp) picks the implementation:
//   NodeChannel    a peer on this node (and the rank itself): stores into the peer's mapped
//                  arena, published and consumed words (node_channel.hpp);
//   FabricChannel  a peer on another node: descriptors through the ring, RMA writes with
//                  immediates, sequence windows and credits (fabric_channel.hpp);
//   relay lane     hierarchical internode: a NodeChannel to the node peer that forwards for a
//                  rank of another node, under that rank's key (node_channel.hpp).
//
// What travels, per call k (every rank numbers its calls alike; the layout is arena_layout.hpp):
//  - a record: this rank's announcement of call k to the peer (its content is the protocol's).
//    The sender writes it into record_buffer(k) and publishes it; the receiver learns of it with
//    record_arrived(k) and reads it with record(k).
//  - eager bytes: a small payload sent before the record into the peer's eager slot [k % 2]
//    without any credit (the protocol proves the slot is free: see integrations/normal). Valid
//    to read once the record of k arrived and eager_arrived(k) holds.
//  - a chunk stream: chunks 0, 1, ... in the peer's slots (SlotShape), chunk j written only once
//    can_send(j) says its slot is free; the receiver sees landed() chunks and hands slots back
//    with consumed().
//  - a release: a protocol whose receive phase may run after its next call was sent (low-latency
//    mode's hooks) cannot prove by the call sequence alone that a peer finished reading the
//    slots of call k before this rank writes call k + 2 into them; the peer says so with
//    release(k), and the sender waits for released(k).
// Receiving always reads this rank's own memory: its arena, or (a node peer's rows in a device
// call) its device arena.
//
// Threads: one caller (the rank's protocol thread). Calls that send throw proxyep::Error naming
// `phase` when the transport fails or stays full past the session's deadline.
#pragma once

#include "common/error.hpp"
#include "proxy/session/arena_layout.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace proxyep::proxy {

// Where the peer lives: for statistics and messages only. relay: the channel to a rank of
// another node whose rows pass through a node peer (hierarchical internode).
enum class PeerPath { node, fabric, relay };
inline const char* path_name(PeerPath path) {
  return path == PeerPath::node ? "node" : path == PeerPath::fabric ? "fabric" : "relay";
}

// Most chunks a stream carries in one call (node peers count them in 24-bit words).
inline constexpr uint64_t kMaxStreamChunks = (uint64_t{1} << 24) - 1;
// A record slot starts with the word that publishes it (call + 1, stored last on the node
// path); the payload follows.
inline constexpr uint64_t kRecordWordBytes = 8;
// Set in that word when the call's eager bytes and chunks to the peer went to its device arena
// (device_arenas.hpp), so the receiver reads them there.
inline constexpr uint64_t kDeviceRowsBit = uint64_t{1} << 63;

class PeerChannel {
 public:
  // `peer_key`: where the peer's records and rows are in this rank's arena (-1: under `peer`;
  // a relay lane's is another rank's).
  PeerChannel(int peer, const ArenaLayout& layout, std::byte* local_arena, int peer_key = -1)
      : peer_(peer),
        peer_key_(peer_key < 0 ? peer : peer_key),
        layout_(layout),
        local_(local_arena) {}
  virtual ~PeerChannel() = default;
  PeerChannel(const PeerChannel&) = delete;
  PeerChannel& operator=(const PeerChannel&) = delete;

  int peer() const { return peer_; }
  virtual PeerPath path() const = 0;
  // Writes to this peer complete in the background (start them before the ones that do not).
  virtual bool background() const = 0;
  // How this peer's streams may use their slots.
  virtual SlotGeometry slots() const = 0;
  // Payload bytes sent to the peer so far (eager and chunks), for Buffer::stats() and the
  // metrics endpoint (any thread).
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }

  // ---- records ----
  // Where this rank writes its record of `call` for the peer (the payload; the channel adds
  // what publishes it).
  virtual std::span<std::byte> record_buffer(uint64_t call) = 0;
  // Publishes the first `bytes` of record_buffer(call) to the peer.
  virtual void send_record(uint64_t call, uint64_t bytes, std::string_view phase) = 0;
  // Before waiting for the peer's record of `call`.
  virtual void expect_record(uint64_t call, std::string_view phase) = 0;
  virtual bool record_arrived(uint64_t call) const = 0;
  // The peer's record of `call`, once it arrived.
  std::span<const std::byte> record(uint64_t call) const {
    return {local_ + layout_.record(call, peer_key_) + kRecordWordBytes,
            layout_.sizes().record_bytes - kRecordWordBytes};
  }

  // ---- eager bytes ----
  virtual std::byte* eager_buffer(uint64_t call) = 0;
  // Sends the first `bytes` of eager_buffer(call); before send_record(call) (which may be what
  // publishes them).
  virtual void send_eager(uint64_t call, uint64_t bytes, std::string_view phase) = 0;
  // Once the peer's record of `call` announced eager bytes.
  virtual void expect_eager(uint64_t call, std::string_view phase) = 0;
  virtual bool eager_arrived(uint64_t call) const = 0;
  // Where the peer's eager bytes of `call` are: this rank's arena, or for a node peer whose call
  // stored them in this rank's device arena, there (node_channel.hpp).
  virtual const std::byte* eager(uint64_t call) const {
    return local_ + layout_.eager_slot(call, peer_key_);
  }

  // ---- chunk streams of one call ----
  // Before the first chunk of `call` either way (after the peer's record of `call` arrived).
  virtual void begin_streams(uint64_t call, std::string_view phase) = 0;
  virtual bool can_send(uint64_t chunk, const SlotShape& shape) const = 0;
  // Where chunk `chunk` is written before send_chunk().
  virtual std::byte* send_buffer(uint64_t chunk, const SlotShape& shape) = 0;
  virtual void send_chunk(uint64_t chunk, const SlotShape& shape, uint64_t bytes,
                          std::string_view phase) = 0;
  // Chunks of this call that have landed here (a prefix; may exceed the stream's chunks only
  // if the peer misbehaves: the caller clamps).
  virtual uint64_t landed() const = 0;
  // Where chunk `chunk` of the current call's stream from the peer is (as eager()).
  virtual const std::byte* chunk(uint64_t chunk, const SlotShape& shape) const {
    return local_ + layout_.chunk_slot(layout_.rank(), peer_key_, shape, chunk);
  }
  // Chunks [0, upto) of a stream of `chunks` chunks were copied out: their slots are free.
  virtual void consumed(uint64_t upto, uint64_t chunks, const SlotShape& shape,
                        std::string_view phase) = 0;
  // Where the sending side stands (credits), for timeout messages.
  virtual std::string send_progress() const = 0;

  // Whether this channel's writes are handed on by the device backend's stream, after the work
  // queued on it before (Session::open_device_route): then a write whose source a kernel fills may
  // be posted at once, without waiting for the kernel.
  virtual bool posts_in_stream_order() const { return false; }

  // ---- chunks written straight from the caller's memory (fabric peers) ----
  // Whether send_chunk_from() may be used: the transport reads the caller's memory as it is.
  virtual bool sends_from_caller() const { return false; }
  // Chunk `chunk` is `bytes` of the caller's memory at `source`, as it is (no send_buffer()):
  // written from there, without a copy. The memory must stay unchanged until the session's
  // quiet() returned.
  virtual void send_chunk_from(uint64_t chunk, const SlotShape& shape, const std::byte* source,
                               uint64_t bytes, std::string_view phase) {
    (void)chunk, (void)shape, (void)source, (void)bytes;
    fail(std::string(phase), "the channel to rank {} cannot write from the caller's memory", peer_);
  }

  // ---- rows stored in the receiver's landing region (fabric peers) ----
  // A node peer's rows are stored there directly; a fabric peer's chunk goes as two writes: its
  // first `x_bytes` to `landing_offset` of the peer's landing region, the `rest_bytes` at
  // `rest_offset` of the chunk to that offset of its slot (which, by landing, says the chunk
  // arrived). Only channels with a landing region do this.
  virtual bool lands_in_place() const { return false; }
  virtual void send_chunk_in_place(uint64_t chunk, const SlotShape& shape, uint64_t x_bytes,
                                   uint64_t landing_offset, uint64_t rest_offset,
                                   uint64_t rest_bytes, std::string_view phase) {
    (void)chunk, (void)shape, (void)x_bytes, (void)landing_offset, (void)rest_offset,
        (void)rest_bytes;
    fail(std::string(phase), "the channel to rank {} has no landing region to write", peer_);
  }
  // The receiver of such a stream: `chunks` of them in `call` (before waiting for them).
  virtual void expect_in_place(uint64_t call, uint64_t chunks, std::string_view phase) {
    (void)call, (void)chunks, (void)phase;
  }
  // Every landing-region write of `call` the receiver expects has landed.
  virtual bool in_place_landed(uint64_t call) const {
    (void)call;
    return true;
  }

  // ---- slot release ----
  // This rank finished reading the peer's record and eager bytes of `call`: the peer may write
  // call + 2 into those slots.
  virtual void release(uint64_t call, std::string_view phase) = 0;
  // Before waiting for released(call).
  virtual void expect_release(uint64_t call, std::string_view phase) = 0;
  // The peer released this rank's slots of `call`, and this rank's own writes of that call's
  // parity have left its staging: call + 2 may be written.
  virtual bool released(uint64_t call) const = 0;

  // ---- a peer given up (rank masking) ----
  // Withdraws what this rank expects from the peer in `call` (its record, its eager bytes, its
  // release of call - 2), so that giving the peer up mid-call leaves nothing behind.
  virtual void forget(uint64_t call) { (void)call; }

  // ---- liveness ----
  // Set once the peer is known to be gone (a node peer's process exited): says so, naming it.
  virtual std::optional<std::string> departed() const { return std::nullopt; }

 protected:
  const ArenaLayout& layout() const { return layout_; }
  std::byte* local() const { return local_; }
  // One writer (the caller's thread): a load and a store, no locked add.
  void count_sent(uint64_t bytes) {
    bytes_sent_.store(bytes_sent_.load(std::memory_order_relaxed) + bytes,
                      std::memory_order_relaxed);
  }

 private:
  int peer_;
  int peer_key_;
  const ArenaLayout& layout_;
  std::byte* local_;
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace proxyep::proxy
