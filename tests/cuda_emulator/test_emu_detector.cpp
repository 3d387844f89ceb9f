// The emulator's own checks, each against a kernel with one planted defect (and clean twins that
// must report nothing): a missing barrier, a shared write past the end, a read of an unwritten
// shared word, unequal ballot masks, threads at different barriers, a deadlock, a publish
// without the system fence, a payload store after the publish, a device-scope atomic on host
// memory, and a kernel that never ends (the watchdog, run by its own ctest entry).
#include "cuemu/testing.hpp"
#include "tests/cuda_emulator/kernels/detector_cases.hpp"

#include <cuda_runtime_api.h>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

using namespace cuemu_cases;
using cuemu::testing::take_faults;

namespace {

// Device memory of `count` T, freed at scope exit.
template <typename T>
struct Device {
  explicit Device(size_t count) { REQUIRE(cudaMalloc(&data, count * sizeof(T)) == cudaSuccess); }
  ~Device() { (void)cudaFree(data); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  std::vector<T> download(size_t count) const {
    std::vector<T> out(count);
    REQUIRE(cudaMemcpy(out.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
  T* data = nullptr;
};

// One 64-byte line of host memory registered as mapped, as a ring slot is.
struct MappedLine {
  MappedLine() { REQUIRE(cudaHostRegister(words, sizeof(words), cudaHostRegisterMapped) == 0); }
  ~MappedLine() { (void)cudaHostUnregister(words); }
  alignas(64) uint64_t words[8] = {};
};

bool reported(const std::vector<std::string>& faults, const std::string& kind) {
  for (const std::string& f : faults)
    if (f == kind) return true;
  return false;
}

}  // namespace

TEST_CASE("a barrier between the writes and the reads: clean and right") {
  take_faults();
  Device<int> out(128);
  CHECK(run_neighbours(out.data, true) == cudaSuccess);
  CHECK(take_faults().empty());
  const std::vector<int> got = out.download(128);
  for (int i = 0; i < 128; ++i)
    CHECK(got[static_cast<size_t>(i)] == (i % 64 + 1) % 64);
}

TEST_CASE("a missing barrier: a race (or a read of a word not yet written), the error sticky") {
  take_faults();
  Device<int> out(128);
  CHECK(run_neighbours(out.data, false) == cudaErrorLaunchFailure);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  // The first fault ends the launch; which comes first depends on the order the threads ran.
  const std::vector<std::string> faults = take_faults();
  CHECK((reported(faults, "race") || reported(faults, "uninit")));
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("a shared write one past the end hits the red zone") {
  take_faults();
  CHECK(run_past_end() == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "oob"));
}

TEST_CASE("a read of a shared word no thread wrote") {
  take_faults();
  Device<int> out(64);
  CHECK(run_unwritten(out.data) == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "uninit"));
}

TEST_CASE("a full warp's ballot, and a partial warp's") {
  for (int threads : {32, 64, 96}) {
    take_faults();
    Device<unsigned> out(static_cast<size_t>(threads));
    CHECK(run_ballot(out.data, threads) == cudaSuccess);
    CHECK(take_faults().empty());
    for (unsigned got : out.download(static_cast<size_t>(threads)))
      CHECK(got == 0x55555555u);
  }
  // 40 threads: the second warp has 8 lanes, and a full mask names 24 it does not have.
  take_faults();
  Device<unsigned> out(40);
  CHECK(run_ballot(out.data, 40) == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "ballot"));
}

TEST_CASE("lanes of one warp passing different ballot masks") {
  take_faults();
  Device<unsigned> out(32);
  CHECK(run_unequal_masks(out.data) == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "ballot"));
}

TEST_CASE("threads of a block waiting at different barriers") {
  take_faults();
  CHECK(run_split_barrier() == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "barrier"));
}

TEST_CASE("a barrier and a ballot waiting for each other: a deadlock, reported, not a hang") {
  take_faults();
  CHECK(run_deadlock() == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "deadlock"));
  // The emulator goes on: the next launch runs.
  Device<int> out(128);
  CHECK(run_neighbours(out.data, true) == cudaSuccess);
}

TEST_CASE("publishing to host memory: the system fence, then the release store") {
  MappedLine line;
  take_faults();
  CHECK(run_publish(line.words, PublishMode::fenced) == cudaSuccess);
  CHECK(take_faults().empty());
  CHECK(line.words[0] == 1);
  CHECK(line.words[1] == 42);

  CHECK(run_publish(line.words, PublishMode::unfenced) == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "unfenced"));
  CHECK(run_publish(line.words, PublishMode::late_payload) == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "late-payload"));
  CHECK(run_publish(line.words, PublishMode::device_scope) == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "scope"));
}

TEST_CASE("the same stores to device memory are not publications") {
  Device<uint64_t> words(8);
  take_faults();
  CHECK(run_publish(words.data, PublishMode::unfenced) == cudaSuccess);
  CHECK(run_publish(words.data, PublishMode::device_scope) == cudaSuccess);
  CHECK(take_faults().empty());
}

TEST_CASE("a kernel that never ends is ended by the watchdog (CUEMU_WATCHDOG_S)") {
  if (std::getenv("CUEMU_WATCHDOG_S") == nullptr) {
    MESSAGE("run by emu.detector_watchdog, which sets CUEMU_WATCHDOG_S");
    return;
  }
  take_faults();
  uint64_t word = 0;
  CHECK(run_spin(&word) == cudaErrorLaunchFailure);
  CHECK(reported(take_faults(), "watchdog"));
}
