// RegionTable: what a descriptor's region ids mean. Producers (kernels, CPU twins) name memory by
// small region ids and offsets, never by address or key; the proxy translates each descriptor
// into a fabric::WriteOp through this table: the local region gives the source address and its
// per-rail local descriptor (FI_MR_LOCAL), the destination's RegionDescriptor gives the remote
// address and key on the rail chosen.
//
// Every field of a descriptor is checked before anything is posted: an unknown region, a
// destination rank outside the world, or an offset/length that leaves either region gives
// Status::error with a message naming the descriptor (op, cookie) and the peer, never a crash
// and never a write to a wrong address.
//
// Threading: filled during setup (add_local / add_remote); read-only once the proxy engine has
// started, when any number of proxy threads may translate concurrently (const methods only).
// The engine freezes the table at start, so a late add_*() throws instead of racing, except
// inside ProxyEngine::amend(), which keeps every proxy thread out of its passes meanwhile.
#pragma once

#include "common/error.hpp"
#include "fabric/fabric.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::proxy {

// The fields of a transfer descriptor the table needs (decoded from a ring slot).
struct WriteRequest {
  int dst = -1;                // destination rank
  uint32_t local_region = 0;   // region id of the source, registered on this rank
  uint32_t remote_region = 0;  // region id of the target, registered on `dst`
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  uint64_t cookie = 0;       // the producer's cookie, for messages
  const char* op = "write";  // the descriptor's op, for messages
};

class RegionTable {
 public:
  // Region ids are small integers (they index flat tables); this bounds a bad id's cost.
  static constexpr uint32_t kMaxRegionId = 1u << 16;

  // `ranks`: world size; `rails`: rails of this rank's fabric (each region needs every rail).
  RegionTable(int ranks, int rails);

  // Registers a local region under `id`. The region must stay alive while the table is used.
  // Throws proxyep::Error("proxy.regions") on a duplicate or out-of-range id, or after freeze().
  void add_local(uint32_t id, const fabric::MemoryRegion& region);
  // Registers this process's whole address space, unregistered, under `id`: a descriptor's
  // src_offset is then the source's address. Only for a fabric that reads memory without a
  // local descriptor (no FI_MR_LOCAL: Rail::post refuses the write otherwise) and a proxy that
  // runs in the producer's process (an address means nothing in another one).
  void add_local_address_space(uint32_t id);
  // What rank `peer` registered under `id` (from the bootstrap's allgather).
  void add_remote(int peer, uint32_t id, const fabric::RegionDescriptor& descriptor);
  void freeze() { frozen_ = true; }
  // Open to additions again: only while no proxy thread translates (ProxyEngine::amend).
  void thaw() { frozen_ = false; }
  bool frozen() const { return frozen_; }

  // Fills `op` (peer, local, local_desc, length, remote) for `request` on `rail`; imm, cookie
  // and more are left to the caller. Status::error with `why` set when the request is invalid.
  [[nodiscard]] Status translate(const WriteRequest& request, int rail, fabric::WriteOp& op,
                                 std::string& why) const;

  int ranks() const { return ranks_; }
  int rails() const { return rails_; }

 private:
  struct Local {
    uintptr_t base = 0;  // 0 with size UINT64_MAX: the address space (offsets are addresses)
    uint64_t size = 0;
    std::vector<void*> desc;  // per rail
  };
  struct Remote {
    uint64_t length = 0;
    std::vector<fabric::RemoteTarget> rails;
  };

  void check_mutable(uint32_t id) const;

  int ranks_;
  int rails_;
  bool frozen_ = false;
  std::vector<std::optional<Local>> locals_;                 // index = region id
  std::vector<std::vector<std::optional<Remote>>> remotes_;  // [peer][region id]
};

}  // namespace proxyep::proxy
