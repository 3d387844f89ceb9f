// LandingZone: where a normal-mode dispatch's recv_x lives when the node's ranks write their rows
// straight into it. Without it a row from a node peer is copied twice: into this rank's arena,
// then out of it into recv_x; with it, once.
//
// Every rank reserves a large memfd (ep.landing_bytes of address space; pages are committed only
// where outputs are written) that its node peers map (proxy::NodeMemory). Each dispatch, a rank
// offers free runs of it in its notify record (LandingBlocks says which); when the rows it then
// receives fit one, its recv_x is a block at the start of that run, and every node peer, knowing
// the counts, the offer and its own rows' place, stores its rows there. The block returns to the
// free space when the output's last handle is dropped, wherever that happens; the region itself
// lives until the last block and the Buffer are gone.
#pragma once

#include "control/bootstrap.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/normal/landing_blocks.hpp"
#include "proxy/session/node_memory.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace proxyep::integrations::normal {

class LandingZone : public std::enable_shared_from_this<LandingZone> {
 public:
  // Collective over `bootstrap` (every rank calls it): null when `bytes` is 0 or the group has
  // one rank. Every rank must pass the same `bytes` and `fabric_mode` (ep.landing_fabric, which
  // says whether the session registers the region with the fabric: SessionConfig::landing);
  // throws proxyep::Error(phase) when they differ or a node peer's region cannot be mapped.
  static std::shared_ptr<LandingZone> open(control::Bootstrap& bootstrap, uint64_t bytes,
                                           std::string_view fabric_mode, int ranks_per_node,
                                           std::string_view phase);

  LandingBlocks::Offer offer() const { return blocks_.offer(); }
  void note_need(uint64_t bytes) { blocks_.note_need(bytes); }
  // Rank `rank`'s region as mapped here (this rank's own for itself); null for other nodes.
  std::byte* region(int rank) const { return memory_.peer(rank); }
  // This rank's region, for the fabric to register.
  std::span<std::byte> local() const { return {memory_.local(), memory_.bytes()}; }
  // Its memfd, for a node daemon that registers it in this rank's place.
  int local_fd() const { return memory_.local_fd(); }
  // An output of [rows, cols] `dtype` at `offset` of this rank's region (inside the run it
  // offered: LandingBlocks::Offer::place); an undefined tensor when it does not fit there.
  gpu_side::ep::Tensor take(uint64_t offset, gpu_side::ep::DType dtype, int64_t rows, int64_t cols);

  const LandingBlocks& blocks() const { return blocks_; }

  LandingZone(control::Bootstrap& bootstrap, uint64_t bytes, int ranks_per_node,
              std::string_view phase);  // open() is the way in

 private:
  proxy::NodeMemory memory_;
  LandingBlocks blocks_;
};

}  // namespace proxyep::integrations::normal
