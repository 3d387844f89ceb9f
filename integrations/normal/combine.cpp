// NormalMode::combine: check, return every received row to its source, agree, stream, reduce
// each token over the ranks that received it (float32, ascending rank order, then the biases:
// the order gpu_side/ep/reference.hpp defines; or DeepEP V2's, CombineArgs::order), quiet; all
// but the checks on the CommStream with async_finish.
#include "common/error.hpp"
#include "common/log.hpp"
#include "integrations/normal/combine_rows.hpp"
#include "integrations/normal/hier_combine_rows.hpp"
#include "integrations/normal/hier_notify.hpp"
#include "integrations/normal/normal_mode.hpp"
#include "integrations/normal/notify.hpp"
#include "integrations/normal/row_counts.hpp"
#include "integrations/normal/streams.hpp"

#include <memory>
#include <optional>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

namespace {

constexpr const char* kPhase = "combine";

struct CheckedCombine {
  int64_t hidden = 0;
  int topk = 0;  // 0: no weights travel
  ep::RowFormat format;
  FabricChunking fabric_chunking;  // the Config's RDMA chunk sizes (chunk_plan.hpp)
};

// DeepEP V2's order tables (CombineArgs::order, ::weight_owner) over `groups` (ranks, or nodes
// when the Buffer is hierarchical): the reduce indexes blocks by them, so a wrong entry would
// read another block's rows or add one twice.
void check_order(const CombineArgs& a, const CheckedCombine& c, int64_t tokens, int groups) {
  if (!a.order.defined()) {
    require(!a.weight_owner.defined(), kPhase, "weight_owner is given with an order only");
    return;
  }
  ep::require_host(a.order, kPhase, "order");
  ep::require_dtype(a.order, DType::i32, kPhase, "order");
  ep::require_shape(a.order, tokens, groups, kPhase, "order");
  ep::require_contiguous(a.order, kPhase, "order");
  std::vector<int64_t> listed_by(static_cast<size_t>(groups), -1);  // the token listing it last
  const int32_t* order = a.order.as<int32_t>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int i = 0; i < groups && order[t * groups + i] >= 0; ++i) {
      const int32_t g = order[t * groups + i];
      require(g < groups && listed_by[static_cast<size_t>(g)] != t, kPhase,
              "order[{}] lists group {} {} ({} groups: one entry each, < {})", t, g,
              g < groups ? "twice" : "out of range", groups, groups);
      listed_by[static_cast<size_t>(g)] = t;
    }
  if (!a.weight_owner.defined()) return;
  require(c.topk > 0, kPhase, "weight_owner is given without topk_weights");
  ep::require_host(a.weight_owner, kPhase, "weight_owner");
  ep::require_dtype(a.weight_owner, DType::i32, kPhase, "weight_owner");
  ep::require_shape(a.weight_owner, tokens, c.topk, kPhase, "weight_owner");
  ep::require_contiguous(a.weight_owner, kPhase, "weight_owner");
  const int32_t* owner = a.weight_owner.as<int32_t>();
  for (int64_t i = 0; i < tokens * c.topk; ++i)
    require(owner[i] >= -1 && owner[i] < groups, kPhase,
            "weight_owner entry {} is {}: a group in [-1, {})", i, owner[i], groups);
}

// All on the calling rank, before anything is sent. `groups`: the blocks of the last reduce.
CheckedCombine check_combine_args(const CombineArgs& a, bool on_device, uint64_t buffer_id,
                                  int groups) {
  require(a.handle != nullptr, kPhase, "combine needs the handle of a dispatch");
  const DispatchHandle& h = *a.handle;
  require(h.buffer_id == buffer_id, kPhase, "the handle was made by another Buffer");
  const int64_t num_recv = h.num_recv_tokens;
  ep::require_dtype(a.x, DType::bf16, kPhase, "x");
  if (on_device)
    require(a.x.device == ep::Device::cuda, kPhase, "x must be device memory; got {}", a.x);
  else
    ep::require_host(a.x, kPhase, "x");
  require(a.x.dims == 2 && a.x.rows >= num_recv, kPhase,
          "x must be [num_recv_tokens = {}, hidden] (one row per received token); got {}", num_recv,
          a.x);
  ep::require_contiguous(a.x, kPhase, "x");
  CheckedCombine c;
  c.fabric_chunking = fabric_chunking_of(a.config, kPhase);
  c.hidden = a.x.cols;
  require(c.hidden > 0 && (c.hidden * 2) % ep::kRowUnitBytes == 0, kPhase,
          "hidden * 2 bytes must be a positive multiple of {}; x is {}", ep::kRowUnitBytes, a.x);
  if (a.topk_weights.defined()) {
    ep::require_dtype(a.topk_weights, DType::f32, kPhase, "topk_weights");
    ep::require_contiguous(a.topk_weights, kPhase, "topk_weights");
    require(a.topk_weights.dims == 2 && a.topk_weights.rows == a.x.rows, kPhase,
            "topk_weights must be [{}, num_topk]; got {}", a.x.rows, a.topk_weights);
    c.topk = static_cast<int>(a.topk_weights.cols);
  }
  const TensorRef* biases[] = {&a.bias0, &a.bias1};
  for (int b = 0; b < 2; ++b) {
    if (!biases[b]->defined()) continue;
    const char* name = b == 0 ? "bias[0]" : "bias[1]";
    ep::require_dtype(*biases[b], DType::bf16, kPhase, name);
    ep::require_shape(*biases[b], h.num_tokens, c.hidden, kPhase, name);
    ep::require_contiguous(*biases[b], kPhase, name);
  }
  check_order(a, c, h.num_tokens, groups);
  c.format.hidden_bytes = static_cast<uint32_t>(c.hidden * 2);
  c.format.weights = static_cast<uint32_t>(c.topk);
  return c;
}

