#include "fabric/domain.hpp"

#include "common/crypto.hpp"
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

int DomainContext::key_bits() const {
  size_t bytes = capabilities_.mr_key_size;
  return bytes >= 1 && bytes < 8 ? static_cast<int>(bytes * 8) : 64;
}

uint64_t DomainContext::requested_key() {
  const int bits = key_bits();
  const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  std::lock_guard lock(keys_mutex_);
  // Tiny key spaces (a byte or two) can run out; 64-bit ones never collide in practice.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    uint64_t key = secure_random_u64() & mask;
    if (key == 0 || key == mask || key == FI_KEY_NOTAVAIL) continue;
    if (keys_.insert(key).second) return key;
  }
  fail("fabric.register",
       "no unused memory key left on {} {}: the provider's keys are {} bits and this domain has "
       "handed out {}",
       capabilities_.provider, capabilities_.domain_name, bits, keys_.size());
}

}  // namespace proxyep::fabric
