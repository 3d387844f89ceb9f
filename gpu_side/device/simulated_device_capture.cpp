// SimulatedDevice's stream capture (simulated_device.hpp): operations recorded between
// begin_capture and end_capture, and launched again as a graph.
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/device/simulated_device_core.hpp"

#include <fmt/format.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace proxyep::gpu_side::device {

namespace {

// Runs the releases a capture deferred (Core::release, which queues them on the live stream).
void run_releases(std::vector<std::function<void()>>& releases) {
  for (auto& release : releases)
    release();
  releases.clear();
}

}  // namespace

// The recorded operations, and the memory they may use that lost its last owner meanwhile.
struct SimulatedDevice::Graph final : DeviceGraph {
  std::shared_ptr<Core> stream;               // keeps the deferred releases' streams alive:
  std::vector<std::shared_ptr<Core>> joined;  // the origin's and the joined ones'
  std::vector<Core::Op> ops;
  std::vector<std::function<void()>> releases;
  ~Graph() override { run_releases(releases); }
};

void SimulatedDevice::begin_capture(std::string_view phase) {
  std::lock_guard lock(core_->mutex);
  require(!core_->capture, phase, "begin_capture: the stream is already being captured (by {})",
          core_->capture ? core_->capture->phase : "");
  core_->require_healthy(phase);
  core_->capture = std::make_shared<Core::Capture>();
  core_->capture->phase = std::string(phase);
  core_->capture->origin = core_.get();
}

std::unique_ptr<DeviceGraph> SimulatedDevice::end_capture(std::string_view phase) {
  std::shared_ptr<Core::Capture> ended;
  {
    std::lock_guard lock(core_->mutex);
    require(core_->capture != nullptr, phase, "end_capture: the stream is not being captured");
    require(core_->capture->origin == core_.get(), phase,
            "end_capture: the stream joined a capture begun on another stream (by {}); end it "
            "there",
            core_->capture->phase);
    ended = std::move(core_->capture);
    core_->capture.reset();
  }
  std::vector<Core::Capture::Joined> joined;
  {
    std::lock_guard recording(ended->mutex);
    ended->ended = true;
    joined = ended->joined;
  }
  // The joined streams leave the capture with it: what they queue from now on runs.
  for (const Core::Capture::Joined& j : joined) {
    std::lock_guard lock(j.stream->mutex);
    if (j.stream->capture == ended) j.stream->capture.reset();
  }
  auto graph = std::make_unique<Graph>();
  std::optional<std::string> invalid;
  {
    std::lock_guard recording(ended->mutex);
    for (const Core::Capture::Joined& j : joined)
      if (j.joined_back < j.recorded && !ended->invalid)
        ended->invalid = fmt::format(
            "a stream that joined it was not joined back: {} of its operations come after the "
            "last event of it the capturing stream waited for",
            j.recorded - j.joined_back);
    invalid = ended->invalid;
    graph->ops = std::move(ended->ops);
    graph->releases = std::move(ended->releases);
  }
  // Unlocked: a release locks its stream, and a stream records with its lock held first.
  if (invalid) {
    run_releases(graph->releases);
    fail(std::string(phase), "end_capture: the capture is invalid: {}", *invalid);
  }
  graph->stream = core_;
  for (Core::Capture::Joined& j : joined)
    graph->joined.push_back(std::move(j.stream));
  return graph;
}

void SimulatedDevice::launch(const DeviceGraph& graph, std::string_view phase) {
  const auto* simulated = dynamic_cast<const Graph*>(&graph);
  require(simulated != nullptr && simulated->stream->memory == core_->memory, phase,
          "launch: the graph was not captured on a stream of this device");
  {
    std::lock_guard lock(core_->mutex);
    require(!core_->capture, phase,
            "launch: the stream is being captured (by {}); a simulated graph does not nest",
            core_->capture ? core_->capture->phase : "");
    core_->require_healthy(phase);
    for (const Core::Op& op : simulated->ops) {
      core_->queue.push_back(op);  // a copy: the graph runs again at its next launch
      ++core_->queued;
    }
  }
  core_->wake.notify_one();
}

bool SimulatedDevice::capturing() const {
  std::lock_guard lock(core_->mutex);
  return core_->capture != nullptr;
}

}  // namespace proxyep::gpu_side::device