// Every rank sees every record: a disagreement fails every rank with the same message.
void agree_combine(uint64_t call, int me, const std::vector<NotifyRecord>& records,
                   const RowCounts& dispatched) {
  const RecordHeader& mine = records[me].header;
  for (int s = 0; s < static_cast<int>(records.size()); ++s) {
    const RecordHeader& theirs = records[s].header;
    require(theirs.kind == mine.kind && theirs.format == mine.format, kPhase,
            "call {}: rank {} called {} with (hidden bytes {}, weights {}), rank {} combine with "
            "({}, {}): every rank must pass the same kind of input",
            call, s, call_name(theirs.kind), theirs.format.hidden_bytes, theirs.format.weights, me,
            mine.format.hidden_bytes, mine.format.weights);
    for (int d = 0; d < static_cast<int>(records.size()); ++d)
      require(records[s].rows_to[d] == dispatched.at(d, s), kPhase,
              "call {}: rank {} returns {} rows to rank {} but this rank's handle says {}: the "
              "ranks passed handles of different dispatches",
              call, s, records[s].rows_to[d], d, dispatched.at(d, s));
  }
}

}  // namespace

// One combine from its checked arguments to its reduce. It keeps a copy of the handle (tensors
// are shared, not copied): the caller's may be gone before an async call ends.
struct CombineCall {
  CombineCall(const CombineArgs& caller, const CheckedCombine& checked, int me,
              const PhaseClock& started)
      : args(caller),
        handle(*caller.handle),
        in(checked),
        dispatched(RowCounts::from_handle(handle)),
        rows_to(dispatched.received_from_each(me)),
        clock(started) {
    args.handle = &handle;
  }
  CombineCall(const CombineCall&) = delete;
  CombineCall& operator=(const CombineCall&) = delete;

  CombineArgs args;               // the caller's views: read until the call ends
  RowBackend* backend = nullptr;  // the host backend, or a device call's
  DispatchHandle handle;
  CheckedCombine in;
  // What the handle's dispatch moved: now every row goes back, d -> s for each s -> d.
  RowCounts dispatched;
  std::vector<int64_t> rows_to;
  std::unique_ptr<CombineStreams> streams;  // points into the members above
  bool hierarchical = false;                // hier_combine_rows.hpp
  CombineResult out;                        // shares its tensors with what the caller got
  uint64_t call = 0;
  PhaseClock clock;
};

CombineResult NormalMode::combine(const CombineArgs& args, const DeviceCall* device) {
  PhaseClock started(stats_.combine_phases);
  calls_.check_usable(kPhase);
  const int groups =
      session_.layout().hierarchical() ? session_.layout().nodes() : session_.ranks();
  const CheckedCombine in = check_combine_args(args, device != nullptr, buffer_id_, groups);
  const int me = session_.rank();
  require_row_fits(session_, in.format, kPhase);
  auto c = std::make_shared<CombineCall>(args, in, me, started);
  RowBackend& backend = *(c->backend = device != nullptr ? &device->backend : &backend_);
  const CombineArgs& a = c->args;
  const float* weights = in.topk > 0 ? a.topk_weights.as<float>() : nullptr;
  const auto* x = static_cast<const std::byte*>(a.x.data);
  c->hierarchical = session_.layout().hierarchical();
  if (c->hierarchical) {
    c->streams = std::make_unique<HierCombineStreams>(backend, in.format, c->dispatched, c->handle,
                                                      x, weights, in.topk, session_,
                                                      device != nullptr, a.order.defined());
  } else {
    c->streams = std::make_unique<CombineStreams>(backend, in.format, c->dispatched, x, weights,
                                                  in.topk, me, device != nullptr);
    c->streams->out = plan_streams(session_, in.format, c->rows_to);
    c->streams->in = plan_streams(session_, in.format, c->dispatched.sent_by(me));
  }
  chunk_fabric_out(session_, *c->streams, in.fabric_chunking);
  c->out.combined_x = backend.allocate(DType::bf16, c->handle.num_tokens, in.hidden);
  if (in.topk > 0)
    c->out.combined_topk_weights = backend.allocate(DType::f32, c->handle.num_tokens, in.topk);

  c->call = calls_.begin(integrations::CallKind::sync, kPhase, backend.stream().get());
  c->clock.lap(&PhaseTimes::prepare_ns);
  return finish_call(c, a.async_finish, &NormalMode::run_combine, kPhase);
}

