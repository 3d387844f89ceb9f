// Buffer calls with device tensors on the host-simulated device, ranks as threads
// (device_buffer_case.hpp). Rank 1's device runs nothing until waited for, so a missing wait
// shows as stale bytes; device memory is tagged so that host code touching it faults.
#include "common/params.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"
#include "tests/unit/integrations/device_buffer_case.hpp"
#include "tests/unit/integrations/device_ll_captured_case.hpp"
#include "tests/unit/integrations/device_ll_case.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using gpu_side::device::SimulatedDevice;
using gpu_side::device::SimulatedDeviceOptions;

namespace {

// Rank 1's Buffer stream runs nothing until waited for; every caller stream is slow (20 ms per
// operation), so an input read without waiting for its previous_event is stale.
integrations::testing::RankDevice simulated(int rank) {
  auto buffer = std::make_shared<SimulatedDevice>(
      SimulatedDeviceOptions{.defer_until_synchronize = rank == 1});
  auto caller = buffer->another_stream({.operation_delay = std::chrono::milliseconds(20)});
  return {buffer, caller};
}

// The other way round: the Buffer's stream is slow (5 ms per operation) and the caller's quick,
// so a call that leaves work reading its inputs queued when it returns finds them overwritten by
// the caller's stream (device_ll_case.hpp overwrites the combine's inputs at once), and over the
// fabric a write the stream did not hold back until its packing ran sends stale bytes.
integrations::testing::RankDevice slow_buffer_stream(int) {
  auto buffer = std::make_shared<SimulatedDevice>(
      SimulatedDeviceOptions{.operation_delay = std::chrono::milliseconds(5)});
  return {buffer, buffer->another_stream()};
}

// Memory the NIC reads (GPUDirect RDMA's stand-in): over shm, which registers device memory
// (FI_HMEM) in a build with CUDA, the chunks are packed into device staging and written from
// there; over tcp, which does not, they bounce through the host staging area as without it.
integrations::testing::RankDevice nic_reads_device_memory(int rank) {
  auto buffer = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{
      .defer_until_synchronize = rank == 1, .nic_reads_device_memory = true});
  auto caller = buffer->another_stream({.operation_delay = std::chrono::milliseconds(20)});
  return {buffer, caller};
}

// The Buffer's stream faults on an item-list pack (the "ll_pack" kernel): a device dispatch must
// pack from its own routing on the device (ll_route + ll_pack_routed), never from a list of
// messages the host made from a copy of topk_idx.
integrations::testing::RankDevice no_item_list_pack(int rank) {
  auto buffer = std::make_shared<SimulatedDevice>(
      SimulatedDeviceOptions{.defer_until_synchronize = rank == 1, .fail_operation = "ll_pack"});
  auto caller = buffer->another_stream({.operation_delay = std::chrono::milliseconds(20)});
  return {buffer, caller};
}

// The Buffer's device reads back at most 16 bytes per copy: a device LL call reads only the
// records' counts (4 experts, 16 bytes) and single counters (bad values, mismatching entries),
// never topk_idx (256 bytes here) or anything of its size.
integrations::testing::RankDevice counts_only_read_back(int rank) {
  auto buffer = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{
      .defer_until_synchronize = rank == 1,
      .max_read_back_bytes =
          4 * integrations::testing::ll::kLocal * integrations::testing::ll::kRanks});
  auto caller = buffer->another_stream({.operation_delay = std::chrono::milliseconds(20)});
  return {buffer, caller};
}

// Whether `provider` registers device memory here (FI_HMEM: shm does, tcp does not; a build
// without CUDA asks no provider for it).
bool registers_device_memory(const std::string& provider) {
  return fabric::Fabric::open(fabric::testing::options_for(provider, 0))->capabilities().hmem;
}

// ep.async_wait = device for a scope: async_finish calls waited for at their device points
// (their caller's stream), not on the host (the default).
struct DevicePoints {
  DevicePoints() { params::ep_async_wait.set("device"); }
  ~DevicePoints() { params::ep_async_wait.reset(); }
  DevicePoints(const DevicePoints&) = delete;
  DevicePoints& operator=(const DevicePoints&) = delete;
};

}  // namespace

TEST_CASE("device tensors through the Buffer: node peers (ranks as threads)") {
  integrations::testing::run_device_buffer(integrations::testing::kRanks, simulated);
  const DevicePoints device_points;
  integrations::testing::run_device_buffer(integrations::testing::kRanks, simulated);
}

TEST_CASE("device tensors through the Buffer: over the fabric with the reorder shim") {
  const DevicePoints device_points;
  integrations::testing::run_device_buffer(1, simulated);
}

TEST_CASE("device tensors through the Buffer: over the fabric, a slow Buffer stream") {
  integrations::testing::run_device_buffer(1, slow_buffer_stream);
}

TEST_CASE("device tensors through the Buffer: 2 nodes x 2, hierarchical internode") {
  // Forwarder rows, lanes and the in-node reduce on the devices' streams; async calls, a cached
  // dispatch and one call mixing a host rank with device ranks, against the by_node reference.
  integrations::testing::run_device_buffer(2, simulated, "tcp", false, 4);
}

