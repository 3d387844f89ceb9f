#include "integrations/rma_link.hpp"

#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "common/error.hpp"

#include <array>
#include <limits>
#include <utility>

namespace proxyep {
namespace {

constexpr size_t kPollBatch = 64;

fabric::FabricOptions with_rank(fabric::FabricOptions options, int rank) {
  options.rank = rank;
  return options;
}

// The receiver's options, once its landing size is known to be valid (before the fabric opens).
fabric::FabricOptions receiver_options(fabric::FabricOptions options, size_t bytes,
                                       const std::string& peer) {
  require(bytes > 0, "rma.open", "a landing area of 0 bytes for {}", peer);
  return options;
}

}  // namespace

// --- both ends ---------------------------------------------------------------------------------

RmaLinkEnd::RmaLinkEnd(int rank, std::string peer, fabric::FabricOptions options)
    : rank_(rank), peer_(std::move(peer)) {
  fabric_ = fabric::Fabric::open(with_rank(std::move(options), rank));
}

RmaLinkEnd::~RmaLinkEnd() = default;

fabric::Bytes RmaLinkEnd::address() const {
  std::lock_guard lock(mutex_);
  return fabric_->addresses();
}

const fabric::Capabilities& RmaLinkEnd::capabilities() const {
  return fabric_->capabilities();
}

std::optional<fabric::ReorderStats> RmaLinkEnd::reorder_stats() const {
  return fabric_->reorder_stats();
}

void RmaLinkEnd::connect_to(const fabric::Bytes& peer_address) {
  std::lock_guard lock(mutex_);
  require(!connected_, "rma.connect", "the link to {} is already connected", peer_);
  require(!peer_address.empty(), "rma.connect", "empty address for {}", peer_);
  std::vector<fabric::Bytes> by_rank(2);
  by_rank[static_cast<size_t>(rank_)] = fabric_->addresses();
  by_rank[static_cast<size_t>(1 - rank_)] = peer_address;
  try {
    fabric_->connect(by_rank);
  } catch (const Error& e) {
    fail("rma.connect", "connecting to {}: {}", peer_, e.what());
  }
  connected_ = true;
}

template <typename OnCompletion>
void RmaLinkEnd::poll_rails(const std::string& phase, OnCompletion&& on_completion) {
  std::array<fabric::Completion, kPollBatch> batch;
  for (int rail = 0; rail < fabric_->num_rails(); ++rail) {
    fabric::Transport& transport = fabric_->rail(rail);
    size_t count = 0;
    Status status = transport.poll(batch, count);
    for (size_t i = 0; i < count; ++i)
      on_completion(batch[i]);
    if (status != Status::ok)
      fail(phase, "{} on the link with {} (rail {}): {}", to_string(status), peer_, rail,
           transport.last_error());
  }
}

// --- receiver ----------------------------------------------------------------------------------

RmaReceiver::RmaReceiver(size_t bytes, std::string peer, fabric::FabricOptions options)
    : RmaLinkEnd(1, peer, receiver_options(std::move(options), bytes, peer)),
      memory_(HostMemory::heap(bytes)) {
  region_ = fabric_->register_memory(memory_.host(), memory_.size());
}

RmaReceiver::RmaReceiver(size_t bytes, std::string peer)
    : RmaReceiver(bytes, std::move(peer), fabric::FabricOptions::from_params(1)) {}

RmaReceiver::~RmaReceiver() = default;

fabric::Bytes RmaReceiver::descriptor() const {
  return region_->descriptor().serialize();
}

uint64_t RmaReceiver::received() const {
  std::lock_guard lock(mutex_);
  return received_;
}

void RmaReceiver::collect(const std::string& phase) {
  poll_rails(phase, [this](const fabric::Completion& c) {
    if (c.kind != fabric::Completion::Kind::remote_write) return;
    arrived_.push_back(c.imm);
    ++received_;
  });
}

std::vector<uint32_t> RmaReceiver::poll(const std::string& phase) {
  std::lock_guard lock(mutex_);
  require(connected_, phase, "the link with {} is not connected", peer_);
  collect(phase);
  return std::exchange(arrived_, {});
}

bool RmaReceiver::collect_until(uint64_t total, int64_t timeout_ms, const std::string& phase,
                                bool any) {
  require(connected_, phase, "the link with {} is not connected", peer_);
  require(timeout_ms >= 0, phase, "negative timeout {} ms", timeout_ms);
  auto deadline = Deadline::after_ms(timeout_ms);
  Backoff backoff;  // other processes (the sender among them) may share our cores
  while (received_ < total && !(any && !arrived_.empty())) {
    const uint64_t before = received_;
    collect(phase);
    if (received_ >= total || (any && !arrived_.empty())) break;
    if (deadline.expired()) return false;
    if (received_ == before)
      backoff.pause();
    else
      backoff.reset();
  }
  return true;
}

std::vector<uint32_t> RmaReceiver::wait(uint64_t total, int64_t timeout_ms,
                                        const std::string& phase) {
  std::lock_guard lock(mutex_);
  const uint64_t start = received_;
  if (!collect_until(total, timeout_ms, phase, false))
    fail(phase,
         "{} of {} writes from {} arrived within {} ms ({} in this wait, {} before it): the "
         "sender is gone, stalled or behind",
         received_, total, peer_, timeout_ms, received_ - start, start);
  return std::exchange(arrived_, {});
}

std::vector<uint32_t> RmaReceiver::wait_some(uint64_t total, int64_t timeout_ms,
                                             const std::string& phase) {
  std::lock_guard lock(mutex_);
  collect_until(total, timeout_ms, phase, true);
  return std::exchange(arrived_, {});
}

// --- sender ------------------------------------------------------------------------------------

RmaSender::RmaSender(std::string peer, fabric::FabricOptions options)
    : RmaLinkEnd(0, std::move(peer), std::move(options)) {}

RmaSender::RmaSender(std::string peer)
    : RmaSender(std::move(peer), fabric::FabricOptions::from_params(0)) {}

RmaSender::~RmaSender() {
  // Regions go before the fabric (they keep its domains alive anyway).
  regions_.clear();
}

int RmaSender::register_region(void* data, size_t bytes) {
  std::lock_guard lock(mutex_);
  require(data != nullptr && bytes > 0, "rma.register", "empty source region for {}", peer_);
  Region entry;
  entry.region = fabric_->register_memory(data, bytes);
  entry.data = static_cast<const std::byte*>(data);
  entry.bytes = bytes;
  regions_.push_back(std::move(entry));
  return static_cast<int>(regions_.size() - 1);
}

RmaSender::Region& RmaSender::region_at(int region, const std::string& phase) {
  require(region >= 0 && static_cast<size_t>(region) < regions_.size() &&
              regions_[static_cast<size_t>(region)].region != nullptr,
          phase, "unknown source region {} (link to {})", region, peer_);
  return regions_[static_cast<size_t>(region)];
}

void RmaSender::unregister_region(int region) {
  std::lock_guard lock(mutex_);
  Region& entry = region_at(region, "rma.register");
  require(posted_ == completed_, "rma.register",
          "{} writes to {} are still in flight: flush() before deregistering region {}",
          posted_ - completed_, peer_, region);
  entry = Region{};
}

int RmaSender::add_remote(const fabric::Bytes& descriptor) {
  std::lock_guard lock(mutex_);
  fabric::RegionDescriptor remote;
  try {
    remote = fabric::RegionDescriptor::deserialize(descriptor);
  } catch (const Error& e) {
    fail("rma.connect", "the landing descriptor of {} is malformed: {}", peer_, e.what());
  }
  require(remote.rails.size() == static_cast<size_t>(fabric_->num_rails()), "rma.connect",
          "{} registered its landing area on {} rails, this end has {}", peer_, remote.rails.size(),
          fabric_->num_rails());
  remotes_.push_back(std::move(remote));
  return static_cast<int>(remotes_.size() - 1);
}

size_t RmaSender::max_write_bytes() const {
  size_t max = capabilities().max_msg_size;
  return max == 0 ? std::numeric_limits<uint32_t>::max() : max;
}

uint64_t RmaSender::posted() const {
  std::lock_guard lock(mutex_);
  return posted_;
}

uint64_t RmaSender::completed() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

uint64_t RmaSender::bytes_posted() const {
  std::lock_guard lock(mutex_);
  return bytes_posted_;
}

void RmaSender::drive(const std::string& phase) {
  poll_rails(phase, [this](const fabric::Completion& c) {
    if (c.kind == fabric::Completion::Kind::local_write) ++completed_;
  });
}

void RmaSender::write(int region, uint64_t offset, uint64_t length, int remote,
                      uint64_t remote_offset, uint32_t imm, int64_t timeout_ms,
                      const std::string& phase) {
  std::lock_guard lock(mutex_);
  require(connected_, phase, "the link to {} is not connected", peer_);
  Region& source = region_at(region, phase);
  require(remote >= 0 && static_cast<size_t>(remote) < remotes_.size(), phase,
          "unknown remote {} (link to {})", remote, peer_);
  const fabric::RegionDescriptor& target = remotes_[static_cast<size_t>(remote)];
  require(offset <= source.bytes && length <= source.bytes - offset, phase,
          "source range [{}, +{}) outside region {} of {} bytes (link to {})", offset, length,
          region, source.bytes, peer_);
  require(remote_offset <= target.length && length <= target.length - remote_offset, phase,
          "target range [{}, +{}) outside the {}-byte landing area of {}", remote_offset, length,
          target.length, peer_);
  require(length <= max_write_bytes(), phase,
          "a write of {} bytes to {} exceeds the provider's maximum message size {}", length, peer_,
          max_write_bytes());
  require(timeout_ms >= 0, phase, "negative timeout {} ms", timeout_ms);

  const int rail = next_rail_;
  next_rail_ = (next_rail_ + 1) % fabric_->num_rails();
  fabric::WriteOp op;
  op.peer = 1;
  op.local = source.data + offset;
  op.local_desc = source.region->local_desc(rail);
  op.length = length;
  op.remote = target.target(rail, length > 0 ? remote_offset : 0);
  op.imm = imm;
  op.cookie = posted_;
  fabric::Transport& transport = fabric_->rail(rail);
  auto deadline = Deadline::after_ms(timeout_ms);
  Status status;
  Backoff backoff;
  while ((status = transport.write(op)) == Status::again) {
    drive(phase);
    backoff.pause();
    if (deadline.expired())
      fail(phase,
           "the fabric refused a write to {} for {} ms ({} of {} earlier writes still in flight): "
           "the receiver is gone or not polling",
           peer_, timeout_ms, posted_ - completed_, posted_);
  }
  if (status != Status::ok)
    fail(phase, "{} writing {} bytes to {}: {}", to_string(status), length, peer_,
         transport.last_error());
  ++posted_;
  bytes_posted_ += length;
}

bool RmaSender::drain_until(int64_t timeout_ms, const std::string& phase) {
  require(timeout_ms >= 0, phase, "negative timeout {} ms", timeout_ms);
  auto deadline = Deadline::after_ms(timeout_ms);
  Backoff backoff;
  while (completed_ < posted_) {
    const uint64_t before = completed_;
    drive(phase);
    if (completed_ >= posted_) break;
    if (deadline.expired()) return false;
    if (completed_ == before)
      backoff.pause();
    else
      backoff.reset();
  }
  return true;
}

void RmaSender::flush(int64_t timeout_ms, const std::string& phase) {
  std::lock_guard lock(mutex_);
  if (!drain_until(timeout_ms, phase))
    fail(phase, "{} of {} writes to {} did not complete within {} ms", posted_ - completed_,
         posted_, peer_, timeout_ms);
}

bool RmaSender::flush_some(int64_t timeout_ms, const std::string& phase) {
  std::lock_guard lock(mutex_);
  return drain_until(timeout_ms, phase);
}

}  // namespace proxyep
