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
  auto usable = [&](uint64_t key) {
    return key != 0 && key != mask && key != FI_KEY_NOTAVAIL && !keys_.contains(key);
  };
  // Random keys first (a stale writer cannot guess the next one); 64-bit spaces never collide
  // in practice.
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint64_t key = secure_random_u64() & mask;
    if (!usable(key)) continue;
    keys_.insert(key);
    return key;
  }
  // A nearly full small space (a byte or two) would make random tries miss its last free keys
  // now and then: walk it from a random start instead, so it runs out only when it is full.
  if (bits <= 24) {
    const uint64_t start = secure_random_u64() & mask;
    for (uint64_t i = 0; i <= mask; ++i) {
      const uint64_t key = (start + i) & mask;
      if (!usable(key)) continue;
      keys_.insert(key);
      return key;
    }
  }
  fail("fabric.register",
       "no unused memory key left on {} {}: the provider's keys are {} bits and this domain has "
       "handed out {}",
       capabilities_.provider, capabilities_.domain_name, bits, keys_.size());
}

}  // namespace proxyep::fabric
