// The session's memory map (arena_layout.hpp).
#include "proxy/session/arena_layout.hpp"

#include "common/error.hpp"

#include <algorithm>
#include <bit>

namespace proxyep::proxy {

namespace {

constexpr const char* kPhase = "buffer";
constexpr uint64_t kWordBytes = 64;  // one stream word per cache line: no false sharing
constexpr uint64_t kPage = 4096;

uint64_t floor_slot(uint64_t bytes) {
  return bytes / kSlotAlignment * kSlotAlignment;
}

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Slots of `slot` bytes that `area` holds, as a power of two (a SequenceWindow's size).
uint32_t window_for(uint64_t area, uint64_t slot) {
  uint64_t slots = std::min<uint64_t>(area / slot, kMaxStreamWindow);
  return slots == 0 ? 0 : static_cast<uint32_t>(std::bit_floor(slots));
}

// The ranks `rank` writes over the fabric (ArenaLayout::fabric_peer).
int fabric_peers(int rank, const SessionSizes& sizes) {
  if (sizes.hierarchical()) return sizes.ranks / sizes.ranks_per_node - 1;
  return sizes.ranks - node_size(rank, sizes.ranks, sizes.ranks_per_node);
}

}  // namespace

int node_size(int rank, int ranks, int ranks_per_node) {
  const int first = rank / ranks_per_node * ranks_per_node;
  return std::min(ranks, first + ranks_per_node) - first;
}

ArenaLayout::ArenaLayout(int rank, const SessionSizes& sizes)
    : rank_(rank), node_(rank / std::max(1, sizes.ranks_per_node)), sizes_(sizes) {
  const auto R = static_cast<uint64_t>(sizes.ranks);
  require(sizes.ranks >= 1 && rank >= 0 && rank < sizes.ranks && sizes.ranks_per_node >= 1, kPhase,
          "rank {} of {} ranks with {} per node is not a valid group", rank, sizes.ranks,
          sizes.ranks_per_node);
  require(sizes.record_bytes > 8 && sizes.record_bytes % kSlotAlignment == 0 &&
              sizes.eager_bytes % kSlotAlignment == 0,
          kPhase, "record slots ({} bytes) and eager slots ({} bytes) must be multiples of {}",
          sizes.record_bytes, sizes.eager_bytes, kSlotAlignment);
  require(sizes.eager_limit <= sizes.eager_bytes, kPhase,
          "the eager limit ({} bytes) exceeds the eager slots ({} bytes)", sizes.eager_limit,
          sizes.eager_bytes);
  words_base_ = 2 * R * sizes.record_bytes;
  eager_base_ = words_base_ + 4 * R * kWordBytes;
  data_base_ = align_up(eager_base_ + 2 * R * sizes.eager_bytes, kPage);
  source_area_ = floor_slot(sizes.data_bytes / std::max<uint64_t>(1, R - 1));
  // Without a data area (a Buffer for low-latency calls only) there are no streams.
  if (!sizes.spans_nodes() || sizes.data_bytes == 0) return;

  // One chunk size for every stream between nodes: it must fit the smallest staging share.
  uint64_t slot = std::min(sizes.chunk_bytes, source_area_);
  for (int r = 0; r < sizes.ranks; ++r)
    slot = std::min(slot, sizes.staging_bytes / static_cast<uint64_t>(fabric_peers(r, sizes)));
  remote_slot_ = floor_slot(slot);
  require(remote_slot_ > 0, kPhase,
          "num_nvl_bytes ({}) or num_rdma_bytes ({}) is too small to give each of the {} ranks "
          "one chunk slot",
          sizes.data_bytes, sizes.staging_bytes, sizes.ranks);
  remote_window_ = window_for(source_area_, remote_slot_);
  staging_data_ = 2 * R * sizes.record_bytes + 2 * R * sizes.eager_bytes;
  stage_area_ = floor_slot(sizes.staging_bytes /
                           static_cast<uint64_t>(std::max(1, fabric_peers(rank, sizes))));
  stage_window_ = window_for(stage_area_, remote_slot_);
}

uint64_t ArenaLayout::record(uint64_t call, int source) const {
  return ((call % 2) * static_cast<uint64_t>(sizes_.ranks) + static_cast<uint64_t>(source)) *
         sizes_.record_bytes;
}

uint64_t ArenaLayout::published_word(int source) const {
  return words_base_ + static_cast<uint64_t>(source) * kWordBytes;
}

uint64_t ArenaLayout::consumed_word(int receiver) const {
  return words_base_ +
         (static_cast<uint64_t>(sizes_.ranks) + static_cast<uint64_t>(receiver)) * kWordBytes;
}

uint64_t ArenaLayout::released_word(uint64_t call, int receiver) const {
  return words_base_ +
         ((2 + call % 2) * static_cast<uint64_t>(sizes_.ranks) + static_cast<uint64_t>(receiver)) *
             kWordBytes;
}

uint64_t ArenaLayout::eager_slot(uint64_t call, int source) const {
  return eager_base_ +
         ((call % 2) * static_cast<uint64_t>(sizes_.ranks) + static_cast<uint64_t>(source)) *
             sizes_.eager_bytes;
}

uint64_t ArenaLayout::chunk_slot(int receiver, int source, const SlotShape& shape,
                                 uint64_t chunk) const {
  // Shares are by source, skipping the receiver itself (it never streams to itself).
  const auto share = static_cast<uint64_t>(source < receiver ? source : source - 1);
  return data_base_ + share * source_area_ + (chunk % shape.window) * shape.slot_bytes;
}

uint64_t ArenaLayout::staging_bytes() const {
  if (!sizes_.spans_nodes()) return 0;
  const uint64_t records_and_eager =
      2 * static_cast<uint64_t>(sizes_.ranks) * (sizes_.record_bytes + sizes_.eager_bytes);
  return sizes_.data_bytes == 0 ? records_and_eager : staging_data_ + sizes_.staging_bytes;
}

uint64_t ArenaLayout::staging_record(uint64_t call, int destination) const {
  return ((call % 2) * static_cast<uint64_t>(sizes_.ranks) + static_cast<uint64_t>(destination)) *
         sizes_.record_bytes;
}

uint64_t ArenaLayout::staging_eager(uint64_t call, int destination) const {
  return 2 * static_cast<uint64_t>(sizes_.ranks) * sizes_.record_bytes +
         ((call % 2) * static_cast<uint64_t>(sizes_.ranks) + static_cast<uint64_t>(destination)) *
             sizes_.eager_bytes;
}

uint64_t ArenaLayout::staging_slot(int destination, uint32_t slot) const {
  // Shares are by fabric peer, in rank order: this node's ranks (consecutive, from `first`)
  // have none; hierarchical, only the counterparts have one, one per other node.
  const int first = node_ * sizes_.ranks_per_node;
  const int node = destination / sizes_.ranks_per_node;
  int share = destination < first
                  ? destination
                  : destination - node_size(rank_, sizes_.ranks, sizes_.ranks_per_node);
  if (hierarchical()) share = node < node_ ? node : node - 1;
  return staging_data_ + static_cast<uint64_t>(share) * stage_area_ +
         static_cast<uint64_t>(slot) * remote_slot_;
}

SlotGeometry ArenaLayout::node_slots() const {
  return {.whole_bytes = source_area_, .slot_bytes = floor_slot(source_area_ / 2), .window = 2};
}

SlotGeometry ArenaLayout::remote_slots() const {
  return {.whole_bytes = 0, .slot_bytes = remote_slot_, .window = remote_window_};
}

}  // namespace proxyep::proxy
