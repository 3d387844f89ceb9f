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
  ssize_t rc = post_rma(*slot, nullptr, nullptr, 0, remote, 0, FI_COMPLETION);
  if (rc == 0) {
    if (probes_posted_.empty()) probes_posted_.assign(static_cast<size_t>(num_peers()), 0);
    ++probes_posted_[static_cast<size_t>(peer)];
    ++probes_in_flight_;
    return Status::ok;
  }
  writes_->release(slot);
  if (rc == -FI_EAGAIN) return Status::again;
  throw Error("fabric.connect",
              fmt::format("rail {} of rank {}: posting the connection probe to rank {} failed: {}",
                          options_.index, options_.rank, peer, fi_error_text(rc)));
}

void Rail::finish_probe(OpSlot* slot, const std::string* failure) {
  --probes_posted_[static_cast<size_t>(slot->peer)];
  --probes_in_flight_;
  if (failure != nullptr && !probe_failure_)
    probe_failure_ = fmt::format("opening the connection to rank {}: {}", slot->peer, *failure);
  writes_->release(slot);
}

void Rail::post_queued_probes() {
  while (!probes_queued_.empty()) {
    const Probe& probe = probes_queued_.front();
    if (post_probe(probe.peer, probe.remote) != Status::ok) return;  // again: after completions
    probes_queued_.pop_front();
  }
}

bool Rail::probes_done() const {
  if (probe_failure_) throw Error("fabric.connect", *probe_failure_);
  return probes_queued_.empty() && probes_in_flight_ == 0;
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
