#include "proxy/node_memory.hpp"

#include "common/error.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace proxyep::proxy {

namespace {

struct Published {
  int64_t pid = 0;
  int64_t fd = -1;
  uint64_t bytes = 0;
};

}  // namespace

NodeMemory::NodeMemory(control::Bootstrap& bootstrap, size_t bytes, int ranks_per_node,
                       std::string_view phase)
    : rank_(bootstrap.rank()),
      local_(HostMemory::memfd(bytes, "proxyep-arena-" + std::to_string(rank_))) {
  Published mine{static_cast<int64_t>(::getpid()), local_.fd(), local_.size()};
  std::span<const uint8_t> wire(reinterpret_cast<const uint8_t*>(&mine), sizeof mine);
  auto all = bootstrap.allgather(wire, std::string(phase) + "(arenas)");
  int ranks = bootstrap.world_size();
  mapped_.resize(static_cast<size_t>(ranks));
  pids_.resize(static_cast<size_t>(ranks));
  int node = rank_ / ranks_per_node;
  std::string failure;
  for (int r = 0; r < ranks; ++r) {
    Published theirs;
    require(all[static_cast<size_t>(r)].size() == sizeof theirs, phase,
            "rank {} published a malformed arena record", r);
    std::memcpy(&theirs, all[static_cast<size_t>(r)].data(), sizeof theirs);
    pids_[static_cast<size_t>(r)] = static_cast<pid_t>(theirs.pid);
    require(theirs.bytes == local_.size(), phase,
            "rank {} sized its arena {} bytes, this rank {}: every rank must pass the same "
            "num_nvl_bytes",
            r, theirs.bytes, local_.size());
    if (r == rank_ || r / ranks_per_node != node || !failure.empty()) continue;
    std::string path = "/proc/" + std::to_string(theirs.pid) + "/fd/" + std::to_string(theirs.fd);
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      failure =
          fmt::format("cannot open the arena of rank {} ({}): {}", r, path, std::strerror(errno));
      continue;
    }
    try {
      mapped_[static_cast<size_t>(r)].emplace(HostMemory::map_fd(fd));
    } catch (const Error& e) {
      failure = fmt::format("cannot map the arena of rank {}: {}", r, e.what());
    }
    ::close(fd);
  }
  // Nobody may leave (and close its memfd) before every peer has opened it; a failure is
  // reported after the barrier so the peers are not left waiting on this rank.
  bootstrap.barrier(std::string(phase) + "(arenas mapped)");
  if (!failure.empty()) fail(std::string(phase), "{}", failure);
}

std::byte* NodeMemory::peer(int rank) const {
  if (rank == rank_) return local();
  const auto& m = mapped_.at(static_cast<size_t>(rank));
  return m ? static_cast<std::byte*>(m->host()) : nullptr;
}

bool NodeMemory::peer_alive(int rank) const {
  pid_t pid = pids_.at(static_cast<size_t>(rank));
  return !(::kill(pid, 0) != 0 && errno == ESRCH);
}

}  // namespace proxyep::proxy
