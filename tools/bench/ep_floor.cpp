#include "tools/bench/ep_floor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace proxyep::tools {
namespace {

constexpr int kCopies = 2;  // dispatch writes each received row once, combine reads it once

// Keeps the compiler from dropping a copy into memory nothing reads afterwards.
void keep_written(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

}  // namespace

nlohmann::json time_memcpy_floor(control::Bootstrap& bootstrap, size_t bytes, int warmup,
                                 int iters) {
  // Written once here, before timing: the first touch of each page faults it in, which the
  // Buffer's warm arenas and outputs do not pay in the timed loop either.
  std::vector<std::byte> src(bytes, std::byte{0x5a});
  std::vector<std::byte> dst(bytes, std::byte{0});
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(std::max(iters, 0)));
  for (int i = 0; i < warmup + iters; ++i) {
    // The barrier of the timed loop, so that all ranks copy at once.
    bootstrap.barrier("bench.ep(floor)");
    auto t0 = std::chrono::steady_clock::now();
    if (bytes > 0) std::memcpy(dst.data(), src.data(), bytes);
    keep_written(dst.data());
    auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup && bytes > 0) seconds.push_back(seconds_between(t0, t1));
  }
  return {{"bytes", bytes}, {"seconds", seconds}};
}

nlohmann::json memcpy_floor_json(const RankReports& reports, double total_p50_us) {
  std::vector<std::vector<double>> per_rank;
  std::vector<double> bytes;
  std::vector<uint64_t> bytes_per_rank;  // the same, as integers for the JSON
  for (const auto& report : reports) {
    if (!report.contains("memcpy_floor")) return nullptr;
    const auto& floor = report["memcpy_floor"];
    bytes_per_rank.push_back(floor.at("bytes").get<uint64_t>());
    bytes.push_back(static_cast<double>(bytes_per_rank.back()));
    per_rank.push_back(floor.at("seconds").get<std::vector<double>>());
  }
  if (std::all_of(bytes.begin(), bytes.end(), [](double b) { return b <= 0; })) return nullptr;
  nlohmann::json row = phase_json(slowest_rank(per_rank), bytes);
  const double floor_us = kCopies * row["us"]["p50"].get<double>();
  row["bytes_per_rank"] = bytes_per_rank;
  row["dispatch_combine_floor_us"] = floor_us;
  row["dispatch_combine_over_floor"] =
      floor_us > 0 ? nlohmann::json(total_p50_us / floor_us) : nlohmann::json();
  return row;
}

std::string memory_floor_line(const nlohmann::json& side) {
  if (!side.contains("memcpy_floor") || !side.contains("total")) return "";
  const auto& floor = side["memcpy_floor"];
  if (!floor.is_object() ||
      !floor.value("dispatch_combine_over_floor", nlohmann::json()).is_number())
    return "";
  const double ratio = floor["dispatch_combine_over_floor"].get<double>();
  return fmt::format(
      "  memory floor: dispatch+combine p50 {:.1f} us = {:.2f}x the floor of {} copies of the "
      "received rows ({:.1f} us)\n",
      side["total"]["us"]["p50"].get<double>(), ratio, kCopies,
      floor["dispatch_combine_floor_us"].get<double>());
}

}  // namespace proxyep::tools
