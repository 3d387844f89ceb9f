// Rail: the libfabric Transport. One RDM endpoint with its own CQ and AV on a (possibly shared)
// domain; one per NIC, or several per NIC as fake rails.
//
// Write path: fi_writemsg with FI_REMOTE_CQ_DATA (FI_MORE on request), always passing the local
// descriptor (FI_MR_LOCAL-safe) and one fi_context2 slot from a preallocated pool that remembers
// the peer and cookie. No slot, or -FI_EAGAIN from the provider: read the CQ once (progress for
// manual-progress providers) and return Status::again; never sleep.
//
// Completion path: fi_cq_read in batches of cq_batch (FI_CQ_FORMAT_DATA) into a pending buffer
// that poll() hands out, so completions found while driving progress from write() or from
// Fabric::progress() are never lost. Remote completions are told from local ones by
// FI_REMOTE_WRITE (sockets marks local ones with FI_REMOTE_CQ_DATA too), or by CQ data without
// one of our write contexts. Error entries (fi_cq_readerr + fi_cq_strerror) keep their place in
// the stream: poll() delivers the good completions before one, then returns its status with the
// decoded text in last_error(), naming the peer rank and the operation.
//
// CQ data: Transport::write/poll carry the 32-bit immediate (masked even where the provider has
// 8 bytes); write_raw/poll_raw expose the provider's full width for the reorder shim.
//
// FI_RX_CQ_DATA mode (a CQ-data write consumes a posted receive): the rail keeps zero-length
// receives posted and reposts each one a write consumed.
#pragma once

#include "fabric/context_pool.hpp"
#include "fabric/domain.hpp"
#include "fabric/transport.hpp"

#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace proxyep::fabric {

struct RailOptions {
  int index = 0;  // rail number within the rank
  int rank = 0;   // this rank, for messages
  size_t cq_size = 16384;
  size_t cq_batch = 64;
};

// A completion with the provider's full CQ data (the reorder shim's header lives in bits 32+).
struct RawCompletion {
  Completion::Kind kind = Completion::Kind::local_write;
  uint64_t data = 0;
  uint64_t cookie = 0;
  int peer = -1;
};

class Rail final : public Transport {
 public:
  // Opens the endpoint, CQ and AV on `domain` and enables the endpoint. Throws
  // proxyep::Error("fabric.open").
  Rail(std::shared_ptr<DomainContext> domain, const RailOptions& options);
  ~Rail() override;
  Rail(const Rail&) = delete;
  Rail& operator=(const Rail&) = delete;

  const Capabilities& capabilities() const override { return domain_->capabilities(); }
  int rail_index() const override { return options_.index; }
  Bytes address() const override { return address_; }
  // The address in libfabric's text form (fi_av_straddr): for tcp the IP and port its endpoint
  // listens on, e.g. "fi_sockaddr_in://127.0.0.1:41234".
  std::string address_text() const;
  void connect(const std::vector<Bytes>& addresses_by_rank) override;

  [[nodiscard]] Status write(const WriteOp& op) override { return write_raw(op, op.imm); }
  [[nodiscard]] Status poll(std::span<Completion> out, size_t& count) override;
  size_t writes_in_flight() const override;
  const std::string& last_error() const override { return last_error_; }

  // write() with the provider's full CQ data width (masked to cq_data_size bytes).
  [[nodiscard]] Status write_raw(const WriteOp& op, uint64_t cq_data);
  [[nodiscard]] Status poll_raw(std::span<RawCompletion> out, size_t& count);
  // Why `op` cannot be posted on this rail (unknown peer, null source, missing FI_MR_LOCAL
  // descriptor), or nothing: bad input is refused before anything is sent.
  std::optional<std::string> invalid(const WriteOp& op) const;
  // Reads one batch of the CQ into the pending buffer (and reposts consumed receives).
  void progress();
  // The cookie of the write whose failure the last error status reported; empty when that error
  // was not tied to one of our writes (a failed incoming write, a CQ failure).
  std::optional<uint64_t> last_failed_cookie() const override { return last_failed_cookie_; }

  // Connection probes (Fabric::open_connections): a zero-length write without CQ data to `peer`
  // at `remote` (nothing completes at the target), posted now or as soon as a slot frees. Its
  // local completion stays inside the rail: poll() never returns it. rail_probe.cpp.
  void queue_probe(int peer, const RemoteTarget& remote);
  // Posts the queued probes the write slots allow (the rest after completions free slots).
  void post_queued_probes();
  // Whether every probe completed (progress() reads their completions). Throws
  // proxyep::Error("fabric.connect") naming the peer when a probe failed.
  bool probes_done() const;
  // Peers with a probe queued or in flight (for a timeout's message).
  std::vector<int> peers_probed() const;

  DomainContext& domain() const { return *domain_; }
  std::shared_ptr<DomainContext> domain_handle() const { return domain_; }
  fid_ep* endpoint() const { return endpoint_.get(); }
  int num_peers() const { return static_cast<int>(peers_.size()); }

 private:
  struct OpSlot;
  struct Failure {
    Status status = Status::error;
    std::string text;
    std::optional<uint64_t> cookie;
  };
  // One pending entry: a completion, or the place of a failure in the stream.
  struct Pending {
    RawCompletion completion;
    bool failed = false;
  };

  void open_objects();
  ssize_t post_receives();
  void handle_entry(const fi_cq_data_entry& entry);
  void handle_error_entry();
  void record_failure(Status status, std::string text, std::optional<uint64_t> cookie);
  Status fail_post(Status status, std::string text);
  template <typename Out, typename Convert>
  Status deliver(std::span<Out> out, size_t& count, Convert convert);
  std::string describe(const OpSlot& slot) const;
  // fi_writemsg of one iov to `remote` on behalf of `slot` (its peer), CQ data masked.
  ssize_t post_rma(OpSlot& slot, const void* local, void* local_desc, size_t length,
                   const RemoteTarget& remote, uint64_t cq_data, uint64_t flags);
  Status post_probe(int peer, const RemoteTarget& remote);
  void finish_probe(OpSlot* slot, const std::string* failure);

  RailOptions options_;
  std::shared_ptr<DomainContext> domain_;
  uint64_t data_mask_ = ~uint64_t{0};
  bool rx_cq_data_ = false;  // FI_RX_CQ_DATA: keep receives posted
  // Close order: endpoint first, then the CQ and AV bound to it (reverse declaration order).
  AvPtr av_;
  CqPtr cq_;
  EndpointPtr endpoint_;
  Bytes address_;
  std::vector<fi_addr_t> peers_;  // index = rank

  std::unique_ptr<SlotPool<OpSlot>> writes_;
  std::unique_ptr<SlotPool<OpSlot>> receives_;
  size_t receives_to_post_ = 0;  // consumed receives whose repost hit -FI_EAGAIN
  std::vector<fi_cq_data_entry> cq_buffer_;
  std::vector<Pending> pending_;  // entries [pending_head_, size) not yet delivered
  size_t pending_head_ = 0;
  std::deque<Failure> failures_;  // one per `failed` pending entry, same order
  std::string last_error_;
  std::optional<uint64_t> last_failed_cookie_;
  struct Probe {
    int peer = -1;
    RemoteTarget remote;
  };
  std::deque<Probe> probes_queued_;
  std::vector<int> probes_posted_;  // per peer: probes in flight (for peers_probed())
  size_t probes_in_flight_ = 0;
  std::optional<std::string> probe_failure_;
};

}  // namespace proxyep::fabric
