// Rail: the completion side (CQ reads, error decoding, delivery from the pending buffer).
#include "fabric/rail.hpp"

#include "common/log.hpp"
#include "fabric/rail_slot.hpp"

#include <rdma/fi_errno.h>

#include <array>
#include <cerrno>

namespace proxyep::fabric {
namespace {

constexpr size_t kCompactAfter = 1024;  // delivered entries kept before the buffer is compacted

// Errors that mean the peer (or the path to it) is gone rather than that this operation was bad.
bool is_peer_failure(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case EHOSTDOWN:
    case ENETUNREACH:
    case ENETDOWN:
    case ENOTCONN:
    case ETIMEDOUT:
    case EPIPE:
    case FI_ENORX:
      return true;
    default:
      return false;
  }
}

}  // namespace

void Rail::progress() {
  if (receives_to_post_ > 0) {
    ssize_t rc = post_receives();
    if (rc < 0)
      record_failure(Status::error,
                     fmt::format("rail {} of rank {}: reposting a receive for remote CQ data "
                                 "failed: {}",
                                 options_.index, options_.rank, fi_error_text(rc)),
                     std::nullopt);
  }
  ssize_t n = fi_cq_read(cq_.get(), cq_buffer_.data(), cq_buffer_.size());
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i)
      handle_entry(cq_buffer_[static_cast<size_t>(i)]);
  } else if (n == -FI_EAVAIL) {
    handle_error_entry();
  } else if (n != -FI_EAGAIN) {
    record_failure(Status::error,
                   fmt::format("rail {} of rank {}: fi_cq_read failed: {}", options_.index,
                               options_.rank, fi_error_text(n)),
                   std::nullopt);
  }
}

void Rail::handle_entry(const fi_cq_data_entry& entry) {
  OpSlot* slot = nullptr;
  if (entry.op_context != nullptr &&
      (writes_->owns(entry.op_context) || receives_->owns(entry.op_context)))
    slot = static_cast<OpSlot*>(entry.op_context);
  bool our_write = slot != nullptr && !slot->is_receive;
  if (our_write && slot->probe) {
    finish_probe(slot, nullptr);
    return;
  }
  if (slot != nullptr && slot->is_receive) {
    receives_->release(slot);  // consumed by an incoming CQ-data write: post a fresh one
    ++receives_to_post_;
  }
  bool remote = (entry.flags & FI_REMOTE_WRITE) != 0 ||
                ((entry.flags & FI_REMOTE_CQ_DATA) != 0 && !our_write);
  if (remote) {
    RawCompletion completion;
    completion.kind = Completion::Kind::remote_write;
    completion.data = entry.data & data_mask_;
    pending_.push_back({completion, false});
  } else if (our_write) {
    RawCompletion completion;
    completion.kind = Completion::Kind::local_write;
    completion.cookie = slot->cookie;
    completion.peer = slot->peer;
    writes_->release(slot);
    pending_.push_back({completion, false});
  } else if (slot == nullptr) {
    log::debug("fabric: rail {} ignores a completion with flags {:#x} and a foreign context",
               options_.index, entry.flags);
  }
}

void Rail::handle_error_entry() {
  fi_cq_err_entry error{};  // err_data_size 0: the provider lends its own error buffer
  ssize_t rc = fi_cq_readerr(cq_.get(), &error, 0);
  if (rc < 0) {
    if (rc == -FI_EAGAIN) return;
    record_failure(Status::error,
                   fmt::format("rail {} of rank {}: fi_cq_readerr failed: {}", options_.index,
                               options_.rank, fi_error_text(rc)),
                   std::nullopt);
    return;
  }
  std::array<char, 256> provider_text{};
  const char* detail = fi_cq_strerror(cq_.get(), error.prov_errno, error.err_data,
                                      provider_text.data(), provider_text.size());
  std::string reason = fmt::format("{} (provider error {}: {})", fi_error_text(error.err),
                                   error.prov_errno, detail != nullptr ? detail : "?");
  Status status = is_peer_failure(error.err) ? Status::peer_failed : Status::error;

  OpSlot* slot = nullptr;
  if (error.op_context != nullptr &&
      (writes_->owns(error.op_context) || receives_->owns(error.op_context)))
    slot = static_cast<OpSlot*>(error.op_context);
  if (slot != nullptr && !slot->is_receive) {
    std::string text = fmt::format("rail {} of rank {}: {} failed: {}", options_.index,
                                   options_.rank, describe(*slot), reason);
    if (slot->probe) {
      finish_probe(slot, &text);
      return;
    }
    uint64_t cookie = slot->cookie;
    writes_->release(slot);
    record_failure(status, std::move(text), cookie);
    return;
  }
  if (slot != nullptr) {  // a receive kept for FI_RX_CQ_DATA failed (or was cancelled)
    receives_->release(slot);
    ++receives_to_post_;
  }
  record_failure(status,
                 fmt::format("rail {} of rank {}: an incoming write (from an unknown peer) "
                             "failed: {}",
                             options_.index, options_.rank, reason),
                 std::nullopt);
}

std::string Rail::describe(const OpSlot& slot) const {
  return fmt::format("write to rank {} (cookie {}, {} bytes to remote address {:#x}, key {:#x})",
                     slot.peer, slot.cookie, slot.length, slot.remote_address, slot.remote_key);
}

void Rail::record_failure(Status status, std::string text, std::optional<uint64_t> cookie) {
  log::debug("fabric: {}", text);
  failures_.push_back({status, std::move(text), cookie});
  pending_.push_back({RawCompletion{}, true});
}

// Hands out pending entries in CQ order: good completions up to the first failure; a failure
// at the head is returned alone (count 0) as its status, its text in last_error().
template <typename Out, typename Convert>
Status Rail::deliver(std::span<Out> out, size_t& count, Convert convert) {
  count = 0;
  if (pending_.size() - pending_head_ < out.size()) progress();
  Status status = Status::ok;
  while (count < out.size() && pending_head_ < pending_.size()) {
    const Pending& entry = pending_[pending_head_];
    if (entry.failed) {
      if (count > 0) break;  // deliver what precedes the failure first
      Failure failure = std::move(failures_.front());
      failures_.pop_front();
      last_error_ = std::move(failure.text);
      last_failed_cookie_ = failure.cookie;
      status = failure.status;
      ++pending_head_;
      break;
    }
    out[count++] = convert(entry.completion);
    ++pending_head_;
  }
  if (pending_head_ == pending_.size()) {  // keep the capacity: no allocation in steady state
    pending_.clear();
    pending_head_ = 0;
  } else if (pending_head_ >= kCompactAfter && pending_head_ * 2 >= pending_.size()) {
    // A consumer that never drains everything must not make the buffer grow without bound.
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(pending_head_));
    pending_head_ = 0;
  }
  return status;
}

Status Rail::poll(std::span<Completion> out, size_t& count) {
  return deliver(out, count, [](const RawCompletion& raw) {
    Completion completion;
    completion.kind = raw.kind;
    completion.imm = static_cast<uint32_t>(raw.data);  // the 32-bit budget, on every provider
    completion.cookie = raw.cookie;
    completion.peer = raw.peer;
    return completion;
  });
}

Status Rail::poll_raw(std::span<RawCompletion> out, size_t& count) {
  return deliver(out, count, [](const RawCompletion& raw) { return raw; });
}

}  // namespace proxyep::fabric
