// A hierarchical internode dispatch's streams (hier_dispatch_rows.hpp).
#include "integrations/normal/hier_dispatch_rows.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/combine_order.hpp"
#include "integrations/normal/chunk_plan.hpp"

#include <span>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

namespace {

constexpr const char* kPhase = "dispatch";

}  // namespace

NodeRouting NodeRouting::of(const TokenRouting& routing, const proxy::ArenaLayout& layout) {
  const int R = static_cast<int>(routing.in_rank.cols()), rpn = layout.sizes().ranks_per_node;
  const int nodes = layout.nodes();
  const int64_t tokens = routing.in_rank.rows();
  const bool* in_rank = routing.in_rank.data<bool>();
  NodeRouting n;
  n.tokens_to.resize(static_cast<size_t>(nodes));
  n.rows_to.assign(static_cast<size_t>(nodes), 0);
  for (int node = 0; node < nodes; ++node) {
    if (node == layout.node()) continue;
    std::vector<int32_t>& to = n.tokens_to[static_cast<size_t>(node)];
    for (int64_t t = 0; t < tokens; ++t) {
      const bool* row = in_rank + t * R + node * rpn;
      for (int k = 0; k < rpn; ++k)
        if (row[k]) {
          to.push_back(static_cast<int32_t>(t));
          break;
        }
    }
    n.rows_to[static_cast<size_t>(node)] = static_cast<int64_t>(to.size());
  }
  return n;
}

HierDispatchStreams::HierDispatchStreams(RowBackend& backend, const DispatchInput& input,
                                         const DispatchArgs& args, const TokenRouting& routing,
                                         const ep::EpShape& shape, const proxy::Session& session,
                                         bool on_device)
    : DispatchStreams(backend, input, args, routing, shape, session.rank(), on_device),
      layout_(session.layout()),
      session_(session),
      fabric_format_(input.format),
      nodes_(NodeRouting::of(routing, session.layout())),
      arrived_(static_cast<size_t>(session.ranks())),
      lane_rows_(static_cast<size_t>(session.ranks())) {
  fabric_format_.heads = static_cast<uint32_t>(session.ranks_per_node());
  send_head_ = routing.send_head;
  if (on_device && send_head_.numel() > 0) {
    send_head_ = backend.allocate(DType::i32, routing.send_head.rows(), routing.send_head.cols());
    backend.write(send_head_.raw(), routing.send_head.raw(), routing.send_head.bytes());
  }
}

int HierDispatchStreams::lane_source(int x) const {
  return layout_.counterpart(x / layout_.sizes().ranks_per_node);
}

void HierDispatchStreams::plan_sends() {
  const int rpn = layout_.sizes().ranks_per_node;
  for (int r = 0; r < session_.ranks(); ++r) {
    if (r == me_) continue;
    const proxy::SlotGeometry slots = session_.channel(r).slots();
    if (layout_.on_node(r))
      out[r] = plan_stream(static_cast<uint64_t>(routing_.rows_to[r]), format, slots,
                           layout_.sizes().eager_limit);
    else if (counterpart(r))
      out[r] = plan_stream(static_cast<uint64_t>(nodes_.rows_to[static_cast<size_t>(r / rpn)]),
                           fabric_format_, slots, 0);
  }
}

