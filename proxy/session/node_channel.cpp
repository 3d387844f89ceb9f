// A node peer's channel: stores into its mapped arena (node_channel.hpp).
#include "proxy/session/node_channel.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstring>

namespace proxyep::proxy {

namespace {

constexpr uint32_t kCountBits = 24;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
static_assert(kMaxStreamChunks <= kCountMask, "a stream's chunk count must fit its word");

uint64_t stream_word(uint64_t call, uint64_t count) {
  return ((call + 1) << kCountBits) | count;
}

// The count a word holds for `call`: 0 when an earlier call wrote it.
uint64_t count_in(uint64_t word, uint64_t call) {
  return (word >> kCountBits) == (((call + 1) << kCountBits) >> kCountBits) ? word & kCountMask : 0;
}

uint64_t load_word(const uint64_t* word) {
  // Pairs with the release store of the rank that wrote it: its stores to the slot (records,
  // published) or its reads of the slot (consumed) happen before what follows the load.
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}

void store_word(uint64_t* word, uint64_t value) {
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_release);
}

}  // namespace

NodeChannel::NodeChannel(int peer, const ArenaLayout& layout, const NodeMemory& node,
                         DeviceArenas& device, ChannelKeys keys)
    : PeerChannel(peer, layout, node.local(), keys.peer),
      node_(node),
      device_(device),
      self_key_(keys.self < 0 ? layout.rank() : keys.self),
      peer_key_(keys.peer < 0 ? peer : keys.peer),
      relay_(self_key_ != layout.rank() || peer_key_ != peer),
      remote_(node.peer(peer)),
      device_remote_(device.peer(peer)) {}

uint64_t* NodeChannel::word_in_peer(uint64_t offset) const {
  return reinterpret_cast<uint64_t*>(remote_ + offset);
}

uint64_t* NodeChannel::word_here(uint64_t offset) const {
  return reinterpret_cast<uint64_t*>(local() + offset);
}

std::span<std::byte> NodeChannel::record_buffer(uint64_t call) {
  return {remote_ + layout().record(call, self_key_) + kRecordWordBytes,
          layout().sizes().record_bytes - kRecordWordBytes};
}

void NodeChannel::send_record(uint64_t call, uint64_t, std::string_view) {
  // The payload (and any eager bytes) were stored first; this release store publishes them.
  store_word(word_in_peer(layout().record(call, self_key_)),
             (call + 1) | (sends_to_device(call) ? kDeviceRowsBit : 0));
}

bool NodeChannel::record_arrived(uint64_t call) const {
  return (load_word(word_here(layout().record(call, peer_key_))) & ~kDeviceRowsBit) == call + 1;
}

const std::byte* NodeChannel::rows_here(uint64_t call, uint64_t offset, uint64_t bytes) const {
  // Read after the peer's own record arrived (its acquire load): the bit is the one it was
  // stored with. A relay lane's rows go where the peer's direct rows of the call go.
  const uint64_t word = load_word(word_here(layout().record(call, peer())));
  return device_.received(call, (word & kDeviceRowsBit) != 0, local(), offset, bytes, peer());
}

std::byte* NodeChannel::eager_buffer(uint64_t call) {
  return rows_in_peer(call) + layout().eager_slot(call, self_key_);
}

void NodeChannel::send_eager(uint64_t call, uint64_t bytes, std::string_view) {
  count_sent(bytes);  // published by the record's release store
  if (sends_to_device(call)) device_.count_send();
}

const std::byte* NodeChannel::eager(uint64_t call) const {
  return rows_here(call, layout().eager_slot(call, peer_key_), layout().sizes().eager_bytes);
}

bool NodeChannel::can_send(uint64_t chunk, const SlotShape& shape) const {
  // Chunk j reuses the slot of chunk j - window: the receiver must have consumed that one.
  return chunk < shape.window ||
         count_in(load_word(word_here(layout().consumed_word(peer_key_))), call_) + shape.window >
             chunk;
}

std::byte* NodeChannel::send_buffer(uint64_t chunk, const SlotShape& shape) {
  return rows_in_peer(call_) + layout().chunk_slot(peer(), self_key_, shape, chunk);
}

void NodeChannel::send_chunk(uint64_t chunk, const SlotShape&, uint64_t bytes, std::string_view) {
  store_word(word_in_peer(layout().published_word(self_key_)), stream_word(call_, chunk + 1));
  count_sent(bytes);
  if (sends_to_device(call_)) device_.count_send();
}

uint64_t NodeChannel::landed() const {
  return count_in(load_word(word_here(layout().published_word(peer_key_))), call_);
}

const std::byte* NodeChannel::chunk(uint64_t chunk, const SlotShape& shape) const {
  return rows_here(call_, layout().chunk_slot(layout().rank(), peer_key_, shape, chunk),
                   shape.slot_bytes);
}

void NodeChannel::consumed(uint64_t upto, uint64_t, const SlotShape&, std::string_view) {
  store_word(word_in_peer(layout().consumed_word(self_key_)), stream_word(call_, upto));
}

std::string NodeChannel::send_progress() const {
  return fmt::format("consumed {}",
                     count_in(load_word(word_here(layout().consumed_word(peer_key_))), call_));
}

void NodeChannel::release(uint64_t call, std::string_view) {
  store_word(word_in_peer(layout().released_word(call, self_key_)), call + 1);
}

bool NodeChannel::released(uint64_t call) const {
  // Words of one parity only grow (call, call + 2, ...), whatever order the hooks ran in.
  return load_word(word_here(layout().released_word(call, peer_key_))) >= call + 1;
}

std::optional<std::string> NodeChannel::departed() const {
  if (node_.peer_alive(peer())) return std::nullopt;
  return fmt::format("rank {} (pid {}) on this node exited", peer(), node_.peer_pid(peer()));
}

std::unique_ptr<PeerChannel> node_memory_channel(int r, const ArenaLayout& layout,
                                                 const NodeMemory& node, DeviceArenas& device) {
  if (layout.on_node(r)) return std::make_unique<NodeChannel>(r, layout, node, device);
  if (layout.fabric_peer(r)) return nullptr;
  // Rank r's rows come from the forwarder under the key r; this rank's go to it under the key of
  // its own counterpart on r's node (arena_layout.hpp).
  const int node_of_r = r / layout.sizes().ranks_per_node;
  return std::make_unique<NodeChannel>(
      layout.forwarder_of(r), layout, node, device,
      ChannelKeys{.self = layout.counterpart(node_of_r), .peer = r});
}

}  // namespace proxyep::proxy
