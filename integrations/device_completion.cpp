// DeviceCompletion (device_completion.hpp).
#include "integrations/device_completion.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

#include <atomic>
#include <chrono>

namespace proxyep::integrations {

namespace {

constexpr uint64_t kPageBytes = 4096;

std::chrono::milliseconds task_timeout() {
  return std::chrono::milliseconds(params::ep_timeout_ms.get());
}

}  // namespace

DeviceCompletion::DeviceCompletion(std::shared_ptr<gpu_side::device::DeviceRuntime> device)
    : device_(std::move(device)), page_(HostMemory::heap(kPageBytes)) {
  word_ = reinterpret_cast<uint64_t*>(page_.bytes().data());
  *word_ = 0;
  open();
}

void DeviceCompletion::open() {
  stream_ = device_->open_stream();
  word_on_device_ =
      static_cast<const uint64_t*>(stream_->register_host(page_.bytes().data(), kPageBytes));
  last_ = nullptr;
}

DeviceCompletion::~DeviceCompletion() {
  reach(issued_);
  try {
    stream_->synchronize("buffer teardown (device completions)", task_timeout());
  } catch (const Error& e) {
    log::warn("{}", e.what());
  }
  try {
    stream_->unregister_host(page_.bytes().data());
  } catch (const Error& e) {
    log::warn("{}", e.what());
  }
}

void DeviceCompletion::check(std::string_view phase) {
  if (last_ == nullptr) return;
  try {
    (void)stream_->reached(*last_, phase);  // throws for a failed wait
  } catch (const Error& e) {
    // The failed stream's waits no longer wait: replace it, once the word let it drain.
    const std::string why = e.what();
    reach(issued_);
    try {
      stream_->synchronize(phase, task_timeout());
    } catch (const Error&) {
      // the failure reported below
    }
    stream_->unregister_host(page_.bytes().data());
    open();
    fail(std::string(phase),
         "an async call's completion was not signalled in time ({}); a stream that waited for "
         "its event may have read incomplete outputs",
         why);
  }
}

DeviceCompletion::Point DeviceCompletion::next(std::string_view phase) {
  const uint64_t number = ++issued_;
  // The task's own deadlines fail it (and raise the word) long before this one.
  stream_->wait_value(word_on_device_, number, 4 * task_timeout(), phase);
  last_ = stream_->record();
  return {number, last_};
}

void DeviceCompletion::reach(uint64_t number) {
  std::atomic_ref<uint64_t> word(*word_);
  uint64_t now = word.load(std::memory_order_relaxed);
  while (now < number && !word.compare_exchange_weak(now, number, std::memory_order_release)) {
  }
}

}  // namespace proxyep::integrations
