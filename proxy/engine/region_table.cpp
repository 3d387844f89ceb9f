#include "proxy/engine/region_table.hpp"

#include <fmt/format.h>

namespace proxyep::proxy {
namespace {

constexpr const char* kPhase = "proxy.regions";

// a + b > limit without overflowing.
bool exceeds(uint64_t a, uint64_t b, uint64_t limit) {
  return a > limit || b > limit - a;
}

std::string name(const WriteRequest& r) {
  return fmt::format("descriptor {} (cookie {:#x}) to rank {}", r.op, r.cookie, r.dst);
}

template <typename T>
void grow_to(std::vector<std::optional<T>>& table, uint32_t id) {
  if (table.size() <= id) table.resize(static_cast<size_t>(id) + 1);
}

}  // namespace

RegionTable::RegionTable(int ranks, int rails)
    : ranks_(ranks), rails_(rails), remotes_(static_cast<size_t>(ranks > 0 ? ranks : 0)) {
  require(ranks > 0 && rails > 0, kPhase, "a region table needs ranks and rails (got {}, {})",
          ranks, rails);
}

void RegionTable::check_mutable(uint32_t id) const {
  require(!frozen_, kPhase, "region {} added after the proxy engine started", id);
  require(id < kMaxRegionId, kPhase, "region id {} is out of range (max {})", id, kMaxRegionId - 1);
}

void RegionTable::add_local(uint32_t id, const fabric::MemoryRegion& region) {
  check_mutable(id);
  grow_to(locals_, id);
  require(!locals_[id].has_value(), kPhase, "local region {} registered twice", id);
  Local local;
  local.base = reinterpret_cast<uintptr_t>(region.data());
  local.size = region.size();
  for (int rail = 0; rail < rails_; ++rail)
    local.desc.push_back(region.local_desc(rail));
  locals_[id] = std::move(local);
}

void RegionTable::add_local_address_space(uint32_t id) {
  check_mutable(id);
  grow_to(locals_, id);
  require(!locals_[id].has_value(), kPhase, "local region {} registered twice", id);
  Local local;
  local.size = UINT64_MAX;
  local.desc.assign(static_cast<size_t>(rails_), nullptr);
  locals_[id] = std::move(local);
}

void RegionTable::add_remote(int peer, uint32_t id, const fabric::RegionDescriptor& descriptor) {
  check_mutable(id);
  require(peer >= 0 && peer < ranks_, kPhase, "region {} of rank {}: the world has {} ranks", id,
          peer, ranks_);
  require(descriptor.rails.size() >= static_cast<size_t>(rails_), kPhase,
          "region {} of rank {} is registered on {} rails, this rank uses {}", id, peer,
          descriptor.rails.size(), rails_);
  auto& table = remotes_[static_cast<size_t>(peer)];
  grow_to(table, id);
  require(!table[id].has_value(), kPhase, "region {} of rank {} registered twice", id, peer);
  table[id] = Remote{descriptor.length, descriptor.rails};
}

Status RegionTable::translate(const WriteRequest& r, int rail, fabric::WriteOp& op,
                              std::string& why) const {
  if (r.dst < 0 || r.dst >= ranks_) {
    why = fmt::format("{}: no such rank (the world has {})", name(r), ranks_);
    return Status::error;
  }
  if (rail < 0 || rail >= rails_) {
    why = fmt::format("{}: no rail {} (this rank has {})", name(r), rail, rails_);
    return Status::error;
  }
  if (r.local_region >= locals_.size() || !locals_[r.local_region]) {
    why = fmt::format("{}: unknown local region {}", name(r), r.local_region);
    return Status::error;
  }
  const auto& remotes = remotes_[static_cast<size_t>(r.dst)];
  if (r.remote_region >= remotes.size() || !remotes[r.remote_region]) {
    why = fmt::format("{}: rank {} registered no region {}", name(r), r.dst, r.remote_region);
    return Status::error;
  }
  const Local& local = *locals_[r.local_region];
  const Remote& remote = *remotes[r.remote_region];
  if (exceeds(r.src_offset, r.length, local.size)) {
    why = fmt::format("{}: source [{}, +{}) leaves local region {} of {} bytes", name(r),
                      r.src_offset, r.length, r.local_region, local.size);
    return Status::error;
  }
  if (exceeds(r.dst_offset, r.length, remote.length)) {
    why = fmt::format("{}: target [{}, +{}) leaves region {} of rank {} ({} bytes)", name(r),
                      r.dst_offset, r.length, r.remote_region, r.dst, remote.length);
    return Status::error;
  }
  const fabric::RemoteTarget& base = remote.rails[static_cast<size_t>(rail)];
  op.peer = r.dst;
  // Integer arithmetic: the address-space region's base is 0, not an object to offset from.
  op.local = reinterpret_cast<const void*>(local.base + r.src_offset);
  op.local_desc = local.desc[static_cast<size_t>(rail)];
  op.length = static_cast<size_t>(r.length);
  op.remote = fabric::RemoteTarget{base.address + r.dst_offset, base.key};
  return Status::ok;
}

}  // namespace proxyep::proxy
