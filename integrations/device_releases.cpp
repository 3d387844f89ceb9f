// DeviceReleases (device_releases.hpp).
#include "integrations/device_releases.hpp"

#include "common/log.hpp"

#include <chrono>
#include <exception>

namespace proxyep::integrations {

namespace {

constexpr const char* kPhase = "device output release";

}  // namespace

DeviceReleases::~DeviceReleases() {
  // No call of the Buffer can queue behind these waits any more: it is gone.
  for (Pending& p : pending_) {
    try {
      device_->wait_event(p.point, std::chrono::milliseconds(0));
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
