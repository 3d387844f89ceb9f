#include "proxy/session/node_memory.hpp"

#include "common/error.hpp"
#include "common/wire.hpp"

#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace proxyep::proxy {

namespace {

// Where a rank's arena can be opened, as every rank publishes it (little endian, common/wire.hpp):
//   u32 magic "PXAR" | u16 version | u16 0 | u64 pid | u64 fd | u64 bytes
constexpr uint32_t kArenaMagic = 0x52415850;  // "PXAR" read as little-endian bytes
constexpr uint16_t kArenaVersion = 1;

struct Published {
  int64_t pid = 0;
  int64_t fd = -1;
  uint64_t bytes = 0;
};

std::vector<uint8_t> encode(const Published& p) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u32(kArenaMagic);
  w.u16(kArenaVersion);
  w.u16(0);
  w.u64(static_cast<uint64_t>(p.pid));
  w.u64(static_cast<uint64_t>(p.fd));
  w.u64(p.bytes);
  return out;
}

Published decode(std::span<const uint8_t> blob, int from, std::string_view phase) {
  ByteReader r(blob, std::string(phase));
  require(r.u32("magic") == kArenaMagic && r.u16("version") == kArenaVersion, phase,
          "rank {} published its shared memory in another format (another ProxyEP version?)", from);
  (void)r.u16("reserved");
  Published p;
  p.pid = static_cast<int64_t>(r.u64("pid"));
  p.fd = static_cast<int64_t>(r.u64("fd"));
  p.bytes = r.u64("bytes");
  r.expect_end("arena record");
  return p;
}

}  // namespace

NodeMemory::NodeMemory(control::Bootstrap& bootstrap, size_t bytes, int ranks_per_node,
                       std::string_view phase, NodeMemoryKind kind)
    : rank_(bootstrap.rank()),
      local_(HostMemory::memfd(bytes, fmt::format("proxyep-{}-{}", kind.what, rank_))) {
  const Published mine{static_cast<int64_t>(::getpid()), local_.fd(), local_.size()};
  auto all = bootstrap.allgather(encode(mine), fmt::format("{}({}s)", phase, kind.what));
  int ranks = bootstrap.world_size();
  mapped_.resize(static_cast<size_t>(ranks));
  pids_.resize(static_cast<size_t>(ranks));
  int node = rank_ / ranks_per_node;
  std::string failure;
  for (int r = 0; r < ranks; ++r) {
    const Published theirs = decode(all[static_cast<size_t>(r)], r, phase);
    pids_[static_cast<size_t>(r)] = static_cast<pid_t>(theirs.pid);
    require(theirs.bytes == local_.size(), phase,
            "rank {} sized its {} {} bytes, this rank {}: every rank must pass the same {}", r,
            kind.what, theirs.bytes, local_.size(), kind.size_from);
    if (r == rank_ || r / ranks_per_node != node || !failure.empty()) continue;
    try {
      mapped_[static_cast<size_t>(r)].emplace(HostMemory::map_process_fd(
          static_cast<uint64_t>(theirs.pid), static_cast<uint64_t>(theirs.fd)));
    } catch (const Error& e) {
      failure = fmt::format("cannot map the {} of rank {}: {}", kind.what, r, e.what());
    }
  }
  // Nobody may leave (and close its memfd) before every peer has opened it; a failure is
  // reported after the barrier so the peers are not left waiting on this rank.
  bootstrap.barrier(fmt::format("{}({}s mapped)", phase, kind.what));
  if (!failure.empty()) fail(std::string(phase), "{}", failure);
}

std::byte* NodeMemory::peer(int rank) const {
  if (rank == rank_) return local();
  const auto& m = mapped_.at(static_cast<size_t>(rank));
  return m ? static_cast<std::byte*>(m->host()) : nullptr;
}

std::vector<std::span<std::byte>> NodeMemory::all_mapped() const {
  std::vector<std::span<std::byte>> out{local_.bytes()};
  for (const auto& m : mapped_)
    if (m) out.push_back(m->bytes());
  return out;
}

bool NodeMemory::peer_alive(int rank) const {
  pid_t pid = pids_.at(static_cast<size_t>(rank));
  return !(::kill(pid, 0) != 0 && errno == ESRCH);
}

}  // namespace proxyep::proxy
