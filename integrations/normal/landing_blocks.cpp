// The landing region's free space (landing_blocks.hpp).
#include "integrations/normal/landing_blocks.hpp"

#include <algorithm>
#include <iterator>

namespace proxyep::integrations::normal {

LandingBlocks::LandingBlocks(uint64_t bytes) {
  const uint64_t usable = bytes / kAlignment * kAlignment;
  if (usable > 0) free_[0] = usable;
}

int64_t LandingBlocks::Offer::place(uint64_t bytes) const {
  const uint64_t size = rounded(bytes);
  if (size == 0) return -1;
  if (size <= fitted.bytes) return static_cast<int64_t>(fitted.offset);
  if (size <= largest.bytes) return static_cast<int64_t>(largest.offset);
  return -1;
}

LandingBlocks::Offer LandingBlocks::offer() const {
  std::lock_guard lock(mutex_);
  const uint64_t want = *std::max_element(needs_.begin(), needs_.end());
  Offer offer;
  for (const auto& [offset, bytes] : free_) {
    if (want > 0 && bytes >= want && offer.fitted.bytes == 0) offer.fitted = {offset, bytes};
    if (bytes > offer.largest.bytes) offer.largest = {offset, bytes};
  }
  return offer;
}

void LandingBlocks::note_need(uint64_t bytes) {
  std::lock_guard lock(mutex_);
  needs_[next_need_] = rounded(bytes);
  next_need_ = (next_need_ + 1) % needs_.size();
}

bool LandingBlocks::take(uint64_t offset, uint64_t bytes) {
  const uint64_t size = rounded(bytes);
  std::lock_guard lock(mutex_);
  auto run = free_.upper_bound(offset);
  if (run == free_.begin() || size == 0) return false;
  --run;
  const uint64_t run_start = run->first, run_end = run->first + run->second;
  if (offset % kAlignment != 0 || offset + size > run_end) return false;
  free_.erase(run);
  if (run_start < offset) free_[run_start] = offset - run_start;
  if (offset + size < run_end) free_[offset + size] = run_end - (offset + size);
  return true;
}

void LandingBlocks::release(uint64_t offset, uint64_t bytes) {
  const uint64_t size = rounded(bytes);
  std::lock_guard lock(mutex_);
  uint64_t start = offset, end = offset + size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == start) {
      start = previous->first;
      free_.erase(previous);
    }
  }
  free_[start] = end - start;
}

uint64_t LandingBlocks::free_bytes() const {
  std::lock_guard lock(mutex_);
  uint64_t total = 0;
  for (const auto& run : free_)
    total += run.second;
  return total;
}

size_t LandingBlocks::free_runs() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

}  // namespace proxyep::integrations::normal
