// NodeMemory: the intranode path's memory, the CPU analog of DeepEP's NVLink buffers exchanged by
// CUDA IPC handles. Every rank creates one arena in a memfd; the ranks of a node map each other's
// arenas, so a sender copies rows straight into a peer's arena with ordinary stores and no proxy
// or fabric in between.
//
// How a peer's memfd is reached: every rank publishes (pid, fd) through the bootstrap and the
// node's other ranks open /proc/<pid>/fd/<fd> (reopening a memfd this way needs the same user,
// which ranks of one job are). Each mapping may sit at a different address, so arenas hold
// offsets only. The mappings stay valid after the owner exits (the file lives while anyone maps
// it), so a dead peer never turns into a SIGBUS here; waits detect it instead (peer_alive()).
#pragma once

#include "common/host_memory.hpp"
#include "control/bootstrap.hpp"

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

// What a NodeMemory holds, for its memfd's name and its errors.
struct NodeMemoryKind {
  const char* what = "arena";               // the memory, as errors name it
  const char* size_from = "num_nvl_bytes";  // what sets its size, which every rank must agree on
};

class NodeMemory {
 public:
  // Collective over `bootstrap`: every rank passes the same `bytes` (checked) and the same
  // ranks_per_node. Ranks [node * ranks_per_node, ...) share a node. Throws proxyep::Error
  // (`phase`) naming the peer whose memory could not be opened or mapped. The memory is mapped,
  // not touched: pages cost memory once written.
  NodeMemory(control::Bootstrap& bootstrap, size_t bytes, int ranks_per_node,
             std::string_view phase, NodeMemoryKind kind = {});

  size_t bytes() const { return local_.size(); }
  std::byte* local() const { return static_cast<std::byte*>(local_.host()); }
  // This rank's arena memfd (for a node daemon that maps it too).
  int local_fd() const { return local_.fd(); }
  // The arena of `rank` as mapped here; nullptr when `rank` is on another node. (This rank's own
  // arena for rank == self.)
  std::byte* peer(int rank) const;
  bool on_node(int rank) const { return peer(rank) != nullptr; }
  // This rank's arena and every node peer's as mapped here (whole, `bytes()` each).
  std::vector<std::span<std::byte>> all_mapped() const;
  // False once the process of node peer `rank` has exited (kill(pid, 0) fails with ESRCH).
  bool peer_alive(int rank) const;
  pid_t peer_pid(int rank) const { return pids_.at(static_cast<size_t>(rank)); }

 private:
  int rank_;
  HostMemory local_;
  std::vector<std::optional<HostMemory>> mapped_;  // by rank; empty for other nodes and self
  std::vector<pid_t> pids_;
};

}  // namespace proxyep::proxy
