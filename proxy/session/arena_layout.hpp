// ArenaLayout: where everything a session's ranks exchange lives in their shared memory. It is
// the only code that computes a slot's place: the channels (peer_channel.hpp) and the protocols
// above ask it, so sender and receiver can never disagree on an offset.
//
// Every rank computes the same layout from the same agreed sizes (SessionSizes: checked equal on
// every rank when the session opens), so a sender knows where its bytes land in a receiver's
// memory without asking. All offsets are in bytes from the start of the region.
//
// Arena (every rank; node peers map it, other nodes write it as fabric region region::kArena):
//   records    0              2 parities x R sources x record_bytes    call k: [k % 2][source]
//   words      words_base_    R published words, R consumed words,     one per 64-byte line
//                             2 parities x R released words
//   eager      eager_base_    2 parities x R sources x eager_bytes     call k: [k % 2][source]
//   (padding to a page)
//   data       data_base_     R - 1 shares of source_area, by source (the rank itself has none)
// Staging (a rank with peers on other nodes; fabric region region::kStaging, never remote):
//   records    0              2 parities x R destinations x record_bytes  call k: [k % 2][dest]
//   eager      2R records     2 parities x R destinations x eager_bytes
//   data       staging_data_  one share of stage_area per fabric peer (fabric_peer()), in rank
//                             order; stage_window slots of remote_slot bytes each
//
// Hierarchical internode (Internode::hierarchical, on equal nodes): a rank's only fabric peers
// are its counterparts, the ranks with its local index on the other nodes (DeepEP's rule: a
// token crosses to the GPU on the same rail). A row from source s on another node reaches
// destination d through the counterpart of s on d's node, the forwarder, over a relay lane:
// the forwarder's stores into d's arena under the key s (lane_key()), so that at d the lane is
// "the stream from s", in s's share, with s's published and consumed words. Such a key is a
// rank of another node that is not the arena owner's counterpart, which in this mode never
// writes the arena itself: the R - 1 shares and words are all used, none twice, and the arena
// does not grow.
//
// Streams (chunk j of a stream sits in slot j % window of the source's share):
//  - node peers: a stream whose rows fit the share moves as one chunk; a larger one alternates
//    between two half-share slots (node_slots());
//  - other nodes: slots of remote_slot bytes (at most chunk_bytes, so the first writes are on
//    the wire while later rows are still being packed), as many as fit the share, a power of two
//    (a SequenceWindow's), at most kMaxStreamWindow (remote_slots()).
#pragma once

#include <cstdint>
#include <vector>

namespace proxyep::proxy {

// Most chunks of one stream in flight (a power of two, within control::imm::kMaxWindow).
inline constexpr uint32_t kMaxStreamWindow = 1024;
// Every slot and area starts on this boundary (the row arrays inside are 64-byte aligned too).
inline constexpr uint64_t kSlotAlignment = 64;

// How normal mode crosses nodes (ep.internode): to every rank on another node that needs a
// token (per_rank), or once per node through the counterpart there (hierarchical).
enum class Internode : uint32_t { per_rank = 0, hierarchical = 1 };

// The sizes every rank of a session must agree on: together with the rank they fix every offset.
struct SessionSizes {
  int ranks = 1;
  int ranks_per_node = 1;      // nodes hold consecutive ranks; the last may be smaller
  uint64_t record_bytes = 0;   // one record slot (a multiple of kSlotAlignment, > 8)
  uint64_t eager_bytes = 0;    // one eager slot (a multiple of kSlotAlignment; 0 = no eager)
  uint64_t eager_limit = 0;    // streams of at most this many bytes go eagerly (<= eager_bytes)
  uint64_t data_bytes = 0;     // the arena's data area (Buffer's num_nvl_bytes)
  uint64_t staging_bytes = 0;  // the staging data area (num_rdma_bytes; 0 on one node)
  uint64_t chunk_bytes = 0;    // largest chunk between nodes (ep.chunk_bytes)
  Internode internode = Internode::per_rank;

  bool spans_nodes() const { return ranks > ranks_per_node; }
  // Hierarchical internode applies: asked for, across nodes of more than one rank (with one,
  // a node's counterpart is its only rank: per_rank sends the same rows, with its eager rows
  // and landing in place), every node full (ranks_per_node divides ranks; a group with a
  // smaller last node sends per rank, as DeepEP needs full nodes).
  bool hierarchical() const {
    return internode == Internode::hierarchical && spans_nodes() && ranks_per_node > 1 &&
           ranks % ranks_per_node == 0;
  }
  friend bool operator==(const SessionSizes&, const SessionSizes&) = default;
};

// How a stream's chunks may use the receiver's share.
struct SlotGeometry {
  uint64_t whole_bytes = 0;  // a stream that fits this moves as one chunk (0: never)
  uint64_t slot_bytes = 0;   // else: chunks of at most this many bytes...
  uint32_t window = 0;       // ...with at most this many in flight
};

// One stream's use of its slots in one call: slot j % window at slot_bytes * (j % window).
struct SlotShape {
  uint64_t slot_bytes = 0;
  uint32_t window = 1;
};

// Ranks on `rank`'s node.
int node_size(int rank, int ranks, int ranks_per_node);

class ArenaLayout {
 public:
  // Throws proxyep::Error("buffer") when the sizes are malformed or too small to give every
  // stream one slot.
  ArenaLayout(int rank, const SessionSizes& sizes);

