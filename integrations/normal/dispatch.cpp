// NormalMode::dispatch: check, route, notify, agree, finish the handle, stream the rows into the
// outputs (the steps in normal_mode.hpp), here or on the CommStream (async_finish).
#include "common/error.hpp"
#include "gpu_side/ep/combine_order.hpp"
#include "integrations/normal/dispatch_call.hpp"
#include "integrations/normal/hier_dispatch_rows.hpp"
#include "integrations/normal/hier_notify.hpp"
#include "integrations/normal/landing_zone.hpp"
#include "integrations/normal/normal_mode.hpp"
#include "integrations/normal/notify.hpp"
#include "integrations/normal/row_counts.hpp"
#include "integrations/normal/streams.hpp"

#include <memory>
#include <string>

namespace proxyep::integrations::normal {

namespace {

constexpr const char* kPhase = "dispatch";

// What the protocol reads on the host: the arguments, with a device call's steering copies in
// place of its device tensors.
DispatchArgs host_view(const DispatchArgs& args, const DeviceCall* device) {
  DispatchArgs view = args;
  if (device == nullptr) return view;
  // A cached dispatch's top-k, when it carries them again, too.
  view.topk_idx = device->steering.topk_idx;
  if (args.handle == nullptr) {
    view.is_token_in_rank = device->steering.is_token_in_rank;
    view.num_tokens_per_rank = device->steering.num_tokens_per_rank;
    view.num_tokens_per_expert = device->steering.num_tokens_per_expert;
  }
  return view;
}

}  // namespace

NormalMode::NormalMode(proxy::Session& session, RowBackend& backend, CallSequence& calls,
                       CommStream& stream, uint64_t buffer_id, std::shared_ptr<LandingZone> landing)
    : session_(session),
      backend_(backend),
      buffer_id_(buffer_id),
      calls_(calls),
      stream_(stream),
      landing_(std::move(landing)) {}

HierDispatchStreams* NormalMode::plan_sends(DispatchCall& d) {
  const DispatchInput& in = d.in;
  const DispatchArgs& a = d.args;
  if (!session_.layout().hierarchical()) {
    d.streams = std::make_unique<DispatchStreams>(
        *d.backend, in, a, d.routing, shape_for(in.num_experts), session_.rank(), d.on_device);
    d.streams->out = plan_streams(session_, in.format, d.routing.rows_to);
    chunk_fabric_out(session_, *d.streams, in.fabric_chunking);
    return nullptr;
  }
  // Hierarchical internode (hier_dispatch_rows.hpp), host and device calls alike.
  auto s = std::make_unique<HierDispatchStreams>(*d.backend, in, a, d.routing,
                                                 shape_for(in.num_experts), session_, d.on_device);
  // A forwarder row (with its heads) must fit a counterpart's slot too, before anything is sent.
  std::string why;
  for (int r = 0; r < session_.ranks(); ++r)
    require(!session_.layout().fabric_peer(r) ||
                fits_one_row(s->fabric_format(), session_.channel(r).slots(), &why),
            kPhase, "{}", why);
  s->plan_sends();
  chunk_fabric_out(session_, *s, in.fabric_chunking);
  HierDispatchStreams* hier = s.get();
  d.streams = std::move(s);
  return hier;
}

DispatchResult NormalMode::dispatch(const DispatchArgs& args, const DeviceCall* device) {
  PhaseClock started(stats_.dispatch_phases);
  calls_.check_usable(kPhase);
  const int R = session_.ranks(), me = session_.rank();
  const DispatchArgs view = host_view(args, device);
  const DispatchInput in =
      check_dispatch_args(view, device != nullptr, R, session_.ranks_per_node(), buffer_id_);
  // Rows stream through the slots in chunks: any number of tokens fits if one row fits a slot.
  require_row_fits(session_, in.format, kPhase);
  auto d = std::make_shared<DispatchCall>(args, started);
  PhaseClock& clock = d->clock;
  const DispatchArgs& a = d->args;
  d->in = in;
  d->backend = device != nullptr ? &device->backend : &backend_;
  d->on_device = device != nullptr;
  d->routing = in.cached ? TokenRouting::cached(*a.handle, me)
                         : TokenRouting::fresh(view.is_token_in_rank, R, me);
  const bool hier = session_.layout().hierarchical();
  HierDispatchStreams* hier_streams = plan_sends(*d);
  DispatchStreams& streams = *d->streams;
  clock.lap(&PhaseTimes::prepare_ns);

  const uint64_t call = d->call =
      calls_.begin(integrations::CallKind::sync, kPhase, d->backend->stream().get());
  calls_.await_slots_free(call, kPhase);  // after low-latency calls
  // Before the records, which publish them.
  calls_.step([&] { send_eager(session_, call, streams, stats_, clock, kPhase); });
  // A device call's recv_x is device memory: it offers no landing region. Nor does a
  // hierarchical one: its rows from other nodes come through the forwarders' lanes.
  const bool lands = landing_ && !d->on_device && !hier;
  if (lands) d->offer = landing_->offer();
  const auto records = calls_.step([&] {
    return notify_dispatch(call, in, view, d->routing, d->offer,
                           hier_streams != nullptr ? &hier_streams->nodes() : nullptr);
  });
  const RowCounts counts = RowCounts::from_records(records);
  agree_dispatch(call, in, a, records, counts);
  clock.lap(&PhaseTimes::notify_ns);
  d->num_recv = counts.received_by(me);

  // The outputs exist before the rows move: this rank's rows to itself go straight into them
  // (for 2 ranks that is half the traffic, one copy instead of two).
  const int64_t rows = recv_x_rows(records[me], counts, me);
  gpu_side::ep::Tensor landed;
  const int64_t place = landing_place(records[me], counts, me);
  if (place >= 0) landed = land_recv_x(in, a, static_cast<uint64_t>(place), rows);
  if (lands) landing_->note_need(static_cast<uint64_t>(rows) * in.format.hidden_bytes);
  d->out = allocate_outputs(*d->backend, in, a, d->num_recv, std::move(landed));
  std::vector<int64_t> first_row(static_cast<size_t>(R));
  for (int s = 0; s < R; ++s)
    first_row[s] = counts.first_from(s, me);
  streams.receive_into(d->out, std::move(first_row));
  if (hier_streams != nullptr)
    hier_streams->plan(records);
  else
    streams.in = plan_streams(session_, in.format, counts.received_from_each(me));
  chunk_fabric_in(session_, streams, records);
  if (hier_streams == nullptr) plan_in_place(*d, records, counts);
  finish_handle(d->out, in, a, d->routing, counts, records);
  // Counted now, from the records: the rows are not needed (nor awaited by an async call).
  if (a.recv_stats.defined())
    d->backend->add(a.recv_stats, d->out.unaligned_recv_tokens_per_expert);
  if (hier_streams != nullptr && !in.cached) {
    DispatchHandle& h = d->out.handle;
    h.forward_heads = hier_streams->forward_heads();
    h.forward_orders = hier_streams->forward_orders();
    if (in.topk > 0) {
      h.own_node_order =
          gpu_side::ep::Tensor::empty(DType::i32, in.tokens, session_.ranks_per_node());
      gpu_side::ep::node_order_rows(view.topk_idx.as<int64_t>(), in.tokens, in.topk,
                                    shape_for(in.num_experts), session_.layout().node(),
                                    h.own_node_order.data<int32_t>());
    }
  }
  clock.lap(&PhaseTimes::prepare_ns);
  return finish_call(d, a.async_finish, &NormalMode::move_rows, kPhase);
}

void NormalMode::move_rows(DispatchCall& d) {
  calls_.step([&] { run_streams(session_, d.call, *d.streams, stats_, d.clock, kPhase); });
  calls_.step([&] { await_in_place(d); });
  d.clock.lap(&PhaseTimes::wait_ns);
  clear_padding(*d.backend, d.out, d.in, d.num_recv);
  // The outputs are the caller's, and the slots and staging the next call's, once this returns.
  calls_.step([&] { d.backend->complete(kPhase); });
  stats_.rows_stored_in_place += d.streams->rows_in_place();
  if (const auto* hier = dynamic_cast<const HierDispatchStreams*>(d.streams.get())) {
    stats_.rows_to_fabric += hier->rows_to_fabric();
    stats_.rows_forwarded += hier->rows_forwarded();
  } else {  // per_rank: a token goes to each rank of another node it reaches
    for (int r = 0; r < session_.ranks(); ++r)
      if (r != session_.rank() && session_.channel(r).path() == proxy::PeerPath::fabric)
        stats_.rows_to_fabric += static_cast<uint64_t>(d.routing.rows_to[static_cast<size_t>(r)]);
  }
  d.clock.lap(&PhaseTimes::prepare_ns);
  calls_.step([&] { session_.quiet(kPhase); });  // staging is rewritten by the next call
  d.clock.lap(&PhaseTimes::quiet_ns);
  d.clock.completed();
  publish_stats();
}

std::vector<NotifyRecord> NormalMode::notify_dispatch(uint64_t call, const DispatchInput& in,
                                                      const DispatchArgs& a,
                                                      const TokenRouting& routing,
                                                      const LandingBlocks::Offer& offer,
                                                      const NodeRouting* nodes) {
  RecordHeader header;
  header.kind = in.cached ? CallKind::cached_dispatch : CallKind::dispatch;
  header.num_tokens = static_cast<uint32_t>(in.tokens);
  header.format = in.format;
  header.num_experts = static_cast<uint32_t>(in.num_experts);
  header.expert_alignment = static_cast<uint32_t>(a.expert_alignment);
  header.num_worst_tokens = static_cast<uint32_t>(a.num_worst_tokens);
  header.landing = offer;
  header.fabric_chunking = in.fabric_chunking;
  const int local_experts = in.num_experts / session_.ranks();
  const auto* per_expert = in.cached ? nullptr : a.num_tokens_per_expert.as<int32_t>();
  if (nodes != nullptr)
    return exchange_records_hierarchical(
        session_, call, encoder_, relay_encoder_,
        {.header = header,
         .rows_to = routing.rows_to,
         .experts = in.cached
                        ? std::span<const int32_t>{}
                        : std::span<const int32_t>(per_expert, static_cast<size_t>(in.num_experts)),
         .local_experts = local_experts,
         .fabric_rows = nodes->rows_to},
        kPhase);
  return exchange_records(
      session_, call, encoder_, header, routing.rows_to,
      [&](int d) {
        return in.cached ? std::span<const int32_t>{}
                         : std::span<const int32_t>(per_expert + d * local_experts,
                                                    static_cast<size_t>(local_experts));
      },
      kPhase);
}

// Every rank sees every record, so a disagreement fails every rank with the same message (and
// the ranks stay in step: nothing streamed yet).
void NormalMode::agree_dispatch(uint64_t call, const DispatchInput& in, const DispatchArgs& a,
                                const std::vector<NotifyRecord>& records,
                                const RowCounts& counts) const {
  const int R = session_.ranks(), me = session_.rank();
  const RecordHeader& mine = records[me].header;
  for (int s = 0; s < R; ++s) {
    const RecordHeader& h = records[s].header;
    require(h.kind == mine.kind && h.format == mine.format && h.num_experts == mine.num_experts,
            kPhase,
            "call {}: rank {} called {} with row format (hidden bytes {}, scales {}, topk {}, "
            "weights {}) and {} experts, rank {} {} with ({}, {}, {}, {}) and {}: every rank "
            "must pass the same kind of input",
            call, s, call_name(h.kind), h.format.hidden_bytes, h.format.scale_cols, h.format.topk,
            h.format.weights, h.num_experts, me, call_name(mine.kind), mine.format.hidden_bytes,
            mine.format.scale_cols, mine.format.topk, mine.format.weights, mine.num_experts);
    const size_t experts = in.cached ? 0 : static_cast<size_t>(in.num_experts / R);
    require(records[s].experts.size() == experts, kPhase,
            "call {}: rank {} announced {} expert counts to this rank, expected {}", call, s,
            records[s].experts.size(), experts);
  }
  if (in.cached) {
    const RowCounts handle = RowCounts::from_handle(*a.handle);
    for (int s = 0; s < R; ++s)
      for (int d = 0; d < R; ++d)
        require(counts.at(s, d) == handle.at(s, d), kPhase,
                "call {}: rank {} sends {} rows to rank {} but this rank's handle says {}: the "
                "ranks passed handles of different dispatches",
                call, s, counts.at(s, d), d, handle.at(s, d));
  }
  for (int d = 0; d < R; ++d) {
    const uint32_t worst = records[d].header.num_worst_tokens;
    require(worst == 0 || counts.received_by(d) <= worst, kPhase,
            "call {}: rank {} receives {} tokens, more than its num_worst_tokens {}", call, d,
            counts.received_by(d), worst);
  }
}

DispatchResult NormalMode::allocate_outputs(RowBackend& backend, const DispatchInput& in,
                                            const DispatchArgs& a, int64_t num_recv,
                                            gpu_side::ep::Tensor recv_x) {
  DispatchResult out;
  const int64_t rows = a.num_worst_tokens > 0 ? a.num_worst_tokens : num_recv;
  out.recv_x = recv_x.defined() ? std::move(recv_x) : backend.allocate(a.x.dtype, rows, in.hidden);
  if (in.fp8) out.recv_x_scales = backend.allocate(a.x_scales.dtype, rows, in.format.scale_cols);
  if (in.topk > 0) out.recv_topk_idx = backend.allocate(DType::i64, rows, in.topk);
  if (in.weights) out.recv_topk_weights = backend.allocate(DType::f32, rows, in.topk);
  if (!in.cached) out.handle.recv_src_idx = backend.allocate(DType::i32, num_recv);
  return out;
}

// The num_worst_tokens padding: zero rows, -1 selections.
void NormalMode::clear_padding(RowBackend& backend, DispatchResult& out, const DispatchInput& in,
                               int64_t num_recv) {
  const int64_t rows = out.recv_x.rows();
  if (rows <= num_recv) return;
  auto clear = [&](Tensor& t, uint64_t unit, uint8_t byte) {
    backend.fill(t.raw() + num_recv * unit, byte, static_cast<uint64_t>(rows - num_recv) * unit);
  };
  clear(out.recv_x, in.format.hidden_bytes, 0);
  if (in.fp8) clear(out.recv_x_scales, 4ull * in.format.scale_cols, 0);
  if (in.weights) clear(out.recv_topk_weights, 4ull * in.topk, 0);
  if (in.topk > 0) clear(out.recv_topk_idx, 8ull * in.topk, 0xff);  // int64 -1: every bit set
}

void NormalMode::finish_handle(DispatchResult& out, const DispatchInput& in, const DispatchArgs& a,
                               const TokenRouting& routing, const RowCounts& counts,
                               const std::vector<NotifyRecord>& records) const {
  if (in.cached) {
    out.handle = *a.handle;
    return;
  }
  const int R = session_.ranks(), me = session_.rank();
  DispatchHandle& h = out.handle;
  h.rank_prefix_matrix = counts.prefix_matrix();
  // Shared with the routing, which the rows still being moved read.
  h.is_token_in_rank = routing.in_rank;
  h.send_head = routing.send_head;
  h.num_tokens = static_cast<int>(in.tokens);
  h.num_experts = in.num_experts;
  h.num_recv_tokens = static_cast<int>(counts.received_by(me));
  h.hidden = static_cast<int>(in.hidden);
  h.buffer_id = buffer_id_;
  const int local_experts = in.num_experts / R;
  std::vector<int>& unaligned = out.unaligned_recv_tokens_per_expert;
  unaligned.assign(static_cast<size_t>(local_experts), 0);
  for (int s = 0; s < R; ++s)
    for (int e = 0; e < local_experts; ++e)
      unaligned[static_cast<size_t>(e)] += records[s].experts[static_cast<size_t>(e)];
  if (a.num_worst_tokens > 0) return;
  out.num_recv_tokens_per_expert = unaligned;
  for (int& n : out.num_recv_tokens_per_expert)
    n = (n + a.expert_alignment - 1) / a.expert_alignment * a.expert_alignment;
}

}  // namespace proxyep::integrations::normal
