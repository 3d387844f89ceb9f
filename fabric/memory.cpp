#include "fabric/memory.hpp"

#include "common/log.hpp"

#ifdef PROXYEP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace proxyep::fabric {
namespace {

constexpr const char* kPhase = "fabric.register";
// Local source of writes, and target of peers' writes. Nothing else: EFA checks access bits.
constexpr uint64_t kAccess = FI_WRITE | FI_REMOTE_WRITE;

// The fi_mr_attr fields that say where the memory lives.
void describe_memory(fi_mr_attr& attr, const void* data, MemoryKind kind,
                     const Capabilities& caps) {
  if (kind == MemoryKind::host) {
    attr.iface = FI_HMEM_SYSTEM;
    return;
  }
#ifdef PROXYEP_HAVE_CUDA
  require(caps.hmem, kPhase, "provider {} ({}) cannot register CUDA memory (no FI_HMEM)",
          caps.provider, caps.domain_name);
  cudaPointerAttributes pointer{};
  cudaError_t rc = cudaPointerGetAttributes(&pointer, data);
  require(rc == cudaSuccess, kPhase, "cudaPointerGetAttributes({}) failed: {}", data,
          cudaGetErrorString(rc));
  require(pointer.type == cudaMemoryTypeDevice, kPhase,
          "{} is not CUDA device memory (cudaMemoryType {})", data, static_cast<int>(pointer.type));
  attr.iface = FI_HMEM_CUDA;
  attr.device.cuda = pointer.device;
#else
  (void)data;
  fail(kPhase, "cannot register CUDA memory on {}: this build has no CUDA support", caps.provider);
#endif
}

class RegisteredRegion final : public MemoryRegion {
 public:
  RegisteredRegion(void* data, size_t size, MemoryKind kind)
      : data_(data), size_(size), kind_(kind) {}

  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  MemoryKind kind() const override { return kind_; }
  void* local_desc(int rail) const override {
    require(rail >= 0 && static_cast<size_t>(rail) < rails_.size(), kPhase,
            "rail {} out of range ({} rails)", rail, rails_.size());
    return rails_[static_cast<size_t>(rail)].desc;
  }
  RegionDescriptor descriptor() const override {
    RegionDescriptor descriptor;
    descriptor.length = size_;
    for (const PerRail& rail : rails_)
      descriptor.rails.push_back(rail.target);
    return descriptor;
  }

  void add_rail(Rail& rail) {
    DomainContext& domain = rail.domain();
    const Capabilities& caps = domain.capabilities();
    iovec iov{data_, size_};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = kAccess;
    attr.requested_key = caps.mr_prov_key ? 0 : domain.requested_key();
    describe_memory(attr, data_, kind_, caps);
    fid_mr* raw = nullptr;
    std::string what = fmt::format("registering {} bytes at {} on rail {} ({} {})", size_, data_,
                                   rail.rail_index(), caps.provider, caps.domain_name);
    check_fi(fi_mr_regattr(domain.domain(), &attr, 0, &raw), kPhase, what);
    PerRail entry;
    entry.domain = rail.domain_handle();
    entry.mr.reset(raw);
    if ((caps.mr_mode & FI_MR_ENDPOINT) != 0) {
      check_fi(fi_mr_bind(raw, &rail.endpoint()->fid, 0), kPhase, what + ": fi_mr_bind");
      check_fi(fi_mr_enable(raw), kPhase, what + ": fi_mr_enable");
    }
    entry.desc = fi_mr_desc(raw);
    uint64_t key = fi_mr_key(raw);
    require(key != FI_KEY_NOTAVAIL, kPhase, "{}: the provider has no key for it", what);
    entry.target.key = key;
    entry.target.address = caps.mr_virt_addr ? reinterpret_cast<uint64_t>(data_) : 0;
    rails_.push_back(std::move(entry));
  }

 private:
  struct PerRail {
    std::shared_ptr<DomainContext> domain;  // declared first: outlives the MR closed before it
    MrPtr mr;
    void* desc = nullptr;
    RemoteTarget target;
  };
  void* data_;
  size_t size_;
  MemoryKind kind_;
  std::vector<PerRail> rails_;
};

}  // namespace

std::unique_ptr<MemoryRegion> register_region(const std::vector<Rail*>& rails, void* data,
                                              size_t size, MemoryKind kind) {
  require(data != nullptr && size > 0, kPhase, "cannot register {} bytes at {}", size, data);
  require(!rails.empty(), kPhase, "no rails to register on");
  auto region = std::make_unique<RegisteredRegion>(data, size, kind);
  for (Rail* rail : rails)
    region->add_rail(*rail);
  log::debug("fabric: registered {} bytes at {} on {} rails (key {:#x} on rail 0)", size, data,
             rails.size(), region->descriptor().rails[0].key);
  return region;
}

}  // namespace proxyep::fabric