void HierDispatchStreams::plan(const std::vector<NotifyRecord>& records) {
  const int R = session_.ranks(), rpn = layout_.sizes().ranks_per_node;
  const uint64_t eager = layout_.sizes().eager_limit;
  for (int r = 0; r < R; ++r) {
    if (r == me_) continue;
    const proxy::SlotGeometry slots = session_.channel(r).slots();
    const NotifyRecord& from = records[static_cast<size_t>(r)];
    if (layout_.on_node(r)) {
      in[r] = plan_stream(static_cast<uint64_t>(from.rows_to[me_]), format, slots, eager);
    } else if (counterpart(r)) {
      in[r] = plan_stream(static_cast<uint64_t>(from.fabric_rows), fabric_format_, slots, 0);
      Arrived& a = arrived_[static_cast<size_t>(r)];
      a.rows = from.fabric_rows;
      a.own_expected = from.rows_to[me_];
      a.areas = ep::RowAreas::of(static_cast<uint64_t>(a.rows), format);  // heads: a.heads
      a.area =
          backend.allocate(DType::u8, static_cast<int64_t>(std::max<uint64_t>(1, a.areas.end)));
      a.heads = ep::Tensor::empty(DType::i32, a.rows, rpn);
      if (format.topk > 0) {
        a.topk = ep::Tensor::empty(DType::i64, a.rows, format.topk);
        a.orders = ep::Tensor::empty(DType::i32, a.rows, rpn);
      }
      std::byte* base = a.area.raw();
      // Views of the area, where it is (a device call's: device memory); cols 0: absent.
      auto view = [&](uint64_t offset, DType dtype, uint32_t cols) {
        if (cols == 0) return ep::TensorRef{};
        ep::TensorRef ref = ep::TensorRef::matrix(base + offset, dtype, a.rows, cols);
        ref.device = a.area.device();
        return ref;
      };
      a.source = RowSource{
          .x = view(a.areas.x, DType::u8, format.hidden_bytes),
          .x_scales = view(a.areas.scales, DType::i32, format.scale_cols),
          .topk_idx = view(a.areas.topk_idx, DType::i64, format.topk),
          .topk_weights = view(a.areas.weights, DType::f32, format.weights > 0 ? format.topk : 0),
          .format = format,
          .shape = source_.shape,
          .src_index = format.src_index > 0
                           ? reinterpret_cast<const int32_t*>(base + a.areas.src_index)
                           : nullptr};
    } else {
      // Lane x: out, the rows of this rank's counterpart on x's node for the peer it reaches;
      // in, rank x's own rows, from its forwarder here.
      const int source = lane_source(r), peer = layout_.forwarder_of(r);
      out[r] =
          plan_stream(static_cast<uint64_t>(records[static_cast<size_t>(source)].rows_to[peer]),
                      format, slots, 0);
      in[r] = plan_stream(static_cast<uint64_t>(from.rows_to[me_]), format, slots, 0);
    }
  }
}

const ep::RowFormat& HierDispatchStreams::stream_format(int peer) const {
  return counterpart(peer) ? fabric_format_ : format;
}

bool HierDispatchStreams::rows_ready(int d, uint64_t end) const {
  return !lane(d) || lane_rows_[static_cast<size_t>(d)].size() >= end;
}

void HierDispatchStreams::fill(int d, uint64_t first, uint64_t rows, std::byte* slot) {
  if (counterpart(d)) return fill_fabric(d, first, rows, slot);
  if (lane(d)) return fill_lane(d, first, rows, slot);
  DispatchStreams::fill(d, first, rows, slot);
}

void HierDispatchStreams::fill_fabric(int c, uint64_t first, uint64_t rows, std::byte* slot) {
  const int rpn = layout_.sizes().ranks_per_node, node = c / rpn;
  RowSource fabric = source_;
  fabric.format = fabric_format_;
  fabric.heads = send_head_.data<int32_t>();
  fabric.head_stride = session_.ranks();
  fabric.head_first = static_cast<int64_t>(node) * rpn;
  // A forwarder's row: global expert ids and weights as they are (rank < 0), and the heads.
  const auto sink = ep::RowSink::at(slot, ep::RowAreas::of(rows, fabric_format_), 0, -1);
  backend.pack_rows(
      fabric, sink,
      std::span<const int32_t>(nodes_.tokens_to[static_cast<size_t>(node)]).subspan(first, rows));
}

void HierDispatchStreams::fill_lane(int x, uint64_t first, uint64_t rows, std::byte* slot) {
  const Arrived& a = arrived_[static_cast<size_t>(lane_source(x))];
  const auto sink =
      ep::RowSink::at(slot, ep::RowAreas::of(rows, format), 0, layout_.forwarder_of(x));
  backend.pack_rows(
      a.source, sink,
      std::span<const int32_t>(lane_rows_[static_cast<size_t>(x)]).subspan(first, rows));
  rows_forwarded_ += rows;
}