TEST_CASE("device tensors through the Buffer: device staging the NIC reads (FI_HMEM)") {
  CHECK_FALSE(registers_device_memory("tcp"));
  integrations::testing::run_device_buffer(1, nic_reads_device_memory, "shm",
                                           registers_device_memory("shm"));
  integrations::testing::run_device_buffer(1, nic_reads_device_memory, "tcp", false);
}

TEST_CASE("device tensors through low-latency calls: node peers (ranks as threads)") {
  integrations::testing::ll::run_device_ll(integrations::testing::ll::kRanks, simulated);
  const DevicePoints device_points;
  integrations::testing::ll::run_device_ll(integrations::testing::ll::kRanks, simulated);
}

TEST_CASE("device tensors through low-latency calls: over the fabric with the reorder shim") {
  const DevicePoints device_points;
  integrations::testing::ll::run_device_ll(1, simulated);
}

// Where the fabric registers device memory (shm in a CUDA build), other nodes' messages land in
// the receivers' device arenas (GPUDirect RDMA's stand-in): what arrives must be what was sent.
TEST_CASE("device tensors through low-latency calls: into device arenas the NIC writes (FI_HMEM)") {
  integrations::testing::ll::run_device_ll(1, nic_reads_device_memory, "shm",
                                           registers_device_memory("shm"));
  integrations::testing::ll::run_device_ll(1, nic_reads_device_memory, "tcp", false);
}

TEST_CASE("device tensors through low-latency calls: a slow Buffer stream, a quick caller") {
  integrations::testing::ll::run_device_ll(integrations::testing::ll::kRanks, slow_buffer_stream);
}

TEST_CASE("device tensors through low-latency calls: over the fabric, a slow Buffer stream") {
  integrations::testing::ll::run_device_ll(1, slow_buffer_stream);
}

TEST_CASE("device tensors through low-latency calls: packed from the device's own routing") {
  integrations::testing::ll::run_device_ll(integrations::testing::ll::kRanks, no_item_list_pack);
  integrations::testing::ll::run_device_ll(1, no_item_list_pack);
}

TEST_CASE("device tensors through low-latency calls: topk_idx never read back to the host") {
  integrations::testing::ll::run_device_ll(integrations::testing::ll::kRanks,
                                           counts_only_read_back);
  integrations::testing::ll::run_device_ll(1, counts_only_read_back);
}

TEST_CASE("low-latency calls captured into graphs: node peers, replayed with new inputs") {
  integrations::testing::ll::run_captured_ll(simulated, false);
  integrations::testing::ll::run_captured_ll(slow_buffer_stream, false);
}

TEST_CASE(
    "low-latency calls captured into graphs: the Buffer's stream joins the caller's capture") {
  integrations::testing::ll::run_captured_ll(simulated, true);
  integrations::testing::ll::run_captured_ll(slow_buffer_stream, true);
}

TEST_CASE("low-latency calls captured into graphs: hooks queue the receive inside the capture") {
  integrations::testing::ll::run_captured_ll(simulated, false, true);
  integrations::testing::ll::run_captured_ll(slow_buffer_stream, true, true);
}

TEST_CASE("low-latency calls captured into graphs: a zero_copy combine reads the combine buffer") {
  integrations::testing::ll::run_captured_ll(simulated, false, false, true);
  integrations::testing::ll::run_captured_ll(simulated, true, true, true);
}

TEST_CASE("low-latency calls captured into graphs: refused with shrink") {
  integrations::testing::ll::run_captured_ll_refused(simulated);
}

// Every rank on its own node: the steps' writes go through the proxies (tcp, the reorder shim
// on), into step memory on the host (tcp registers no device memory), counted in signal words.
TEST_CASE("low-latency calls captured into graphs: between nodes, through the proxies") {
  using integrations::testing::ll::run_captured_ll;
  run_captured_ll(simulated, false, false, false, 1);
  run_captured_ll(slow_buffer_stream, true, false, false, 1);
  run_captured_ll(simulated, true, true, true, 1);
}

// Where the fabric registers device memory (shm in a CUDA build) and the device offers memory a
// NIC reaches, the step memory is device memory (GPUDirect RDMA's stand-in).
TEST_CASE("low-latency calls captured into graphs: between nodes, into device memory (FI_HMEM)") {
  using integrations::testing::ll::run_captured_ll;
  run_captured_ll(nic_reads_device_memory, false, false, false, 1, "shm");
  run_captured_ll(nic_reads_device_memory, true, true, false, 1, "shm");
}

// Rank 1's device shares no memory (a GPU without CUDA IPC).
integrations::testing::RankDevice rank_1_shares_nothing(int rank) {
  auto buffer =
      std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.shares_memory = rank != 1});
  return {buffer, buffer->another_stream()};
}

TEST_CASE("low-latency calls captured into graphs: refused alike when a device shares nothing") {
  integrations::testing::ll::run_captured_ll_without_shared_memory(rank_1_shares_nothing);
}