  const SessionSizes& sizes() const { return sizes_; }
  int rank() const { return rank_; }
  bool on_node(int peer) const { return peer / sizes_.ranks_per_node == node_; }
  int node() const { return node_; }
  int nodes() const { return (sizes_.ranks + sizes_.ranks_per_node - 1) / sizes_.ranks_per_node; }

  // ---- hierarchical internode (the top of this file) ----
  bool hierarchical() const { return sizes_.hierarchical(); }
  // This rank's counterpart on `node`: the rank with its local index there (itself on its own).
  int counterpart(int node) const {
    return node * sizes_.ranks_per_node + rank_ % sizes_.ranks_per_node;
  }
  // Whether this rank writes `peer`'s memory over the fabric: every rank on another node, or,
  // hierarchical, only the counterparts.
  bool fabric_peer(int peer) const {
    return !on_node(peer) &&
           (!hierarchical() || peer % sizes_.ranks_per_node == rank_ % sizes_.ranks_per_node);
  }
  // The fabric peers this rank opens connections to before the first call: those with a higher
  // rank, so that no pair connects from both sides at once (engine/fabric_connections.hpp).
  std::vector<int> peers_to_probe() const {
    std::vector<int> peers;
    for (int peer = rank_ + 1; peer < sizes_.ranks; ++peer)
      if (fabric_peer(peer)) peers.push_back(peer);
    return peers;
  }
  // The key of the relay lane from `sender` (a rank of this node) to another rank of this node
  // for the rows of `sender`'s counterpart on `node` (another node): where the sender stores
  // them in the receiver's arena, and the receiver its credits in the sender's.
  int lane_key(int sender, int node) const {
    return node * sizes_.ranks_per_node + sender % sizes_.ranks_per_node;
  }
  // The rank that forwards, within this node, the rows of `source` (a rank of another node):
  // source's counterpart here.
  int forwarder_of(int source) const {
    return node_ * sizes_.ranks_per_node + source % sizes_.ranks_per_node;
  }

  // ---- the arena ----
  uint64_t arena_bytes() const { return data_base_ + sizes_.data_bytes; }
  uint64_t record(uint64_t call, int source) const;
  uint64_t published_word(int source) const;   // chunks `source` published into this arena
  uint64_t consumed_word(int receiver) const;  // chunks `receiver` consumed of this arena's owner
  // The last call of parity `call % 2` whose record and eager bytes from this arena's owner
  // `receiver` has finished reading (+ 1): the owner may write call + 2 there.
  uint64_t released_word(uint64_t call, int receiver) const;
  uint64_t eager_slot(uint64_t call, int source) const;
  // Chunk `chunk`'s slot of the stream source -> receiver, in the receiver's arena.
  uint64_t chunk_slot(int receiver, int source, const SlotShape& shape, uint64_t chunk) const;
  uint64_t data_base() const { return data_base_; }
  uint64_t source_area() const { return source_area_; }

  // ---- this rank's staging (only when the session spans nodes) ----
  uint64_t staging_bytes() const;
  uint64_t staging_record(uint64_t call, int destination) const;
  uint64_t staging_eager(uint64_t call, int destination) const;
  // `destination` is a fabric peer (fabric_peer()).
  uint64_t staging_slot(int destination, uint32_t slot) const;
  uint32_t stage_window() const { return stage_window_; }
  // Where the staging data area starts (it holds sizes().staging_bytes bytes, when the session
  // spans nodes and has a data area).
  uint64_t staging_data_base() const { return staging_data_; }

  // ---- stream geometry ----
  SlotGeometry node_slots() const;
  SlotGeometry remote_slots() const;

 private:
  int rank_;
  int node_;
  SessionSizes sizes_;
  uint64_t words_base_ = 0, eager_base_ = 0, data_base_ = 0;
  uint64_t source_area_ = 0;    // bytes of a receiver's data area per source
  uint64_t remote_slot_ = 0;    // bytes of one chunk between nodes (0: one node)
  uint32_t remote_window_ = 0;  // chunks in flight per stream between nodes
  uint64_t staging_data_ = 0;   // start of the staging data area
  uint64_t stage_area_ = 0;     // staging bytes per destination on another node
  uint32_t stage_window_ = 0;   // staging slots per destination on another node
};

}  // namespace proxyep::proxy
