// LatencyHistogram: a sample lands in the first power-of-two microsecond bucket that holds it,
// the last bucket takes what no bound holds, and snapshots add up.
#include "proxy/engine/latency_histogram.hpp"

#include <doctest/doctest.h>

using proxyep::proxy::LatencyHistogram;

TEST_CASE("samples land in the first bucket whose bound holds them") {
  CHECK(LatencyHistogram::bucket_of(0) == 0);
  CHECK(LatencyHistogram::bucket_of(1000) == 0);  // 1 us: bound 1 us
  CHECK(LatencyHistogram::bucket_of(1001) == 1);  // just over: bound 2 us
  CHECK(LatencyHistogram::bucket_of(2000) == 1);
  CHECK(LatencyHistogram::bucket_of(3000) == 2);        // bound 4 us
  CHECK(LatencyHistogram::bucket_of(1'000'000) == 10);  // 1 ms: bound 1024 us
  CHECK(LatencyHistogram::bucket_of(uint64_t{1} << 19 << 10) == LatencyHistogram::kBuckets);
  CHECK(LatencyHistogram::bucket_of(~uint64_t{0} / 2) == LatencyHistogram::kBuckets);
  CHECK(LatencyHistogram::Snapshot::upper_bound_seconds(10) == doctest::Approx(1.024e-3));
}

TEST_CASE("a snapshot counts every sample once, with their sum; snapshots add") {
  LatencyHistogram h;
  h.record(500);               // bucket 0
  h.record(1500);              // bucket 1
  h.record(-7);                // clock oddity: counted as 0
  h.record(int64_t{1} << 40);  // over every bound
  const auto s = h.snapshot();
  CHECK(s.count == 4);
  CHECK(s.counts[0] == 2);
  CHECK(s.counts[1] == 1);
  CHECK(s.counts[LatencyHistogram::kBuckets] == 1);
  CHECK(s.sum_ns == 500 + 1500 + (uint64_t{1} << 40));
  auto total = s;
  total.add(s);
  CHECK(total.count == 8);
  CHECK(total.counts[1] == 2);
}
