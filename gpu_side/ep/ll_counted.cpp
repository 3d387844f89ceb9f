// The CPU twin of the counted unpack (ll_counted.hpp).
#include "gpu_side/ep/ll_counted.hpp"

#include "gpu_side/ep/ep_shape.hpp"

namespace proxyep::gpu_side::ep {

const char* ll_unpack_counted_error(const LlUnpackCountedParams& p) {
  if (const char* format = ll_format_error(p.format)) return format;
  if (p.ranks < 1) return "no ranks";
  if (p.local_experts < 1 || p.local_experts > kMaxLocalExperts)
    return "local experts outside 1..1024";
  if (p.rows_per_expert < 0 || p.rows_per_expert > INT32_MAX)
    return "rows per expert outside 0..2^31-1";
  if (p.threads < 32 || p.threads % 32 != 0 || p.threads > 1024)
    return "threads per block not a multiple of 32 in 32..1024";
  return nullptr;
}

void ll_unpack_counted_on_host(const LlUnpackCountedParams& p) {
  const int64_t pairs = static_cast<int64_t>(p.local_experts) * p.ranks;
  for (int64_t q = 0; q < pairs; ++q)
    ll_unpack_counted_pair(p, q, HostLanes{});
}

const char* ll_return_counted_error(const LlReturnCountedParams& p) {
  if (p.ranks < 1) return "no ranks";
  if (p.local_experts < 1 || p.local_experts > kMaxLocalExperts)
    return "local experts outside 1..1024";
  if (p.rows_per_expert < 1 || p.rows_per_expert > INT32_MAX)
    return "rows per expert outside 1..2^31-1";
  if (p.slot_rows < 0) return "a negative slot size";
  if (p.hidden == 0 || p.hidden % 8 != 0) return "hidden not a positive multiple of 8";
  if (p.threads < 32 || p.threads % 32 != 0 || p.threads > 1024)
    return "threads per block not a multiple of 32 in 32..1024";
  return nullptr;
}

void ll_return_counted_on_host(const LlReturnCountedParams& p) {
  const int64_t pairs = static_cast<int64_t>(p.local_experts) * p.ranks;
  for (int64_t q = 0; q < pairs; ++q)
    ll_return_counted_pair(p, q, HostLanes{});
}

const char* ll_write_bytes_error(const SizeWritesParams& p) {
  if (p.count < 0) return "a negative number of writes";
  if (p.group_size < 1 || p.group_size > kMaxLocalExperts)
    return "group size outside 1..kMaxLocalExperts";
  if (p.unit_bytes == 0 || p.max_bytes < p.unit_bytes)
    return "a unit of 0 bytes or beyond the room";
  if (p.threads < 32 || p.threads % 32 != 0 || p.threads > 1024)
    return "threads per block not a multiple of 32 in 32..1024";
  if (p.count > 0 && (p.writes == nullptr || p.counts == nullptr || p.groups == nullptr))
    return "writes, counts or groups missing";
  return nullptr;
}

void ll_write_bytes_on_host(const SizeWritesParams& p) {
  for (int64_t i = 0; i < p.count; ++i)
    ll_write_bytes(p, i);
}

}  // namespace proxyep::gpu_side::ep
