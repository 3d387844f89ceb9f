// ReorderShim: a Transport decorator that gives a rail on tcp or shm the semantics of EFA's SRD,
// so ordering bugs that those more ordered providers hide show up in tests.
//
// What it does (all randomness from one seeded generator per rail, logged, replayable):
// - Initiator: each write is split into segments of segment_bytes (at most kMaxSegments; larger
//   writes get larger segments). Segments are queued, not posted: a write with `more` set is
//   held whole; otherwise a random share of the queue is posted, in random order, leaving at
//   most max_held queued. poll() and progress() post everything queued (random order), so a
//   waiter that keeps polling, as the Transport contract requires, always makes progress.
// - Target: every segment carries the shim header in the upper 32 bits of the provider's CQ data
//   and the user's immediate in the lower 32. A remote_write completion is produced only when
//   all segments of that write have landed (counted per source rank and write sequence), with
//   the user's 32-bit imm; a partly landed write is invisible, exactly like on EFA.
// - Both sides: completions (local ones once every segment of the write completed locally) go
//   into a hold-back set and leave it in random order: a poll releases a random share, anything
//   beyond max_held, anything held kMaxHoldPolls polls, and everything when the poll found
//   nothing new. So no completion is held forever and a waiting loop always sees it.
// - Stats (fabric.hpp ReorderStats) count what was reordered: segments posted out of order, and
//   completions delivered after a later write's (remote: per source, by its write sequence;
//   local: by this rail's write order). The --reorder integration tests require some, so a shim
//   that stopped reordering fails them.
// - Errors: a failed segment fails its write once (error status naming the user's cookie and
//   peer); later segment failures of the same write are not reported again.
//
// Header (upper 32 bits of CQ data): [source rank: 14 | write sequence: 12 | segments - 1: 6].
// The sequence is per source rail and wraps; at most kMaxWritesInFlight writes may be in flight
// (Status::again beyond), half the window, so a sequence number is reused only long after the
// writes that carried it completed. A mismatching repeat is reported, not merged silently.
//
// The shim needs 8 bytes of CQ data; on a provider with 4 (EFA) opening it throws. It presents
// EFA-like capabilities upward: cq_data_size 4, no message ordering.
#pragma once

#include "fabric/fabric.hpp"
#include "fabric/rail.hpp"

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

namespace proxyep::fabric {

struct ShimHeader {
  static constexpr int kRankBits = 14;
  static constexpr int kSequenceBits = 12;
  static constexpr int kSegmentBits = 6;
  static_assert(kRankBits + kSequenceBits + kSegmentBits == 32,
                "the shim header must fill exactly the upper 32 bits of 64-bit CQ data");
  static constexpr uint32_t kMaxRanks = 1u << kRankBits;
  static constexpr uint32_t kSequenceWindow = 1u << kSequenceBits;
  static constexpr uint32_t kMaxSegments = 1u << kSegmentBits;

  uint32_t source = 0;    // initiator's rank
  uint32_t sequence = 0;  // initiator's write number, modulo kSequenceWindow
  uint32_t segments = 1;  // segments of the write, 1..kMaxSegments

  // CQ data of one segment: this header above the user's immediate.
  uint64_t encode(uint32_t imm) const;
  static ShimHeader decode(uint64_t data);
  // Identifies one write at its target: source rank and sequence.
  uint32_t key() const { return (source << kSequenceBits) | sequence; }
};

class ReorderShim final : public Transport {
 public:
  static constexpr size_t kMaxWritesInFlight = ShimHeader::kSequenceWindow / 2;
  static constexpr uint64_t kMaxHoldPolls = 64;

  // Throws proxyep::Error("fabric.reorder") when the rail's provider carries fewer than 8 bytes
  // of CQ data or the rank does not fit the header.
  ReorderShim(std::unique_ptr<Rail> inner, const ReorderOptions& options, int rank);
  ~ReorderShim() override;

  const Capabilities& capabilities() const override { return capabilities_; }
  int rail_index() const override { return inner_->rail_index(); }
  Bytes address() const override { return inner_->address(); }
  void connect(const std::vector<Bytes>& addresses_by_rank) override;

