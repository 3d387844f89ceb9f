// The node's device arenas: the handles every rank publishes, and opening them (device_arenas.hpp).
#include "proxy/session/device_arenas.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/wire.hpp"

#include <fmt/format.h>

#include <string>

namespace proxyep::proxy {

namespace {

// What every rank publishes (little endian, common/wire.hpp):
//   u32 magic "PXDA" | u16 version | u16 kind bytes | u64 arena bytes | kind |
//   u16 handle bytes | handle
// A rank without a device arena publishes an empty kind and handle.
constexpr uint32_t kMagic = 0x41445850;  // "PXDA" read as little-endian bytes
constexpr uint16_t kVersion = 1;

struct Published {
  std::string kind;
  uint64_t bytes = 0;
  std::vector<uint8_t> handle;
};

std::vector<uint8_t> encode(const Published& p) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<uint16_t>(p.kind.size()));
  w.u64(p.bytes);
  w.bytes({reinterpret_cast<const uint8_t*>(p.kind.data()), p.kind.size()});
  w.u16(static_cast<uint16_t>(p.handle.size()));
  w.bytes(p.handle);
  return out;
}

Published decode(std::span<const uint8_t> blob, int from, std::string_view phase) {
  ByteReader r(blob, std::string(phase));
  require(r.u32("magic") == kMagic && r.u16("version") == kVersion, phase,
          "rank {} published its device arena in another format (another ProxyEP version?)", from);
  Published p;
  const uint16_t kind_bytes = r.u16("kind bytes");
  p.bytes = r.u64("arena bytes");
  const auto kind = r.bytes(kind_bytes, "kind");
  p.kind.assign(kind.begin(), kind.end());
  const auto handle = r.bytes(r.u16("handle bytes"), "handle");
  require(handle.size() <= gpu_side::device::kSharedHandleBytes, phase,
          "rank {} published a device arena handle of {} bytes", from, handle.size());
  p.handle.assign(handle.begin(), handle.end());
  r.expect_end("device arena record");
  return p;
}

}  // namespace

DeviceArenas::DeviceArenas(control::Bootstrap& bootstrap,
                           std::shared_ptr<gpu_side::device::DeviceRuntime> device, uint64_t bytes,
                           int ranks_per_node, std::chrono::milliseconds timeout,
                           std::string_view phase)
    : rank_(bootstrap.rank()), bytes_(bytes), timeout_(timeout), device_(std::move(device)) {
  const int ranks = bootstrap.world_size();
  opened_.resize(static_cast<size_t>(ranks));
  Published mine;
  if (device_) {
    gpu_side::device::SharedMemory shared = device_->allocate_shared(bytes);
    if (shared.memory) {
      opened_[static_cast<size_t>(rank_)] = std::move(shared.memory);
      nic_reads_ = shared.nic_reads;
      registers_as_host_ = shared.registers_as_host;
      local_handle_ = shared.handle;
      local_fd_ = shared.fd;
      mine = {std::string(device_->kind()), bytes, std::move(shared.handle)};
    }
  }
  const auto all = bootstrap.allgather(encode(mine), fmt::format("{}(device arenas)", phase));
  const int node = rank_ / ranks_per_node;
  for (int r = 0; r < ranks; ++r) {
    const Published theirs = decode(all[static_cast<size_t>(r)], r, phase);
    if (r == rank_ || r / ranks_per_node != node || !local() || theirs.kind.empty()) continue;
    if (theirs.kind != device_->kind() || theirs.bytes != bytes) {
      log::warn(
          "{}: rank {}: rank {}'s device arena ({} bytes of {} memory) is not usable by this "
          "rank's {} device: rows to it go through its host arena",
          phase, rank_, r, theirs.bytes, theirs.kind, device_->kind());
      continue;
    }
    try {
      opened_[static_cast<size_t>(r)] = device_->open_shared(theirs.handle, bytes, phase);
    } catch (const Error& e) {
      log::warn(
          "{}: rank {}: cannot open rank {}'s device arena ({}): rows to it go through its "
          "host arena",
          phase, rank_, r, e.what());
    }
  }
  // The owners keep their arenas at least until every peer opened them.
  bootstrap.barrier(fmt::format("{}(device arenas opened)", phase));
}

const std::byte* DeviceArenas::received(uint64_t call, bool in_device, std::byte* host_arena,
                                        uint64_t offset, uint64_t bytes, int sender) const {
  if (!in_device) return host_arena + offset;
  if (device_call(call)) return local() + offset;
  try {
    device_->copy(host_arena + offset, local() + offset, bytes);
    device_->wait_for(*device_->record(), "receive", timeout_);
  } catch (const Error& e) {
    fail("receive", "copying rank {}'s rows out of this rank's device arena: {}", sender, e.what());
  }
  return host_arena + offset;
}

}  // namespace proxyep::proxy
