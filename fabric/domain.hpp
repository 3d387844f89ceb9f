// One opened libfabric domain (one NIC) and the fabric it belongs to. Rails share it when there
// are fewer NICs than rails ("fake rails": several endpoints on one domain), and memory regions
// keep it alive until they are deregistered, because an MR must be closed before its domain.
#pragma once

#include "fabric/capabilities.hpp"
#include "fabric/resources.hpp"

#include <atomic>
#include <cstdint>
#include <memory>

namespace proxyep::fabric {

class DomainContext {
 public:
  // Opens fi_fabric + fi_domain for one fi_getinfo entry. Throws proxyep::Error("fabric.open").
  static std::shared_ptr<DomainContext> open(InfoPtr info);

  const fi_info& info() const { return *info_; }
  fid_domain* domain() const { return domain_.get(); }
  const Capabilities& capabilities() const { return capabilities_; }

  // A key for fi_mr_regattr when the provider lets the application choose (no FI_MR_PROV_KEY):
  // keys must be unique within a domain, and fake rails register on a shared one.
  uint64_t next_requested_key() { return next_key_.fetch_add(1, std::memory_order_relaxed); }

 private:
  DomainContext() = default;
  // Declaration order is close order reversed: domain, then fabric, then the info.
  InfoPtr info_;
  FabricPtr fabric_;
  DomainPtr domain_;
  Capabilities capabilities_;
  std::atomic<uint64_t> next_key_{1};
};

}  // namespace proxyep::fabric
