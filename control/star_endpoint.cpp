#include "control/star_endpoint.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace proxyep::control {

std::string ranks_text(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::string list;
  // Runs of three or more collapse to "a-b": with 1024 ranks a message must stay readable.
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1)
      ++j;
    if (!list.empty()) list += ", ";
    if (j - i >= 2) {
      list += fmt::format("{}-{}", sorted[i], sorted[j]);
    } else {
      list += fmt::format("{}", sorted[i]);
      if (j > i) list += fmt::format(", {}", sorted[j]);
    }
    i = j + 1;
  }
  return fmt::format("{} {}", sorted.size() == 1 ? "rank" : "ranks", list);
}

std::chrono::milliseconds verdict_grace(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(200), std::chrono::milliseconds(2000));
}

}  // namespace proxyep::control
