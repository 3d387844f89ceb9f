// Posting a session's writes to other nodes (fabric_poster.hpp).
#include "proxy/session/fabric_poster.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"

#include <algorithm>
#include <string>

namespace proxyep::proxy {

FabricPoster::FabricPoster(gpu_side::Ring ring, gpu_side::RingProducer& producer,
                           std::byte* staging, control::CounterBank& counters,
                           std::chrono::milliseconds timeout, bool from_caller,
                           CheckDrain check_drain)
    : ring_(ring),
      producer_(producer),
      staging_(staging),
      counters_(counters),
      timeout_(timeout),
      from_caller_(from_caller),
      check_drain_(std::move(check_drain)) {}

uint64_t FabricPoster::post_from_caller(const std::byte* source, uint32_t remote_region,
                                        int destination, uint64_t remote_offset, uint64_t length,
                                        uint64_t call, uint32_t imm, std::string_view phase) {
  require(from_caller_, phase,
          "a write to rank {} from the caller's memory: this fabric reads "
          "only registered memory",
          destination);
  return post_from(region::kCallerMemory, reinterpret_cast<uintptr_t>(source), remote_region,
                   destination, remote_offset, length, call, imm, phase);
}

uint64_t FabricPoster::post_from(uint32_t local_region, uint64_t local_offset,
                                 uint32_t remote_region, int destination, uint64_t remote_offset,
                                 uint64_t length, uint64_t call, uint32_t imm,
                                 std::string_view phase) {
  gpu_side::Descriptor desc;
  desc.op = length == 0 ? gpu_side::Op::signal : gpu_side::Op::write_imm;
  desc.dst_rank = static_cast<uint32_t>(destination);
  desc.local_region = local_region;
  desc.remote_region = remote_region;
  desc.src_offset = local_offset;
  desc.dst_offset = remote_offset;
  desc.length = length;
  desc.cookie = call;
  desc.imm = imm;
  if (route_ != nullptr) return kDeviceRing | route_->post(desc, phase);
  // The proxy is asked between slices, so a failed one (a dead daemon) fails the push at once.
  constexpr std::chrono::milliseconds kSlice{50};
  const Deadline deadline(timeout_);
  while (producer_.push(desc, Deadline(std::min(kSlice, deadline.remaining()))) != Status::ok) {
    check_drain_(phase);
    if (deadline.expired())
      fail(std::string(phase),
           "the descriptor ring stayed full (a write to rank {}): the proxy made no progress "
           "before the deadline",
           destination);
  }
  return pushed_++;
}

}  // namespace proxyep::proxy
