// HostBackend: the RowBackend for CPU tensors. The per-row rules run as the kernels' CPU twins
// on a small pool (gpu_side/ep/host_executor.hpp) in token blocks; combine's reduce is the
// vectorised host form of combine_token (gpu_side/ep/host_reduce.hpp), bit-identical to it.
#pragma once

#include "gpu_side/ep/host_executor.hpp"
#include "integrations/backend/row_backend.hpp"

namespace proxyep::integrations {

class HostBackend final : public RowBackend {
 public:
  // `threads` >= 1 counts the calling thread.
  explicit HostBackend(int threads) : executor_(threads) {}
  // ep.host_threads, or the cores of this node shared by its ranks (at most 8).
  static int default_threads(int ranks_per_node);

  int threads() const { return executor_.threads(); }

  gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows, int64_t cols) override;
  gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows) override;
  gpu_side::ep::DispatchLayout layout(const gpu_side::ep::TensorRef& topk_idx,
                                      const gpu_side::ep::EpShape& shape) override;
  void pack_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                 std::span<const int32_t> tokens) override;
  void place_routed_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                         const TokenRoutes& routes) override;
  void copy_rows(std::byte* to, const std::byte* from, int64_t rows, uint64_t row_bytes) override;
  void copy_runs(std::span<const gpu_side::ep::CopyRun> runs) override;
  void fill(std::byte* to, uint8_t value, uint64_t bytes) override;
  void reduce(const gpu_side::ep::CombineInput& input, int64_t num_tokens) override;
  void write(std::byte* to, const void* from, uint64_t bytes) override;
  void add(const gpu_side::ep::TensorRef& to, std::span<const int32_t> values) override;
  void add(const gpu_side::ep::TensorRef& to, std::span<const int64_t> values) override;
  void ll_pack(const gpu_side::ep::LlFormat& format, const gpu_side::ep::TensorRef& x,
               std::span<const gpu_side::ep::LlPackItem> items) override;
  void ll_unpack_counted(const gpu_side::ep::LlFormat& format, std::span<const int32_t> counts,
                         std::span<const std::byte* const> from,
                         std::span<const gpu_side::ep::LlExpertSink> sinks, int64_t rows_per_expert,
                         int32_t* recv_count, int64_t* layout_range) override;
  void ll_combine(std::span<const uint16_t* const> rows, const float* weights, uint16_t* out,
                  int topk, uint32_t hidden) override;

 private:
  template <typename T>
  void add_values(const gpu_side::ep::TensorRef& to, std::span<const T> values);
  // body(begin, end) over token ranges covering [0, tokens), on the executor.
  template <typename Body>
  void for_each_token_block(int64_t tokens, Body&& body);

  gpu_side::ep::HostExecutor executor_;
};

}  // namespace proxyep::integrations
