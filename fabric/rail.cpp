#include "fabric/rail.hpp"

#include "common/log.hpp"
#include "fabric/rail_slot.hpp"
#include "fabric/shm_stale.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstring>

namespace proxyep::fabric {
namespace {

constexpr size_t kMaxPostedReceives = 4096;  // FI_RX_CQ_DATA: receives kept posted

}  // namespace

Rail::Rail(std::shared_ptr<DomainContext> domain, const RailOptions& options)
    : options_(options), domain_(std::move(domain)) {
  require(options_.cq_size >= 1 && options_.cq_batch >= 1, "fabric.open",
          "cq_size and cq_batch must be positive (got {} and {})", options_.cq_size,
          options_.cq_batch);
  const Capabilities& caps = domain_->capabilities();
  if (caps.cq_data_size < sizeof(uint64_t))
    data_mask_ = (uint64_t{1} << (8 * caps.cq_data_size)) - 1;
  rx_cq_data_ = (caps.mode & FI_RX_CQ_DATA) != 0;
  // More writes in flight than CQ entries could overrun the CQ (EFA does not prevent it).
  size_t slots = std::max<size_t>(1, std::min(caps.tx_size, options_.cq_size));
  writes_ = std::make_unique<SlotPool<OpSlot>>(slots);
  size_t receives = rx_cq_data_ ? std::min(caps.rx_size, kMaxPostedReceives) : 0;
  receives_ = std::make_unique<SlotPool<OpSlot>>(receives);
  cq_buffer_.resize(options_.cq_batch);
  pending_.reserve(options_.cq_batch * 2);
  open_objects();
  receives_to_post_ = receives;
  check_fi(static_cast<int>(post_receives()), "fabric.open",
           fmt::format("rail {}: posting receives for FI_RX_CQ_DATA", options_.index));
  log::debug("fabric: rail {} open on {} {} (address {}, {} write slots{})", options_.index,
             caps.provider, caps.domain_name, address_text(), slots,
             rx_cq_data_ ? fmt::format(", {} receives for FI_RX_CQ_DATA", receives) : "");
}

Rail::~Rail() = default;

std::string Rail::address_text() const {
  std::string text(256, '\0');
  size_t length = text.size();
  if (fi_av_straddr(av_.get(), address_.data(), text.data(), &length) == nullptr)
    return fmt::format("{} bytes", address_.size());
  text.resize(std::min(length, text.size()) - (length > 0 ? 1 : 0));  // length counts the NUL
  return text;
}

size_t Rail::writes_in_flight() const {
  return writes_->in_use();
}

void Rail::open_objects() {
  const fi_info& info = domain_->info();
  std::string what =
      fmt::format("rail {} ({} {})", options_.index, domain_->capabilities().provider,
                  domain_->capabilities().domain_name);
  fid_ep* endpoint = nullptr;
  check_fi(fi_endpoint(domain_->domain(), const_cast<fi_info*>(&info), &endpoint, nullptr),
           "fabric.open", what + ": fi_endpoint");
  endpoint_.reset(endpoint);

  fi_cq_attr cq_attr{};
  cq_attr.size = options_.cq_size;
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_NONE;  // the proxy busy-polls; no fd or signal to maintain
  fid_cq* cq = nullptr;
  check_fi(fi_cq_open(domain_->domain(), &cq_attr, &cq, nullptr), "fabric.open",
           what + ": fi_cq_open");
  cq_.reset(cq);

  fi_av_attr av_attr{};
  av_attr.type =
      info.domain_attr->av_type != FI_AV_UNSPEC ? info.domain_attr->av_type : FI_AV_TABLE;
  // count stays 0, the provider's default: the world size is unknown here, and a larger hint
  // than the provider's peer limit (shm: 256) fails fi_av_open with -FI_ENOSYS.
  fid_av* av = nullptr;
  check_fi(fi_av_open(domain_->domain(), &av_attr, &av, nullptr), "fabric.open",
           what + ": fi_av_open");
  av_.reset(av);

  check_fi(fi_ep_bind(endpoint, &av->fid, 0), "fabric.open", what + ": binding the AV");
  check_fi(fi_ep_bind(endpoint, &cq->fid, FI_TRANSMIT | FI_RECV), "fabric.open",
           what + ": binding the CQ");
  // Whatever the provider (efa opens shm endpoints of its own for peers on the node): dead
  // processes' regions hold RAM, and one named after this pid blocks fi_enable (shm_stale.hpp).
  remove_stale_shm_regions();
  check_fi(fi_enable(endpoint), "fabric.open", what + ": fi_enable");

  size_t length = 0;
  int rc = fi_getname(&endpoint->fid, nullptr, &length);
  require(rc == -FI_ETOOSMALL && length > 0, "fabric.open", "{}: fi_getname size query: {}", what,
          fi_error_text(rc));
  address_.resize(length);
  check_fi(fi_getname(&endpoint->fid, address_.data(), &length), "fabric.open",
           what + ": fi_getname");
  address_.resize(length);
}

// Keeps zero-length receives posted for FI_RX_CQ_DATA providers; each CQ-data write consumes
// one. A repost that hits -FI_EAGAIN is retried on the next progress(); other failures are
// returned.
ssize_t Rail::post_receives() {
  while (receives_to_post_ > 0) {
    OpSlot* slot = receives_->acquire();
    if (slot == nullptr) break;
    *slot = OpSlot{};
    slot->is_receive = true;
    ssize_t rc = fi_recv(endpoint_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, slot);
    if (rc != 0) {
      receives_->release(slot);
      return rc == -FI_EAGAIN ? 0 : rc;
    }
    --receives_to_post_;
  }
  return 0;
}

void Rail::connect(const std::vector<Bytes>& addresses_by_rank) {
  std::string what = fmt::format("rail {} of rank {}", options_.index, options_.rank);
  require(peers_.empty(), "fabric.connect", "{} is already connected", what);
  require(!addresses_by_rank.empty(), "fabric.connect", "{}: no addresses given", what);
  std::vector<fi_addr_t> peers;
  peers.reserve(addresses_by_rank.size());
  for (size_t rank = 0; rank < addresses_by_rank.size(); ++rank) {
    const Bytes& address = addresses_by_rank[rank];
    require(!address.empty(), "fabric.connect", "{}: empty address for rank {}", what, rank);
    fi_addr_t fi_addr = FI_ADDR_NOTAVAIL;
    int rc = fi_av_insert(av_.get(), address.data(), 1, &fi_addr, 0, nullptr);
    require(rc == 1 && fi_addr != FI_ADDR_NOTAVAIL, "fabric.connect",
            "{}: inserting the address of rank {} ({} bytes) failed: {}", what, rank,
            address.size(), rc < 0 ? fi_error_text(rc) : "address rejected");
    peers.push_back(fi_addr);
  }
  peers_ = std::move(peers);
}

std::optional<std::string> Rail::invalid(const WriteOp& op) const {
  std::string problem;
  if (op.peer < 0 || op.peer >= num_peers())
    problem = fmt::format("no such peer ({} connected)", num_peers());
  else if (op.length > 0 && op.local == nullptr)
    problem = fmt::format("{} bytes from a null source", op.length);
  else if (op.length > 0 && op.local_desc == nullptr && capabilities().mr_local)
    problem = fmt::format(
        "{} needs the local descriptor (FI_MR_LOCAL): pass the region's "
        "local_desc(rail)",
        capabilities().provider);
  if (problem.empty()) return std::nullopt;
  return fmt::format("rail {} of rank {}: write to rank {} (cookie {}): {}", options_.index,
                     options_.rank, op.peer, op.cookie, problem);
}

ssize_t Rail::post_rma(OpSlot& slot, const void* local, void* local_desc, size_t length,
                       const RemoteTarget& remote, uint64_t cq_data, uint64_t flags) {
  // A zero-length write still passes one (empty) iov and one rma_iov: providers want them.
  iovec iov{const_cast<void*>(local), length};
  void* desc = local_desc;
  fi_rma_iov rma{remote.address, length, remote.key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = peers_[static_cast<size_t>(slot.peer)];
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = &slot;
  msg.data = cq_data & data_mask_;
  return fi_writemsg(endpoint_.get(), &msg, flags);
}

Status Rail::write_raw(const WriteOp& op, uint64_t cq_data) {
  if (auto problem = invalid(op)) return fail_post(Status::error, std::move(*problem));
  OpSlot* slot = writes_->acquire();
  if (slot == nullptr) {
    progress();  // completions are what free slots
    return Status::again;
  }
  *slot = OpSlot{};
  slot->peer = op.peer;
  slot->cookie = op.cookie;
  slot->length = op.length;
  slot->remote_address = op.remote.address;
  slot->remote_key = op.remote.key;

  uint64_t flags = FI_REMOTE_CQ_DATA | FI_COMPLETION | (op.more ? FI_MORE : 0);
  ssize_t rc = post_rma(*slot, op.local, op.local_desc, op.length, op.remote, cq_data, flags);
  if (rc == 0) return Status::ok;
  writes_->release(slot);
  if (rc == -FI_EAGAIN) {
    progress();
    return Status::again;
  }
  return fail_post(
      Status::error,
      fmt::format("rail {} of rank {}: posting a write of {} bytes to rank {} "
                  "(cookie {}) failed: {}",
                  options_.index, options_.rank, op.length, op.peer, op.cookie, fi_error_text(rc)));
}

Status Rail::fail_post(Status status, std::string text) {
  last_error_ = std::move(text);
  last_failed_cookie_.reset();
  return status;
}

}  // namespace proxyep::fabric
