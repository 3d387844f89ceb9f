// DeviceArenas: the node's arenas in device memory, where a Buffer's device calls store the rows
// they send to node peers: DeepEP's NVLink buffers, exchanged by CUDA IPC handles. Beside them
// the host arenas (node_memory.hpp) keep what the host writes and waits on: records, published,
// consumed and released words. So a device call's rows from one GPU to another on the node
// never cross PCIe: the sender's kernels store them into the peer's device arena (its IPC
// mapping), the receiver's kernels read them from its own.
//
// The layout is the host arena's (arena_layout.hpp: the same offsets; only the eager slots and
// the data area are used). A call uses them when its rows are written by the kernels of the
// device the arenas belong to (begin_call); per peer only when the peer has a device arena this
// rank could open, else the peer's host arena serves as before. The receiver learns which one a
// sender used from the sender's record (the word's kDeviceRowsBit), so calls of either kind
// interoperate: a host call that is sent rows in device memory has its device copy them out
// (received()). Where the fabric registers device memory (FI_HMEM) and the arena is memory a
// NIC writes, the session registers it too (in process, or the node daemon through its handle),
// and other nodes' device calls write into it the same way (fabric_channel.hpp).
#pragma once

#include "control/bootstrap.hpp"
#include "gpu_side/device/device_runtime.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

class DeviceArenas {
 public:
  // Collective over `bootstrap`: every rank of the group calls it, with its device or none. A
  // rank whose device shares memory (DeviceRuntime::allocate_shared) allocates `bytes` and
  // publishes the handle; a rank with a device opens its node peers' handles of the same kind.
  // A peer's arena of another kind, or one the device cannot open (GPUs without peer access),
  // is left unused, with a warning: rows to that peer go to its host arena.
  // `timeout` bounds received()'s copy.
  DeviceArenas(control::Bootstrap& bootstrap,
               std::shared_ptr<gpu_side::device::DeviceRuntime> device, uint64_t bytes,
               int ranks_per_node, std::chrono::milliseconds timeout, std::string_view phase);

  // Rank `rank`'s device arena as this rank's device reaches it (its own for rank == self);
  // null when there is none.
  std::byte* peer(int rank) const { return opened_.at(static_cast<size_t>(rank)).get(); }
  std::byte* local() const { return peer(rank_); }
  uint64_t bytes() const { return bytes_; }
  // Whether a NIC may write this rank's device arena once registered, and as which kind of
  // memory (gpu_side::device::SharedMemory).
  bool nic_reads() const { return nic_reads_; }
  bool registers_as_host() const { return registers_as_host_; }
  // This rank's arena as the node daemon opens it for its NIC (gpu_side::device::SharedMemory's
  // handle and descriptor, -1 where the device has none); empty without an arena.
  std::span<const uint8_t> local_handle() const { return local_handle_; }
  int local_fd() const { return local_fd_; }

  // Call `call` (every call, on every rank) has its rows written and read by `rows_device`'s
  // kernels (none: a host call). Rows go to device arenas in calls of this rank's device.
  void begin_call(uint64_t call, const gpu_side::device::DeviceRuntime* rows_device) {
    device_call_[call % 2] = rows_device != nullptr && rows_device == device_.get() && local();
  }
  // Whether this rank's call `call` (one of the two latest) is such a call.
  bool device_call(uint64_t call) const { return device_call_[call % 2]; }

  // Where the `bytes` at `offset` that `sender` sent in call `call` are for this rank to read:
  // `host_arena` + offset unless `in_device` (the sender's record said they went to this rank's
  // device arena); then the device arena at the same offset, or, in a host call of this rank
  // (which cannot read device memory), `host_arena` + offset after the device copied them
  // there (that slot of the host arena is unused in this call). Throws proxyep::Error("receive")
  // naming the sender when that copy fails or outlasts the deadline.
  const std::byte* received(uint64_t call, bool in_device, std::byte* host_arena, uint64_t offset,
                            uint64_t bytes, int sender) const;

  // Payloads (eager bytes, chunks) this rank's device calls sent into device arenas so far (node
  // peers', its own, other nodes' through the NIC).
  void count_send() { sends_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t sends() const { return sends_.load(std::memory_order_relaxed); }

 private:
  int rank_;
  uint64_t bytes_;
  bool nic_reads_ = false, registers_as_host_ = false;
  std::vector<uint8_t> local_handle_;
  int local_fd_ = -1;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::vector<std::shared_ptr<std::byte[]>> opened_;  // by rank; null: none
  std::array<bool, 2> device_call_{};                 // by call parity
  std::atomic<uint64_t> sends_{0};
};

}  // namespace proxyep::proxy
