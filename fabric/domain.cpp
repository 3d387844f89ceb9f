#include "fabric/domain.hpp"

#include "common/error.hpp"

namespace proxyep::fabric {

std::shared_ptr<DomainContext> DomainContext::open(InfoPtr info) {
  std::shared_ptr<DomainContext> context(new DomainContext());
  context->capabilities_ = capabilities_from(*info);
  fid_fabric* fabric = nullptr;
  check_fi(fi_fabric(info->fabric_attr, &fabric, nullptr), "fabric.open",
           fmt::format("fi_fabric({} {})", context->capabilities_.provider,
                       context->capabilities_.fabric_name));
  context->fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  check_fi(fi_domain(fabric, info.get(), &domain, nullptr), "fabric.open",
           fmt::format("fi_domain({} {})", context->capabilities_.provider,
                       context->capabilities_.domain_name));
  context->domain_.reset(domain);
  context->info_ = std::move(info);
  return context;
}

}  // namespace proxyep::fabric
