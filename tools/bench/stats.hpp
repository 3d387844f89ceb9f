// Order statistics for benchmark samples: medians and tail percentiles, never means alone, since
// this machine is shared and noisy.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace proxyep::tools {

// Nearest-rank percentile (p in [0, 100]) of `samples`; 0 for an empty set.
inline double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
  rank = std::clamp<size_t>(rank, 1, samples.size());
  return samples[rank - 1];
}

struct Summary {
  double p50 = 0, p99 = 0, min = 0, max = 0;
  size_t count = 0;
};

inline Summary summarize(const std::vector<double>& samples) {
  if (samples.empty()) return {};
  auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  return {percentile(samples, 50), percentile(samples, 99), *lo, *hi, samples.size()};
}

}  // namespace proxyep::tools
