// Connection probes of a Rail (rail.hpp, Fabric::open_connections).
//
// A probe is a zero-length RMA write without FI_REMOTE_CQ_DATA: it moves no byte and raises no
// completion at the target (we never ask for FI_RMA_EVENT), yet a connection-oriented provider
// must open its connection to the peer to carry it. Its local completion is absorbed here, so
// the layers above never see a write they did not post.
#include "common/error.hpp"
#include "fabric/rail.hpp"
#include "fabric/rail_slot.hpp"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

namespace proxyep::fabric {

void Rail::queue_probe(int peer, const RemoteTarget& remote) {
  require(peer >= 0 && peer < num_peers(), "fabric.connect",
          "rail {} of rank {}: a connection probe to rank {} ({} connected)", options_.index,
          options_.rank, peer, num_peers());
  probes_queued_.push_back({peer, remote});
}

Status Rail::post_probe(int peer, const RemoteTarget& remote) {
  OpSlot* slot = writes_->acquire();
  if (slot == nullptr) return Status::again;
  *slot = OpSlot{};
  slot->probe = true;
  slot->peer = peer;
  slot->remote_address = remote.address;
  slot->remote_key = remote.key;
  iovec iov{nullptr, 0};
  void* desc = nullptr;
  fi_rma_iov rma{remote.address, 0, remote.key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = peers_[static_cast<size_t>(peer)];
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = slot;
  ssize_t rc = fi_writemsg(endpoint_.get(), &msg, FI_COMPLETION);
  if (rc == 0) {
    if (probes_posted_.empty()) probes_posted_.assign(static_cast<size_t>(num_peers()), 0);
    ++probes_posted_[static_cast<size_t>(peer)];
    return Status::ok;
  }
  writes_->release(slot);
  if (rc == -FI_EAGAIN) return Status::again;
  throw Error("fabric.connect",
              fmt::format("rail {} of rank {}: posting the connection probe to rank {} failed: {}",
                          options_.index, options_.rank, peer, fi_error_text(rc)));
}

bool Rail::finish_probe(OpSlot* slot, const std::string* failure) {
  const auto peer = static_cast<size_t>(slot->peer);
  if (peer >= probes_posted_.size() || probes_posted_[peer] == 0) return false;
  --probes_posted_[peer];
  if (failure != nullptr && !probe_failure_)
    probe_failure_ = fmt::format("opening the connection to rank {}: {}", slot->peer, *failure);
  writes_->release(slot);
  return true;
}

bool Rail::probes_done() {
  while (!probes_queued_.empty()) {
    const Probe& probe = probes_queued_.front();
    if (post_probe(probe.peer, probe.remote) != Status::ok) break;
    probes_queued_.pop_front();
  }
  progress();
  if (probe_failure_) throw Error("fabric.connect", *probe_failure_);
  if (!probes_queued_.empty()) return false;
  for (int count : probes_posted_)
    if (count > 0) return false;
  return true;
}

std::vector<int> Rail::peers_probed() const {
  std::vector<int> peers;
  for (size_t peer = 0; peer < probes_posted_.size(); ++peer)
    if (probes_posted_[peer] > 0) peers.push_back(static_cast<int>(peer));
  for (const Probe& probe : probes_queued_)
    peers.push_back(probe.peer);
  return peers;
}

}  // namespace proxyep::fabric
