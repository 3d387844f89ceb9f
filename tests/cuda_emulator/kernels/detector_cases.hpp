// The launchers of kernels/detector_cases.cu: each runs one small kernel with a planted defect
// (or its clean twin) and returns the launch's status after a device synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cuemu_cases {

enum class PublishMode { fenced, unfenced, late_payload, device_scope };

cudaError_t run_neighbours(int* out, bool barrier);  // 2 blocks x 64 threads; out: 128
cudaError_t run_past_end();
cudaError_t run_unwritten(int* out);           // 64 threads
cudaError_t run_unequal_masks(unsigned* out);  // 32 threads
cudaError_t run_ballot(unsigned* out, int threads);
cudaError_t run_split_barrier();
cudaError_t run_deadlock();
cudaError_t run_publish(uint64_t* line, PublishMode mode);  // line: 8 host-mapped words
cudaError_t run_spin(const uint64_t* word);

}  // namespace cuemu_cases
