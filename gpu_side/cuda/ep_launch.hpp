// Launch-size helpers shared by the EP kernels' host code (ep_*.cu); defined in ep_kernels.cpp.
#pragma once

#include <cstdint>

namespace proxyep::gpu_side::cuda {

// Multiprocessors of the current device (1 when the query fails: a launch still works).
int multiprocessor_count();

// Blocks for `work` independent items of one block each: `requested` when positive, else enough
// to keep every multiprocessor busy (a few blocks each), never more than there are items.
int grid_blocks(int64_t work, int requested);

}  // namespace proxyep::gpu_side::cuda
