// Transport: one rail (one NIC) of a rank, i.e. one libfabric endpoint with its CQ and AV, seen
// through the operations ProxyEP needs: RMA write with 32-bit immediate data, and completions.
// Implementations: the libfabric rail (fabric/rail.hpp) and the reorder shim
// (fabric/reorder_shim.hpp), a decorator that gives any rail EFA SRD's unordered semantics.
//
// Contract:
// - Single-threaded: one thread at a time calls write()/poll() on a given Transport
//   (FI_THREAD_DOMAIN), so the provider can skip its locks.
// - The immediate is 32 bits on every provider (EFA's budget), even where CQ data has 8 bytes.
// - A remote_write completion at the target means every byte of that write has landed; nothing
//   else does. Writes complete in any order, at the initiator and at the target.
// - write() returning Status::again means "no resources now": call poll() to drive progress,
//   then retry. It never sleeps.
// - Errors on the hot path are Status values; last_error() then describes them, naming the peer
//   rank and the operation.
#pragma once

#include "common/error.hpp"
#include "fabric/capabilities.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace proxyep::fabric {

using Bytes = std::vector<uint8_t>;

// Where a write lands: an address in the target's registered region, as this provider wants it
// (the VA under FI_MR_VIRT_ADDR, an offset from the region start otherwise), and its key.
struct RemoteTarget {
  uint64_t address = 0;
  uint64_t key = 0;
};

struct WriteOp {
  int peer = -1;                // destination rank
  const void* local = nullptr;  // source bytes, inside a region registered on this rail
  void* local_desc = nullptr;   // fi_mr_desc of that region on this rail (may be null)
  size_t length = 0;            // zero-length writes are legal (signals)
  RemoteTarget remote;          // resolved target address and key
  uint32_t imm = 0;             // delivered with the target's remote_write completion
  uint64_t cookie = 0;          // returned in this side's local_write completion
  bool more = false;            // FI_MORE: more writes follow at once (batch the doorbell)
};

struct Completion {
  enum class Kind : uint8_t { local_write, remote_write };
  Kind kind = Kind::local_write;
  uint32_t imm = 0;     // remote_write: the initiator's immediate
  uint64_t cookie = 0;  // local_write: the WriteOp's cookie
  int peer = -1;        // local_write: the destination rank; remote_write: -1 (the imm says)
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const Capabilities& capabilities() const = 0;
  virtual int rail_index() const = 0;

  // This endpoint's address (fi_getname), to be exchanged with every peer.
  virtual Bytes address() const = 0;
  // Inserts every rank's address into the AV (index = rank; our own entry included), before any
  // write: efa-direct requires the target to know the initiator.
  virtual void connect(const std::vector<Bytes>& addresses_by_rank) = 0;

  [[nodiscard]] virtual Status write(const WriteOp& op) = 0;
  // Drains up to out.size() completions into out, sets `count`. Status::ok with count 0 means
  // nothing completed; an error completion returns Status::error/peer_failed with count 0 and
  // last_error() set. Completions keep their place around an error: those before it come with
  // earlier polls, those after it with later ones, so none is lost. A write that fails yields
  // its error instead of a local_write completion.
  [[nodiscard]] virtual Status poll(std::span<Completion> out, size_t& count) = 0;
  // Writes posted and not yet completed locally.
  virtual size_t writes_in_flight() const = 0;

  virtual const std::string& last_error() const = 0;
  // The cookie of the write whose failure the last error status reported; empty when the error
  // was not tied to one of this transport's writes (so a caller can name the write's peer).
  virtual std::optional<uint64_t> last_failed_cookie() const { return std::nullopt; }
};

}  // namespace proxyep::fabric
