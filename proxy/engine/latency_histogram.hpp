// LatencyHistogram: how long a proxy thread's writes took from post to local completion, in
// power-of-two microsecond buckets (1 us .. 2^19 us, about half a second, then "more"), with
// their count and sum: what the metrics endpoint exposes as a Prometheus histogram.
//
// One writer at a time (the thread holding the proxy thread's pass lock: the thread itself or
// a waiter driving it), readers on any thread: relaxed loads and stores, no locked adds on the
// completion path. A reader may see a sample's bucket before its sum; a scrape is a snapshot,
// not a transaction.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>

namespace proxyep::proxy {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 20;  // upper bounds 2^b microseconds, b = 0 .. 19

  struct Snapshot {
    std::array<uint64_t, kBuckets + 1> counts{};  // per bucket (not cumulative); last: more
    uint64_t count = 0;
    uint64_t sum_ns = 0;
    static constexpr double upper_bound_seconds(int bucket) {
      return static_cast<double>(uint64_t{1} << bucket) * 1e-6;
    }
    void add(const Snapshot& other) {
      for (size_t b = 0; b < counts.size(); ++b)
        counts[b] += other.counts[b];
      count += other.count;
      sum_ns += other.sum_ns;
    }
  };

  void record(int64_t ns) {
    const uint64_t v = ns > 0 ? static_cast<uint64_t>(ns) : 0;
    bump(counts_[bucket_of(v)], 1);
    bump(count_, 1);
    bump(sum_ns_, v);
  }

  Snapshot snapshot() const {
    Snapshot s;
    for (size_t b = 0; b < counts_.size(); ++b)
      s.counts[b] = counts_[b].load(std::memory_order_relaxed);
    s.count = count_.load(std::memory_order_relaxed);
    s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
    return s;
  }

  // The first bucket whose bound (2^b us) holds `ns`; kBuckets when none does.
  static constexpr int bucket_of(uint64_t ns) {
    const uint64_t us_up = (ns + 999) / 1000;  // rounded up: 1001 ns is over 1 us
    if (us_up <= 1) return 0;
    const int b = std::bit_width(us_up - 1);  // smallest b with 2^b >= us_up
    return b < kBuckets ? b : kBuckets;
  }

 private:
  static void bump(std::atomic<uint64_t>& counter, uint64_t by) {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }

  std::array<std::atomic<uint64_t>, kBuckets + 1> counts_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace proxyep::proxy
