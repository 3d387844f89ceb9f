// One opened libfabric domain (one NIC) and the fabric it belongs to. Rails share it when there
// are fewer NICs than rails ("fake rails": several endpoints on one domain), and memory regions
// keep it alive until they are deregistered, because an MR must be closed before its domain.
#pragma once

#include "fabric/capabilities.hpp"
#include "fabric/resources.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace proxyep::fabric {

class DomainContext {
 public:
  // Opens fi_fabric + fi_domain for one fi_getinfo entry. Throws proxyep::Error("fabric.open").
  static std::shared_ptr<DomainContext> open(InfoPtr info);

  const fi_info& info() const { return *info_; }
  fid_domain* domain() const { return domain_.get(); }
  const Capabilities& capabilities() const { return capabilities_; }

  // A key for fi_mr_regattr when the provider lets the application choose (no FI_MR_PROV_KEY).
  // Random (common/crypto.hpp's CSPRNG) over the provider's key width (mr_key_size bytes, at
  // most 8), so a peer cannot derive another region's key from its own, as it could from
  // sequential keys; never 0 or all ones (FI_KEY_NOTAVAIL); never handed out twice by this
  // domain, not even after the region is gone (fake rails register on a shared domain, and a
  // stale key must not reach new memory). Throws proxyep::Error("fabric.register") when the key
  // space is exhausted. Thread-safe.
  uint64_t requested_key();
  // Bits of the keys requested_key() draws: 8 x mr_key_size, 64 when the provider gives no
  // size or one above 8 bytes (raw keys, which requested keys do not use).
  int key_bits() const;

 private:
  DomainContext() = default;
  // Declaration order is close order reversed: domain, then fabric, then the info.
  InfoPtr info_;
  FabricPtr fabric_;
  DomainPtr domain_;
  Capabilities capabilities_;
  std::mutex keys_mutex_;
  std::unordered_set<uint64_t> keys_;  // every key requested_key() handed out
};

}  // namespace proxyep::fabric