void NormalMode::run_combine(CombineCall& c) {
  const uint64_t call = c.call;
  const DispatchHandle& h = c.handle;
  const CheckedCombine& in = c.in;
  CombineStreams& streams = *c.streams;
  PhaseClock& clock = c.clock;
  calls_.await_slots_free(call, kPhase);  // after low-latency calls
  // Before the records, which publish them.
  calls_.step([&] { send_eager(session_, call, streams, stats_, clock, kPhase); });
  RecordHeader header;
  header.kind = CallKind::combine;
  header.num_tokens = static_cast<uint32_t>(h.num_tokens);
  header.format = in.format;
  header.fabric_chunking = in.fabric_chunking;
  const auto records = calls_.step([&] {
    if (!c.hierarchical)
      return exchange_records(session_, call, encoder_, header, c.rows_to, {}, kPhase);
    const std::vector<int64_t> no_fabric_rows(static_cast<size_t>(session_.layout().nodes()), 0);
    return exchange_records_hierarchical(session_, call, encoder_, relay_encoder_,
                                         {.header = header,
                                          .rows_to = c.rows_to,
                                          .experts = {},
                                          .local_experts = 0,
                                          .fabric_rows = no_fabric_rows},
                                         kPhase);
  });
  agree_combine(call, session_.rank(), records, c.dispatched);
  chunk_fabric_in(session_, streams, records);
  clock.lap(&PhaseTimes::notify_ns);
  calls_.step([&] {
    const uint64_t from_caller = stats_.chunks_sent_from_caller;
    try {
      run_streams(session_, call, streams, stats_, clock, kPhase);
    } catch (const Error&) {
      // Writes may still read the caller's x, which it may free once this throws.
      if (stats_.chunks_sent_from_caller != from_caller) settle_writes_from_x();
      throw;
    }
  });

  const CombineArgs& a = c.args;
  const int32_t* order = a.order.defined() ? a.order.as<int32_t>() : nullptr;
  const int32_t* weight_owner = a.weight_owner.defined() ? a.weight_owner.as<int32_t>() : nullptr;
  if (c.hierarchical) {
    static_cast<HierCombineStreams&>(streams).reduce(
        c.out.combined_x, c.out.combined_topk_weights,
        {.bias0 = a.bias0.defined() ? a.bias0.as<uint16_t>() : nullptr,
         .bias1 = a.bias1.defined() ? a.bias1.as<uint16_t>() : nullptr,
         .order = order,
         .weight_owner = weight_owner});
  } else {
    c.backend->reduce(
        ep::CombineInput{
            .block_rows = streams.block_rows().data(),
            .block_weights = in.topk > 0 ? streams.block_weights().data() : nullptr,
            .block_chunks = streams.block_chunks().data(),
            .block_chunk_rows = streams.block_chunk_rows().data(),
            .send_head = h.send_head.data<int32_t>(),
            .bias0 = a.bias0.defined() ? a.bias0.as<uint16_t>() : nullptr,
            .bias1 = a.bias1.defined() ? a.bias1.as<uint16_t>() : nullptr,
            .order = order,
            .weight_owner = weight_owner,
            .out = c.out.combined_x.data<uint16_t>(),
            .out_weights = in.topk > 0 ? c.out.combined_topk_weights.data<float>() : nullptr,
            .num_ranks = session_.ranks(),
            .hidden = in.hidden,
            .topk = in.topk},
        h.num_tokens);
  }
  // The slots it reads in place are the next call's once this returns (and combined_x the
  // caller's).
  calls_.step([&] { c.backend->complete(kPhase); });
  clock.lap(&PhaseTimes::reduce_ns);
  stats_.chunks_reduced_in_place += streams.chunks_in_place();
  calls_.step([&] { session_.quiet(kPhase); });
  clock.lap(&PhaseTimes::quiet_ns);
  clock.completed();
  publish_stats();
}

void NormalMode::settle_writes_from_x() noexcept {
  try {
    session_.quiet(kPhase);
  } catch (const Error& e) {
    log::warn(
        "combine: after its failure, writes to other nodes may still read x ({}); keep x "
        "until the Buffer is gone",
        e.what());
  }
}

}  // namespace proxyep::integrations::normal
