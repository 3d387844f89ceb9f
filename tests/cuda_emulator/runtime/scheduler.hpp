// Runs one launch to completion on the calling OS thread (a stream's worker): every CUDA thread a
// fiber, a few blocks resident at once in a seeded order, and at each scheduling point (barrier,
// ballot, atomic, __nanosleep, now and then a plain access) a seeded pick among the runnable
// fibers of all resident blocks, so no order between blocks or warps is fixed.
#pragma once

#include "runtime/fiber.hpp"

namespace cuemu {

void run_grid(const Grid& grid);

// CUEMU_SEED (default 1): the base of every launch's seed.
uint64_t base_seed();

// The running launch's seeded random stream (for preemption and delays).
uint64_t scheduler_random();

}  // namespace cuemu