  [[nodiscard]] Status write(const WriteOp& op) override;
  [[nodiscard]] Status poll(std::span<Completion> out, size_t& count) override;
  size_t writes_in_flight() const override { return states_.size() - free_states_.size(); }
  const std::string& last_error() const override { return last_error_; }
  std::optional<uint64_t> last_failed_cookie() const override { return last_failed_cookie_; }

  // What the shim did, so tests can tell it really reordered (fabric.hpp).
  using Stats = ReorderStats;

  // Posts queued segments and reads the inner rail once; releases nothing (see poll()).
  void progress();
  // A snapshot, safe from any thread: the counters are written by the rail's one thread only
  // (relaxed, like the proxy's ThreadStats), so another thread may see them a little behind.
  Stats stats() const;
  uint64_t seed() const { return seed_; }
  Rail& inner() { return *inner_; }

 private:
  struct WriteState {
    WriteOp op;
    ShimHeader header;
    uint64_t number = 0;  // order of acceptance, for Stats
    size_t segment_bytes = 0;
    uint32_t unposted = 0;     // segments still queued here
    uint32_t outstanding = 0;  // segments posted, not yet completed locally
    bool failed = false;
  };
  struct Segment {
    uint32_t write = 0;  // index into states_
    uint32_t index = 0;  // segment number within the write
  };
  struct Arrival {
    uint32_t landed = 0;
    uint32_t segments = 0;
    uint32_t imm = 0;
  };
  struct Held {
    Completion completion;
    uint64_t since_poll = 0;
    // For Stats: local: the write's number; remote: the source's write sequence, and the source.
    uint64_t order = 0;
    uint32_t source = 0;
  };
  struct Counters {
    std::atomic<uint64_t> writes{0}, split_writes{0}, segments{0}, segments_out_of_order{0},
        remote_out_of_order{0}, local_out_of_order{0};
  };
  static constexpr uint32_t kNoSequence = ~uint32_t{0};
  struct Failure {
    Status status = Status::error;
    std::string text;
    std::optional<uint64_t> cookie;  // the user's write, when the failure is one of ours
  };

  bool post_one(size_t queue_index);
  void post_queued(size_t keep_at_most);
  size_t ingest();
  void on_local(const RawCompletion& completion);
  void on_remote(const RawCompletion& completion);
  void on_inner_failure(Status status);
  void retire_if_done(uint32_t write);
  void release(std::span<Completion> out, size_t& count, bool everything);
  void take(size_t index);
  void count_release(const Held& held);
  static void bump(std::atomic<uint64_t>& counter) {
    counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  Status reject(std::string text);
  size_t random_below(size_t bound);

  std::unique_ptr<Rail> inner_;
  ReorderOptions options_;
  int rank_;
  uint64_t seed_;
  Capabilities capabilities_;
  std::mt19937_64 random_;

  std::vector<WriteState> states_;
  std::vector<uint32_t> free_states_;
  std::vector<Segment> queued_;
  uint32_t next_sequence_ = 0;
  std::unordered_map<uint32_t, Arrival> arrivals_;  // key: source << kSequenceBits | sequence
  std::vector<Held> held_;
  std::vector<Held> releasing_;  // what one poll releases, in delivery order
  std::deque<Failure> failures_;
  std::vector<RawCompletion> inner_batch_;
  uint64_t polls_ = 0;
  uint64_t accepted_ = 0;     // writes accepted: the next write's number - 1
  uint64_t last_posted_ = 0;  // (write number << kSegmentBits | segment) of the last post
  // Latest delivered in order: per source rank, the sequence of a remote completion
  // (kNoSequence: none yet); the number of a local one.
  std::vector<uint32_t> last_remote_;
  uint64_t last_local_ = 0;
  Counters counters_;
  std::string last_error_;
  std::optional<uint64_t> last_failed_cookie_;  // of the failure poll() last returned
};

}  // namespace proxyep::fabric
