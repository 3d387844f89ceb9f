// The landing region (landing_zone.hpp).
#include "integrations/normal/landing_zone.hpp"

#include "common/error.hpp"
#include "common/wire.hpp"

#include <fmt/format.h>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

std::shared_ptr<LandingZone> LandingZone::open(control::Bootstrap& bootstrap, uint64_t bytes,
                                               std::string_view fabric_mode, int ranks_per_node,
                                               std::string_view phase) {
  const int ranks = bootstrap.world_size();
  if (ranks <= 1) return nullptr;
  // Agree first: a rank without a region must not leave the others mapping theirs, nor one that
  // registers it with the fabric the others that do not.
  std::vector<uint8_t> mine;
  ByteWriter writer(mine);
  writer.u64(bytes);
  // The mode's text, which the parameter registry has limited to a few short words.
  writer.u8(static_cast<uint8_t>(fabric_mode.size()));
  writer.bytes({reinterpret_cast<const uint8_t*>(fabric_mode.data()), fabric_mode.size()});
  const auto all = bootstrap.allgather(mine, fmt::format("{}(landing sizes)", phase));
  for (int r = 0; r < ranks; ++r) {
    ByteReader reader(all[static_cast<size_t>(r)], std::string(phase));
    const uint64_t theirs = reader.u64("landing bytes");
    const auto mode = reader.bytes(reader.u8("landing fabric length"), "landing fabric");
    const std::string their_mode(mode.begin(), mode.end());
    require(theirs == bytes && their_mode == fabric_mode, phase,
            "rank {} has ep.landing_bytes {} and ep.landing_fabric {}, this rank {} and {}: every "
            "rank must use the same values",
            r, theirs, their_mode, bytes, fabric_mode);
  }
  if (bytes == 0) return nullptr;
  return std::make_shared<LandingZone>(bootstrap, bytes, ranks_per_node, phase);
}

LandingZone::LandingZone(control::Bootstrap& bootstrap, uint64_t bytes, int ranks_per_node,
                         std::string_view phase)
    : memory_(bootstrap, LandingBlocks::rounded(bytes), ranks_per_node, phase,
              {.what = "landing region", .size_from = "ep.landing_bytes"}),
      blocks_(memory_.bytes()) {}

ep::Tensor LandingZone::take(uint64_t offset, ep::DType dtype, int64_t rows, int64_t cols) {
  const uint64_t bytes = static_cast<uint64_t>(rows * cols) * ep::dtype_size(dtype);
  if (bytes == 0 || !blocks_.take(offset, bytes)) return {};
  // The block, and with it the region, lives as long as the output's last handle.
  std::shared_ptr<LandingZone> self = shared_from_this();
  std::shared_ptr<std::byte[]> storage(memory_.local() + offset, [self, offset, bytes](std::byte*) {
    self->blocks_.release(offset, bytes);
  });
  return ep::Tensor::over(std::move(storage), dtype, rows, cols);
}

}  // namespace proxyep::integrations::normal
