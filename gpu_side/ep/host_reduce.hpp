// Combine's reduce for the CPU twin, over a range of tokens. It produces exactly the bytes
// combine_token (row_rules.hpp) produces on one HostLanes lane for each token, but is laid out for
// the host's vector units instead of a thread block: combine_token walks 8-element chunks and
// re-reads send_head for each, which GCC at -O2 turns into 4-wide code; here each token's source
// rows are looked up once and summed in wide blocks, and an AVX2 clone is picked at load time
// where the CPU has it.
//
// Bit identity holds because every output element still sees the float operations
// 0 + row_r0 + row_r1 + ... + bias0 + bias1 in that order (or the one bias_first or V2's
// CombineInput::order gives, row_rules.hpp), rounded once with float_to_bf16: only the grouping
// of elements into vectors changes, and adds have no multiply to fuse with.
// The one thing those operations leave to the compiler is which NaN an add of two NaNs returns
// (it depends on operand order, so combine_token's own bits there change between -O0, -O2 and
// -O3 builds); the reduce pins the answer GCC's -O2 build of combine_token gives on x86
// (host_reduce.cpp). tests/unit/gpu_side/ep/test_host_reduce.cpp compares the two bit for bit, and
// checks NaN-meets-NaN elements against that pinned rule.
#pragma once

#include "gpu_side/ep/row_rules.hpp"

#include <cstdint>

namespace proxyep::gpu_side::ep {

// For every t in [begin, end): what combine_token(in, t, HostLanes{}) writes, i.e. out[t] and
// (topk > 0) out_weights[t]. Tokens are independent, so ranges may run on different threads.
void reduce_tokens_host(const CombineInput& in, int64_t begin, int64_t end);

}  // namespace proxyep::gpu_side::ep