void HierDispatchStreams::take(int s, uint64_t chunk, uint64_t first, uint64_t rows,
                               const std::byte* slot) {
  if (!counterpart(s)) return DispatchStreams::take(s, chunk, first, rows, slot);
  Arrived& a = arrived_[static_cast<size_t>(s)];
  require(static_cast<int64_t>(first + rows) <= a.rows, kPhase,
          "rank {} sent forwarder rows past the {} it announced", s, a.rows);
  // Out of the slot at once: its credit goes back when this returns.
  const auto chunk_areas = ep::RowAreas::of(rows, fabric_format_);
  const auto n = static_cast<int64_t>(rows);
  auto keep = [&](uint64_t to, uint64_t from, uint64_t unit) {
    if (unit > 0) backend.copy_rows(a.area.raw() + to + first * unit, slot + from, n, unit);
  };
  const ep::RowFormat& f = fabric_format_;
  keep(a.areas.x, chunk_areas.x, f.hidden_bytes);
  keep(a.areas.scales, chunk_areas.scales, 4ull * f.scale_cols);
  keep(a.areas.topk_idx, chunk_areas.topk_idx, 8ull * f.topk);
  keep(a.areas.weights, chunk_areas.weights, 4ull * f.weights);
  keep(a.areas.src_index, chunk_areas.src_index, 4ull * f.src_index);
  backend.copy_rows(a.heads.raw() + first * 4ull * f.heads, slot + chunk_areas.heads, n,
                    4ull * f.heads);
  if (f.topk > 0)
    backend.copy_rows(a.topk.raw() + first * 8ull * f.topk, slot + chunk_areas.topk_idx, n,
                      8ull * f.topk);
  // The heads (and expert ids) are read here, on the host: a device's copy of them must have run.
  backend.complete(kPhase);
  if (f.topk > 0)
    ep::node_order_rows(a.topk.data<int64_t>() + first * f.topk, n, static_cast<int>(f.topk),
                        source_.shape, layout_.node(),
                        a.orders.data<int32_t>() + first * layout_.sizes().ranks_per_node);

  // Each row's heads say where it goes on this node: to this rank (straight into the outputs)
  // or into a lane. Positions must come in order: a row out of place, or one that arrives twice,
  // fails here instead of landing where another row belongs.
  const int rpn = layout_.sizes().ranks_per_node, mine = me_ % rpn, node = s / rpn;
  const auto* heads = a.heads.data<int32_t>();
  std::vector<int32_t> own;
  for (uint64_t i = first; i < first + rows; ++i) {
    const int32_t* h = heads + i * static_cast<uint64_t>(rpn);
    for (int k = 0; k < rpn; ++k) {
      if (h[k] < 0) continue;
      if (k == mine) {
        require(h[k] == a.own + static_cast<int64_t>(own.size()), kPhase,
                "rank {}'s row {} is its row {} for this rank; expected {}", s, i, h[k],
                a.own + static_cast<int64_t>(own.size()));
        own.push_back(static_cast<int32_t>(i));
        continue;
      }
      const int x = node * rpn + k;  // the lane to this node's rank k, keyed by s
      std::vector<int32_t>& lane_rows = lane_rows_[static_cast<size_t>(x)];
      require(h[k] == static_cast<int32_t>(lane_rows.size()) && lane_rows.size() < out[x].rows,
              kPhase, "rank {}'s row {} is its row {} for rank {}; expected {} of {}", s, i, h[k],
              layout_.forwarder_of(x), lane_rows.size(), out[x].rows);
      lane_rows.push_back(static_cast<int32_t>(i));
    }
  }
  if (own.empty()) return;
  require(a.own + static_cast<int64_t>(own.size()) <= a.own_expected, kPhase,
          "rank {} forwards more rows for this rank than the {} it announced", s, a.own_expected);
  backend.pack_rows(a.source, output_sink(first_row_[s] + a.own), own);
  a.own += static_cast<int64_t>(own.size());
}

std::vector<ep::Tensor> HierDispatchStreams::forward_heads() const {
  std::vector<ep::Tensor> heads;
  for (int c = 0; c < session_.ranks(); ++c)
    if (counterpart(c)) heads.push_back(arrived_[static_cast<size_t>(c)].heads);
  return heads;
}

std::vector<ep::Tensor> HierDispatchStreams::forward_orders() const {
  std::vector<ep::Tensor> orders;
  for (int c = 0; c < session_.ranks(); ++c)
    if (counterpart(c) && arrived_[static_cast<size_t>(c)].orders.defined())
      orders.push_back(arrived_[static_cast<size_t>(c)].orders);
  return orders;
}

uint64_t HierDispatchStreams::rows_to_fabric() const {
  uint64_t rows = 0;
  for (int64_t n : nodes_.rows_to)
    rows += static_cast<uint64_t>(n);
  return rows;
}

}  // namespace proxyep::integrations::normal
