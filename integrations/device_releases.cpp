// DeviceReleases (device_releases.hpp).
#include "integrations/device_releases.hpp"

#include "common/log.hpp"

#include <exception>

namespace proxyep::integrations {

namespace {

constexpr const char* kPhase = "device output release";

}  // namespace

DeviceReleases::~DeviceReleases() {
  const bool capturing = device_->capturing();
  for (Pending& p : pending_) {
    if (capturing) break;
    try {
      device_->wait_for(*p.point, kPhase, timeout_);
    } catch (const std::exception& e) {
      log::warn("buffer: a device output was released before its reader's stream passed it: {}",
                e.what());
    }
  }
}

bool DeviceReleases::reached(const Pending& pending) noexcept {
  try {
    return device_->reached(*pending.point, kPhase);
  } catch (const std::exception& e) {
    log::debug("buffer: a device output's release point cannot be asked for ({}); released",
               e.what());
    return true;
  }
}

void DeviceReleases::collect() noexcept {
  std::vector<Pending> done;  // dropped outside the lock: freeing queues on the device
  {
    std::lock_guard lock(mutex_);
    if (pending_.empty() || device_->capturing()) return;
    std::vector<Pending> waiting;
    for (Pending& p : pending_)
      (reached(p) ? done : waiting).push_back(std::move(p));
    pending_ = std::move(waiting);
  }
}

void DeviceReleases::release(gpu_side::ep::Tensor storage,
                             std::shared_ptr<gpu_side::device::DeviceEvent> point) noexcept {
  collect();
  if (point == nullptr || device_->capturing()) return;  // `storage` goes now
  try {
    std::lock_guard lock(mutex_);
    pending_.push_back({std::move(storage), std::move(point)});
  } catch (const std::exception& e) {
    log::warn("buffer: a device output released at once: {}", e.what());
  }
}

size_t DeviceReleases::pending() const {
  std::lock_guard lock(mutex_);
  return pending_.size();
}

}  // namespace proxyep::integrations
