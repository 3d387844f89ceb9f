// The free space of a rank's landing region (landing_zone.hpp), by offset: which free run the
// rank offers its node peers for the recv_x of its next dispatch, and the blocks that outputs
// hold until their last handle is dropped.
//
// The offer is made before the rank knows how many rows it will receive (it travels in the
// notify record that announces the counts), so it names two runs, tried in order: the lowest
// free run that holds the largest of the recent needs (outputs of one model repeat their sizes),
// and the largest run (for a call larger than those). Taking the lowest keeps the pages in use
// few and reused; the largest alone would walk up the region while a caller holds one output
// across the next call. A call that fits neither only costs the copy the region saves: its rows
// land in the arena as without one.
//
// Thread-safe: blocks come back from whichever thread drops an output's last handle.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>

namespace proxyep::integrations::normal {

class LandingBlocks {
 public:
  // Blocks start and end on this boundary.
  static constexpr uint64_t kAlignment = 4096;
  static uint64_t rounded(uint64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  struct Run {
    uint64_t offset = 0, bytes = 0;
  };
  struct Offer {
    Run fitted;   // the lowest run that holds the recent needs (0 bytes: none yet)
    Run largest;  // the largest run
    // Where a block of `bytes` goes: the start of the first run that holds it; -1 when neither
    // does. Every rank that knows the offer computes the same.
    int64_t place(uint64_t bytes) const;
  };

  explicit LandingBlocks(uint64_t bytes);

  Offer offer() const;
  // Records a dispatch's need (bytes, rounded up), used or not: the next offers look for it.
  void note_need(uint64_t bytes);
  // Marks [offset, offset + rounded(bytes)) used. It must lie in one free run (an offer's runs
  // stay free until taken: only releases happen meanwhile, and they only grow runs); false if
  // not.
  bool take(uint64_t offset, uint64_t bytes);
  // Frees a taken block. (A block whose call failed midway may still be written by a peer; it
  // comes back too, but into a Buffer whose broken call sequence refuses every later call:
  // call_sequence.hpp.)
  void release(uint64_t offset, uint64_t bytes);

  uint64_t free_bytes() const;
  size_t free_runs() const;

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes; neighbours always merged
  std::array<uint64_t, 8> needs_{};    // the recent needs, a ring
  size_t next_need_ = 0;
};

}  // namespace proxyep::integrations::normal
