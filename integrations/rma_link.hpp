// RMA link: a private point-to-point channel over the fabric layer, for bulk one-way transfers
// between two processes that share no bootstrap or process group (weight publication from a
// trainer to rollout workers, python/proxyep/rl/weights/publisher.py). One link = one Fabric of
// two ranks in its own address vector: the sender is rank 0, the receiver rank 1. Each side
// opens its own (so a receiver that joins late gets a link of its own, and a dead peer breaks
// only its link), exchanges address() and the receiver's descriptor() over any control channel,
// and connects.
//
//   RmaReceiver rx(bytes, "publisher");          RmaSender tx("worker a rank 1");
//   // swap rx.address() / tx.address(), send rx.descriptor() to the sender
//   rx.connect(sender_address);                  tx.connect(receiver_address);
//                                                int src = tx.register_region(data, len);
//                                                int dst = tx.add_remote(receiver_descriptor);
//                                                tx.write(src, 0, len, dst, 0, imm, ms, "phase");
//   rx.wait(1, timeout_ms, "phase");             tx.flush(timeout_ms, "phase");
//
// Semantics are the fabric's (fabric/transport.hpp): writes land and complete in any order; a
// remote completion at the receiver (one immediate per write) means that write's bytes have all
// landed, nothing else does. Writes are at most max_write_bytes() long (the provider's maximum
// message size): the caller chunks, so that one write is one immediate. Both sides drive
// progress only inside their calls (manual-progress providers move data only while the target
// polls): a receiver must be in wait()/wait_some() while its sender writes, which the control
// protocol above arranges. Every wait has a deadline and fails with proxyep::Error naming the
// caller's phase and the peer (wait_some()/flush_some() return instead, for callers that watch
// something else between slices). Each object is used by one thread at a time (calls are serialised
// by a mutex; the fabric underneath is FI_THREAD_DOMAIN).
#pragma once

#include "common/host_memory.hpp"
#include "fabric/fabric.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace proxyep {

// What both ends share: the fabric of the two-rank link, its rails polled in turn.
class RmaLinkEnd {
 public:
  // The link's rank (0 sender, 1 receiver): every rank sees the other at index 1 - rank.
  int rank() const { return rank_; }
  const std::string& peer() const { return peer_; }
  fabric::Bytes address() const;
  const fabric::Capabilities& capabilities() const;
  std::optional<fabric::ReorderStats> reorder_stats() const;
  bool connected() const { return connected_; }

 protected:
  // `options` as FabricOptions::from_params gives them, rank overridden by `rank`; `peer` names
  // the other end in every error.
  RmaLinkEnd(int rank, std::string peer, fabric::FabricOptions options);
  ~RmaLinkEnd();
  RmaLinkEnd(const RmaLinkEnd&) = delete;
  RmaLinkEnd& operator=(const RmaLinkEnd&) = delete;

  void connect_to(const fabric::Bytes& peer_address);
  // Polls every rail once; remote/local completions go to on_completion. Throws Error(phase)
  // naming the peer on an error completion.
  template <typename OnCompletion>
  void poll_rails(const std::string& phase, OnCompletion&& on_completion);

  int rank_;
  std::string peer_;
  std::unique_ptr<fabric::Fabric> fabric_;
  bool connected_ = false;
  mutable std::mutex mutex_;
};

// The receiving end: owns a page-aligned, registered landing area that the sender writes into.
class RmaReceiver : public RmaLinkEnd {
 public:
  // A landing area of `bytes` (> 0), zeroed. `peer` names the sender in errors.
  RmaReceiver(size_t bytes, std::string peer, fabric::FabricOptions options);
  RmaReceiver(size_t bytes, std::string peer);  // options from the parameter registry
  ~RmaReceiver();

  // The landing area's descriptor (RegionDescriptor::serialize), for the sender's add_remote.
  fabric::Bytes descriptor() const;
  void connect(const fabric::Bytes& sender_address) { connect_to(sender_address); }
  std::span<std::byte> landing() const { return memory_.bytes(); }

