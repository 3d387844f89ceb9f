#include "fabric/reorder_shim.hpp"

#include "common/log.hpp"

#include <algorithm>
#include <chrono>

namespace proxyep::fabric {
namespace {

constexpr const char* kPhase = "fabric.reorder";
constexpr size_t kInnerBatch = 64;

// A seed from the clock and the rank, mixed (splitmix64) so neighbouring ranks differ widely.
uint64_t derive_seed(int rank, int rail) {
  uint64_t x = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  x ^= (static_cast<uint64_t>(rank) << 32) ^ static_cast<uint64_t>(rail);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x != 0 ? x : 1;
}

}  // namespace

uint64_t ShimHeader::encode(uint32_t imm) const {
  uint64_t header = (uint64_t{source} << (kSequenceBits + kSegmentBits)) |
                    (uint64_t{sequence} << kSegmentBits) | uint64_t{segments - 1};
  return (header << 32) | imm;
}

ShimHeader ShimHeader::decode(uint64_t data) {
  auto header = static_cast<uint32_t>(data >> 32);
  ShimHeader out;
  out.segments = (header & (kMaxSegments - 1)) + 1;
  out.sequence = (header >> kSegmentBits) & (kSequenceWindow - 1);
  out.source = header >> (kSegmentBits + kSequenceBits);
  return out;
}

ReorderShim::ReorderShim(std::unique_ptr<Rail> inner, const ReorderOptions& options, int rank)
    : inner_(std::move(inner)), options_(options), rank_(rank) {
  const Capabilities& caps = inner_->capabilities();
  require(caps.cq_data_size >= sizeof(uint64_t), kPhase,
          "provider {} carries {} bytes of remote CQ data; the reorder shim needs 8 (its header "
          "rides in the upper 32 bits). Turn fabric.reorder off on this provider",
          caps.provider, caps.cq_data_size);
  require(rank >= 0 && static_cast<uint32_t>(rank) < ShimHeader::kMaxRanks, kPhase,
          "rank {} does not fit the shim header ({} ranks at most)", rank, ShimHeader::kMaxRanks);
  require(options_.segment_bytes >= 1, kPhase, "segment_bytes must be positive");
  // Distinct, reproducible streams per rail from one user seed.
  seed_ = options_.seed != 0 ? options_.seed + static_cast<uint64_t>(rail_index()) * 0x9e3779b9u
                             : derive_seed(rank, rail_index());
  random_.seed(seed_);
  log::info("fabric: reorder shim on rail {} (segments of {} bytes, up to {} held), seed {}{}",
            rail_index(), options_.segment_bytes, options_.max_held, seed_,
            options_.seed != 0 ? "" : " (derived; set fabric.reorder_seed to replay)");
  // Upward, the shim looks like EFA: 4 bytes of CQ data left to the user, nothing ordered.
  capabilities_ = caps;
  capabilities_.cq_data_size = sizeof(uint32_t);
  capabilities_.msg_order = 0;
  capabilities_.rma_write_ordered = false;

  states_.resize(kMaxWritesInFlight);
  free_states_.reserve(kMaxWritesInFlight);
  for (size_t i = kMaxWritesInFlight; i-- > 0;)
    free_states_.push_back(static_cast<uint32_t>(i));
  inner_batch_.resize(kInnerBatch);
}

ReorderShim::~ReorderShim() = default;

void ReorderShim::connect(const std::vector<Bytes>& addresses_by_rank) {
  require(addresses_by_rank.size() <= ShimHeader::kMaxRanks, "fabric.connect",
          "{} ranks exceed the reorder shim's header ({} at most)", addresses_by_rank.size(),
          ShimHeader::kMaxRanks);
  inner_->connect(addresses_by_rank);
  last_remote_.assign(addresses_by_rank.size(), kNoSequence);
}

ReorderShim::Stats ReorderShim::stats() const {
  auto read = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  Stats out;
  out.writes = read(counters_.writes);
  out.split_writes = read(counters_.split_writes);
  out.segments = read(counters_.segments);
  out.segments_out_of_order = read(counters_.segments_out_of_order);
  out.remote_out_of_order = read(counters_.remote_out_of_order);
  out.local_out_of_order = read(counters_.local_out_of_order);
  return out;
}

size_t ReorderShim::random_below(size_t bound) {
  return std::uniform_int_distribution<size_t>(0, bound - 1)(random_);
}

Status ReorderShim::reject(std::string text) {
  last_error_ = std::move(text);
  last_failed_cookie_.reset();
  return Status::error;
}

Status ReorderShim::write(const WriteOp& op) {
  // Bad input is refused here, before any segment exists (docs/ERRORS.md rule 4).
  if (auto problem = inner_->invalid(op)) return reject(std::move(*problem));
  if (free_states_.empty() || queued_.size() >= options_.max_held) {
    post_queued(0);
    if (free_states_.empty() || queued_.size() > options_.max_held) {
      ingest();  // drive progress: completions free states and inner slots
      return Status::again;
    }
  }
  uint32_t write = free_states_.back();
  free_states_.pop_back();
  WriteState& state = states_[write];
  state = WriteState{};
  state.op = op;
  size_t segments =
      std::max<size_t>(1, (op.length + options_.segment_bytes - 1) / options_.segment_bytes);
  state.segment_bytes = options_.segment_bytes;
  if (segments > ShimHeader::kMaxSegments) {  // the header counts 6 bits: grow the segments
    state.segment_bytes = (op.length + ShimHeader::kMaxSegments - 1) / ShimHeader::kMaxSegments;
    segments = (op.length + state.segment_bytes - 1) / state.segment_bytes;
  }
  state.header.source = static_cast<uint32_t>(rank_);
  state.header.sequence = next_sequence_++ & (ShimHeader::kSequenceWindow - 1);
  state.header.segments = static_cast<uint32_t>(segments);
  state.number = ++accepted_;
  bump(counters_.writes);
  if (segments > 1) bump(counters_.split_writes);
  state.unposted = static_cast<uint32_t>(segments);
  for (size_t i = 0; i < segments; ++i)
    queued_.push_back({write, static_cast<uint32_t>(i)});
  if (!op.more) {
    // Post a random share now, the rest later: segments of different writes interleave.
    size_t keep = std::min(options_.max_held, random_below(queued_.size() + 1));
    post_queued(keep);
  }
  return Status::ok;
}

// Posts random queued segments until at most `keep_at_most` remain or the rail pushes back.
void ReorderShim::post_queued(size_t keep_at_most) {
  while (queued_.size() > keep_at_most) {
    if (!post_one(random_below(queued_.size()))) return;
  }
}

// Posts queued_[queue_index]; false when the rail answered again (the segment stays queued).
bool ReorderShim::post_one(size_t queue_index) {
  Segment segment = queued_[queue_index];
  WriteState& state = states_[segment.write];
  auto drop = [&] {
    queued_[queue_index] = queued_.back();
    queued_.pop_back();
    --state.unposted;
  };
  if (state.failed) {  // the write already failed: its remaining segments are moot
    drop();
    retire_if_done(segment.write);
    return true;
  }
  size_t offset = segment.index * state.segment_bytes;
  WriteOp part = state.op;
  part.local =
      state.op.length > 0 ? static_cast<const uint8_t*>(state.op.local) + offset : state.op.local;
  part.length = std::min(state.segment_bytes, state.op.length - std::min(offset, state.op.length));
  part.remote.address = state.op.remote.address + offset;
  part.cookie = segment.write;
  part.more = false;  // a held-back burst can end early on again; never leave FI_MORE dangling
  Status status = inner_->write_raw(part, state.header.encode(state.op.imm));
  if (status == Status::again) return false;
  drop();
  if (status == Status::ok) {
    ++state.outstanding;
    bump(counters_.segments);
    uint64_t position = (state.number << ShimHeader::kSegmentBits) | segment.index;
    if (position < last_posted_) bump(counters_.segments_out_of_order);
    last_posted_ = position;
    return true;
  }
  state.failed = true;
  failures_.push_back({status,
                       fmt::format("{} [reorder shim: segment {}/{} of the write with "
                                   "cookie {} to rank {}]",
                                   inner_->last_error(), segment.index + 1, state.header.segments,
                                   state.op.cookie, state.op.peer),
                       state.op.cookie});
  retire_if_done(segment.write);
  return true;
}

void ReorderShim::retire_if_done(uint32_t write) {
  WriteState& state = states_[write];
  if (state.unposted > 0 || state.outstanding > 0) return;
  if (!state.failed) {
    Completion completion;
    completion.kind = Completion::Kind::local_write;
    completion.cookie = state.op.cookie;
    completion.peer = state.op.peer;
    held_.push_back({completion, polls_, state.number, 0});
  }
  free_states_.push_back(write);
}

}  // namespace proxyep::fabric
