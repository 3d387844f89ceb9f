// ReorderShim: the completion side (segment counting, hold-back, release in random order).
#include "fabric/reorder_shim.hpp"

#include "common/log.hpp"

#include <algorithm>

namespace proxyep::fabric {

// Reads one batch from the inner rail; returns how many entries it found.
size_t ReorderShim::ingest() {
  size_t count = 0;
  Status status = inner_->poll_raw(inner_batch_, count);
  for (size_t i = 0; i < count; ++i) {
    const RawCompletion& completion = inner_batch_[i];
    if (completion.kind == Completion::Kind::remote_write)
      on_remote(completion);
    else
      on_local(completion);
  }
  if (status != Status::ok) {
    on_inner_failure(status);
    ++count;
  }
  return count;
}

void ReorderShim::on_local(const RawCompletion& completion) {
  auto write = static_cast<uint32_t>(completion.cookie);
  if (write >= states_.size() || states_[write].outstanding == 0) {
    log::warn("fabric: reorder shim on rail {} got a local completion for unknown write {}",
              rail_index(), completion.cookie);
    return;
  }
  --states_[write].outstanding;
  retire_if_done(write);
}

void ReorderShim::on_remote(const RawCompletion& completion) {
  ShimHeader header = ShimHeader::decode(completion.data);
  auto imm = static_cast<uint32_t>(completion.data);
  auto [it, fresh] = arrivals_.try_emplace(header.key(), Arrival{0, header.segments, imm});
  Arrival& arrival = it->second;
  if (!fresh && (arrival.segments != header.segments || arrival.imm != imm)) {
    failures_.push_back(
        {Status::error,
         fmt::format("rail {} of rank {}: reorder shim: write {} from rank {} arrived with "
                     "{} segments / imm {:#x} after {} segments / imm {:#x} (sequence reused "
                     "before all segments landed)",
                     rail_index(), rank_, header.sequence, header.source, header.segments, imm,
                     arrival.segments, arrival.imm),
         std::nullopt});
    arrivals_.erase(it);
    return;
  }
  if (++arrival.landed < arrival.segments) return;
  arrivals_.erase(it);
  Completion user;
  user.kind = Completion::Kind::remote_write;
  user.imm = imm;
  held_.push_back({user, polls_, header.sequence, header.source});
}

void ReorderShim::on_inner_failure(Status status) {
  std::optional<uint64_t> cookie = inner_->last_failed_cookie();
  if (!cookie || *cookie >= states_.size()) {  // not one of our writes: pass it through
    failures_.push_back({status, inner_->last_error(), std::nullopt});
    return;
  }
  auto write = static_cast<uint32_t>(*cookie);
  WriteState& state = states_[write];
  if (state.outstanding > 0) --state.outstanding;
  if (!state.failed) {
    state.failed = true;
    failures_.push_back({status,
                         fmt::format("{} [reorder shim: the write with cookie {} to rank {}]",
                                     inner_->last_error(), state.op.cookie, state.op.peer),
                         state.op.cookie});
  }
  retire_if_done(write);
}

void ReorderShim::progress() {
  post_queued(0);
  ingest();
}

Status ReorderShim::poll(std::span<Completion> out, size_t& count) {
  count = 0;
  ++polls_;
  if (failures_.empty()) {
    post_queued(0);
    size_t found = ingest();
    if (failures_.empty()) {
      release(out, count, found == 0);
      return Status::ok;
    }
  }
  Failure failure = std::move(failures_.front());
  failures_.pop_front();
  last_error_ = std::move(failure.text);
  last_failed_cookie_ = failure.cookie;
  return failure.status;
}

// Counts a completion delivered after a later write's: a local one by this rail's write order, a
// remote one by its source's write sequence (modulo the window; at most half of it is in flight).
void ReorderShim::count_release(const Held& held) {
  if (held.completion.kind == Completion::Kind::local_write) {
    if (held.order < last_local_)
      bump(counters_.local_out_of_order);
    else
      last_local_ = held.order;
    return;
  }
  if (held.source >= last_remote_.size()) return;
  uint32_t& last = last_remote_[held.source];
  const auto sequence = static_cast<uint32_t>(held.order);
  const uint32_t behind = (last - sequence) & (ShimHeader::kSequenceWindow - 1);
  if (last != kNoSequence && behind != 0 && behind < ShimHeader::kSequenceWindow / 2)
    bump(counters_.remote_out_of_order);
  else
    last = sequence;
}

// Moves held_[index] to the completions this poll releases.
void ReorderShim::take(size_t index) {
  releasing_.push_back(held_[index]);
  held_[index] = held_.back();
  held_.pop_back();
}

// Releases held completions in random order: everything when asked (the poll found nothing
// new), else whatever has waited kMaxHoldPolls polls, whatever exceeds max_held, and a random
// share of the rest.
void ReorderShim::release(std::span<Completion> out, size_t& count, bool everything) {
  releasing_.clear();
  const size_t room = out.size() - count;
  for (size_t i = 0; i < held_.size() && releasing_.size() < room;) {
    if (everything || polls_ - held_[i].since_poll >= kMaxHoldPolls)
      take(i);
    else
      ++i;
  }
  if (everything) {  // the loop above took them in index order: shuffle them
    std::shuffle(releasing_.begin(), releasing_.end(), random_);
  } else {
    while (held_.size() > options_.max_held && releasing_.size() < room)
      take(random_below(held_.size()));
    size_t extra = held_.empty() ? 0 : random_below(held_.size() + 1);
    for (size_t i = 0; i < extra && releasing_.size() < room; ++i)
      take(random_below(held_.size()));
  }
  for (const Held& held : releasing_) {
    count_release(held);
    out[count++] = held.completion;
  }
}

}  // namespace proxyep::fabric