  // Drives progress until `total` writes have arrived over the link's life, then returns the
  // immediates of every write that arrived since the previous wait()/poll() (in arrival order).
  // Throws Error(phase) naming the peer on timeout (saying how many of `total` arrived) or an
  // error completion; the immediates collected so far stay queued for the next call.
  std::vector<uint32_t> wait(uint64_t total, int64_t timeout_ms, const std::string& phase);
  // Drives progress until some write has arrived since the previous call, `total` have arrived
  // over the link's life, or `timeout_ms` is up (no error: compare received() with `total`);
  // returns the immediates that arrived, maybe none. For callers that act on chunks as they
  // land (verify them) and watch something else between calls, such as the control
  // connection that says the sender is gone.
  std::vector<uint32_t> wait_some(uint64_t total, int64_t timeout_ms, const std::string& phase);
  // Polls once: the immediates that arrived since the previous call (maybe none).
  std::vector<uint32_t> poll(const std::string& phase);
  // Writes that have arrived over the link's life.
  uint64_t received() const;

 private:
  void collect(const std::string& phase);  // polls every rail once into arrived_
  // Until `total` arrived (or, with `any`, something is queued in arrived_); false on timeout.
  bool collect_until(uint64_t total, int64_t timeout_ms, const std::string& phase, bool any);

  HostMemory memory_;
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::vector<uint32_t> arrived_;  // immediates not yet returned
  uint64_t received_ = 0;
};

// The sending end: registers source memory and writes it into the receiver's landing area.
class RmaSender : public RmaLinkEnd {
 public:
  // `peer` names the receiver in errors.
  RmaSender(std::string peer, fabric::FabricOptions options);
  explicit RmaSender(std::string peer);  // options from the parameter registry
  ~RmaSender();

  void connect(const fabric::Bytes& receiver_address) { connect_to(receiver_address); }
  // Registers [data, data + bytes) (caller-owned; it must outlive the region) -> region id.
  int register_region(void* data, size_t bytes);
  // Deregisters a region after flush(); a region with writes in flight is refused.
  void unregister_region(int region);
  // A receiver landing area from its descriptor() -> remote id. Throws on a malformed blob.
  int add_remote(const fabric::Bytes& descriptor);
  // The longest single write: the provider's maximum message size (and the shim's if any).
  size_t max_write_bytes() const;

  // Posts one write of `length` bytes at `offset` in `region` to `remote_offset` of remote
  // `remote`, carrying `imm`; retries while the fabric says again (driving progress) until
  // `timeout_ms`. Bad ranges are refused before anything is posted. Returns once posted;
  // flush() waits for completion.
  void write(int region, uint64_t offset, uint64_t length, int remote, uint64_t remote_offset,
             uint32_t imm, int64_t timeout_ms, const std::string& phase);
  // Drives progress until every posted write completed locally (its source may be reused).
  void flush(int64_t timeout_ms, const std::string& phase);
  // flush() that returns false when `timeout_ms` is up instead of failing: for callers that
  // watch the receiver's control connection between slices.
  bool flush_some(int64_t timeout_ms, const std::string& phase);
  uint64_t posted() const;
  uint64_t completed() const;
  uint64_t bytes_posted() const;

 private:
  struct Region {
    std::unique_ptr<fabric::MemoryRegion> region;
    const std::byte* data = nullptr;
    size_t bytes = 0;
  };
  void drive(const std::string& phase);  // one poll of every rail, counting local completions
  bool drain_until(int64_t timeout_ms, const std::string& phase);
  Region& region_at(int region, const std::string& phase);

  std::vector<Region> regions_;  // index = region id; a deregistered one has no region
  std::vector<fabric::RegionDescriptor> remotes_;
  uint64_t posted_ = 0;
  uint64_t completed_ = 0;
  uint64_t bytes_posted_ = 0;
  int next_rail_ = 0;
};

}  // namespace proxyep
