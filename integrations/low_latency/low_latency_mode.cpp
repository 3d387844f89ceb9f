// What both LL calls share: the agreement on sizes, sending to every rank, receiving from every
// rank, releasing slots, and when the receive phase runs (low_latency_mode.hpp).
#include "integrations/low_latency/low_latency_mode.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "integrations/await_every.hpp"
#include "integrations/low_latency/ll_sizes.hpp"
#include "integrations/low_latency/ll_tensors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::low_latency {

namespace {

constexpr const char* kCleanPhase = "clean_low_latency_buffer";

int64_t nanoseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

}  // namespace

LowLatencyMode::LowLatencyMode(proxy::Session& session, RowBackend& backend, CallSequence& calls,
                               CommStream& stream, uint64_t buffer_id, bool enable_shrink)
    : session_(session),
      backend_(backend),
      calls_(calls),
      stream_(stream),
      buffer_id_(buffer_id),
      shrink_(enable_shrink),
      masked_(static_cast<size_t>(session.ranks()), 0),
      alive_(std::make_shared<LowLatencyMode*>(this)) {
  if (shrink_)
    calls_.set_peer_policy([this](int r) { return masked_[static_cast<size_t>(r)] == 0; },
                           [this](int r, const std::string& why) {
                             return lose(r, why, calls_.calls() - 1, "low-latency call");
                           });
}

// ---- rank masking ----

void LowLatencyMode::mask(int rank, bool masked) {
  masked_[static_cast<size_t>(rank)] = masked ? 1 : 0;
  session_.ignore_peer(rank, masked);
}

bool LowLatencyMode::lose(int rank, const std::string& why, uint64_t call, std::string_view phase) {
  if (!shrink_ || rank == session_.rank()) return false;
  mask(rank, true);
  session_.channel(rank).forget(call);
  log::warn("{}: rank {} is masked from now on ({}); the call goes on without it", phase, rank,
            why);
  return true;
}

void LowLatencyMode::update_mask(int rank, bool mask_it) {
  constexpr const char* kPhase = "low_latency_update_mask_buffer";
  require(shrink_, kPhase, "the Buffer was not created with enable_shrink=True");
  require(rank >= 0 && rank < session_.ranks(), kPhase, "rank {} is not in the group of {}", rank,
          session_.ranks());
  require(!mask_it || rank != session_.rank(), kPhase, "a rank cannot mask itself");
  mask(rank, mask_it);
}

void LowLatencyMode::query_mask(const gpu_side::ep::TensorRef& out, RowBackend* device) {
  constexpr const char* kPhase = "low_latency_query_mask_buffer";
  require(shrink_, kPhase, "the Buffer was not created with enable_shrink=True");
  const bool on_device = device != nullptr;
  check_tensor(out, gpu_side::ep::DType::i32, session_.ranks(), -1, on_device, kPhase,
               "mask_status", on_device);
  std::vector<int32_t> status(masked_.begin(), masked_.end());
  if (on_device) {
    device->write(static_cast<std::byte*>(const_cast<void*>(out.data)), status.data(),
                  4 * status.size());
    device->complete(kPhase);
    return;
  }
  for (int r = 0; r < session_.ranks(); ++r)
    written_at<int32_t>(out, r) = status[static_cast<size_t>(r)];
}

void LowLatencyMode::clean_mask() {
  require(shrink_, "low_latency_clean_mask_buffer",
          "the Buffer was not created with enable_shrink=True");
  for (int r = 0; r < session_.ranks(); ++r)
    mask(r, false);
}

bool LowLatencyMode::any_masked() const {
  return std::find(masked_.begin(), masked_.end(), 1) != masked_.end();
}

void LowLatencyMode::check_slot_fits(const LlShape& shape, std::string_view phase) const {
  const uint64_t need = ll_slot_bytes(shape, session_.ranks());
  const uint64_t have = session_.layout().sizes().eager_bytes;
  require(need <= have, phase,
          "num_rdma_bytes is too small for low-latency calls of {} on {} ranks: they need {} "
          "bytes (Buffer.get_low_latency_rdma_size_hint({}, {}, {}, {}))",
          describe(shape), session_.ranks(), ll_size_hint(shape, session_.ranks()), shape.tokens,
          shape.hidden, session_.ranks(), shape.experts);
}

void LowLatencyMode::clean(const LlShape& shape) {
  check_shape(shape, session_.ranks(), kCleanPhase);
  check_slot_fits(shape, kCleanPhase);
  agree(shape, kCleanPhase);
}

// A sync call: every rank sends its shape to every rank and compares. A disagreement fails every
// rank alike after a complete exchange, so the sequence stays intact and the Buffer usable.
void LowLatencyMode::agree(const LlShape& shape, std::string_view phase) {
  calls_.check_can_begin(CallKind::sync, phase);
  require(!any_masked(), phase,
          "ranks are masked: agreeing on new low-latency sizes needs every rank (use the sizes "
          "agreed before, or a new Buffer)");
  const int R = session_.ranks();
  const uint64_t call = calls_.begin(CallKind::sync, phase, nullptr);  // records only
  std::vector<LlRecord> records;
  calls_.step([&] {
    for (int s = 0; s < R; ++s)
      session_.channel(s).expect_record(call, phase);
    calls_.await_slots_free(call, phase);
    LlRecord mine;
    mine.kind = LlKind::agree;
    mine.shape = shape;
    for (int d = 0; d < R; ++d) {
      proxy::PeerChannel& to = session_.channel(d);
      to.send_record(call, encode_ll_record(mine, to.record_buffer(call), phase), phase);
    }
    await_every(
        session_, [&](int s) { return session_.channel(s).record_arrived(call); }, phase,
        "the low-latency sizes");
    for (int s = 0; s < R; ++s) {
      records.push_back(decode_ll_record(session_.channel(s).record(call), s, phase));
      require(records.back().kind == LlKind::agree, phase,
              "rank {} made a {} call while this rank agrees on the low-latency sizes: every "
              "rank must make the same calls in the same order",
              s, kind_name(records.back().kind));
    }
    session_.quiet(phase);
  });
  std::string differ;
  for (int s = 0; s < R; ++s)
    if (!(records[s].shape == shape))
      differ += fmt::format("; rank {}: {}", s, describe(records[s].shape));
  require(differ.empty(), phase,
          "every rank must use the same low-latency sizes: rank {} uses {}{}", session_.rank(),
          describe(shape), differ);
  agreed_ = shape;
}

void LowLatencyMode::send_phase(const CallState& state, const Sends& sends,
                                std::string_view phase) {
  calls_.step([&] {
    for (int s = 0; s < session_.ranks(); ++s)
      if (!masked_[static_cast<size_t>(s)]) session_.channel(s).expect_record(state.call, phase);
    calls_.await_slots_free(state.call, phase);
    send_all(state, sends, phase);
  });
}

void LowLatencyMode::send_all(const CallState& state, const Sends& sends, std::string_view phase) {
  const int R = session_.ranks();
  // A device call's writes to other nodes go through the backend's stream (DeviceRouteScope):
  // posted at once, they leave once the stream has packed their messages.
  const proxy::DeviceRouteScope route(session_, state.backend->stream(), phase);
  // Writes to other nodes complete in the background: start them before the stores.
  for (bool background : {true, false}) {
    std::vector<int> group;
    bool in_stream_order = true;
    for (int d = 0; d < R; ++d)
      if (session_.channel(d).background() == background && !masked_[static_cast<size_t>(d)]) {
        group.push_back(d);
        in_stream_order &= session_.channel(d).posts_in_stream_order();
      }
    sends.fill(group);
    if (!in_stream_order) state.backend->complete(phase);  // the messages are in the slots
    for (int d : group) {
      proxy::PeerChannel& to = session_.channel(d);
      LlRecord record;
      record.kind = state.kind;
      record.shape = state.shape;
      record.flags = state.flags;
      record.eager_bytes = sends.describe(d, record.counts);
      if (record.eager_bytes > 0) to.send_eager(state.call, record.eager_bytes, phase);
      to.send_record(state.call, encode_ll_record(record, to.record_buffer(state.call), phase),
                     phase);
    }
    session_.flush_device_route();  // they leave while the node peers' messages are stored
  }
}

std::vector<LlRecord> LowLatencyMode::receive_all(const CallState& state,
                                                  std::vector<int64_t>& waited_ns,
                                                  std::string_view phase) {
  const int R = session_.ranks();
  const auto start = std::chrono::steady_clock::now();
  waited_ns.assign(static_cast<size_t>(R), -1);
  // A source counts as arrived once its record and (when it announced some) its messages are.
  std::vector<LlRecord> records(static_cast<size_t>(R));
  std::vector<uint8_t> have_record(static_cast<size_t>(R), 0);
  auto arrived = [&](int s) {
    if (waited_ns[s] >= 0 || masked_[static_cast<size_t>(s)]) return true;
    proxy::PeerChannel& from = session_.channel(s);
    if (!have_record[s]) {
      if (!from.record_arrived(state.call)) return false;
      records[s] = decode_ll_record(from.record(state.call), s, phase);
      have_record[s] = 1;
      if (records[s].eager_bytes > 0) from.expect_eager(state.call, phase);
    }
    if (records[s].eager_bytes > 0 && !from.eager_arrived(state.call)) return false;
    waited_ns[s] = nanoseconds_since(start);
    return true;
  };
  std::function<bool(int, const std::string&)> on_lost;
  if (shrink_)
    on_lost = [&](int s, const std::string& why) { return lose(s, why, state.call, phase); };
  await_every(session_, arrived, phase,
              state.kind == LlKind::dispatch ? "the dispatched tokens" : "the combined rows",
              on_lost);
  for (int s = 0; s < R; ++s) {
    if (masked_[static_cast<size_t>(s)]) {  // contributes nothing (DeepEP skips masked ranks)
      records[s] = LlRecord{};
      records[s].kind = state.kind;
      records[s].shape = state.shape;
      records[s].flags = state.flags;
      if (state.kind == LlKind::dispatch)
        records[s].counts.assign(static_cast<size_t>(state.shape.experts / R), 0);
      waited_ns[s] = 0;
      continue;
    }
    const LlRecord& r = records[s];
    require(r.kind == state.kind, phase,
            "rank {} made a {} call while this rank made a {} call: every rank must make the "
            "same calls in the same order",
            s, kind_name(r.kind), kind_name(state.kind));
    require(r.shape == state.shape && r.flags == state.flags, phase,
            "rank {} called {} with {} (flags {:#x}), this rank with {} (flags {:#x}): every "
            "rank must pass the same sizes and formats",
            s, kind_name(state.kind), describe(r.shape), r.flags, describe(state.shape),
            state.flags);
  }
  return records;
}

void LowLatencyMode::receive(CallState& state) {
  if (state.received) return;
  const char* phase = kind_name(state.kind);
  calls_.check_usable(phase);
  calls_.step([&] {
    if (state.kind == LlKind::dispatch)
      receive_dispatch(state);
    else
      receive_combine(state);
    // The slots it read are released next, and the outputs are the caller's.
    state.backend->complete(phase);
  });
  state.received = true;
  calls_.finish_deferred(state.call, phase);
}

void LowLatencyMode::launch(const std::shared_ptr<CallState>& state, std::function<void()> send,
                            bool hook, bool async, RecvHook& out_hook, CallEvent& out_event) {
  state->call =
      calls_.begin(CallKind::deferred, kind_name(state->kind), state->backend->stream().get());
  std::weak_ptr<LowLatencyMode*> alive = alive_;
  auto receive_phase = [alive, state] {
    auto mode = alive.lock();
    require(mode != nullptr, kind_name(state->kind),
            "the Buffer was destroyed before this call's receive phase");
    (*mode)->receive(*state);
  };
  if (hook) {
    // Every later Buffer call, the hook included, first finishes it (settle()): it runs the send
    // itself if the stream has not started it, so a late stream never delays the receive.
    stream_.submit(std::move(send));
    out_hook = RecvHook([settle = stream_.settler(), receive_phase] {
      settle();
      receive_phase();
    });
  } else if (async) {
    // In submission order: the calls before it finish first, as on a stream.
    out_event = stream_.submit_call(
        [send = std::move(send), receive_phase] {
          send();
          receive_phase();
        },
        state->backend->stream() != nullptr, kind_name(state->kind));
  } else {
    send();
    receive(*state);
  }
}

gpu_side::ep::Tensor LowLatencyMode::output(gpu_side::ep::Tensor& pooled, gpu_side::ep::DType dtype,
                                            int64_t rows, int64_t cols) {
  const bool fits = pooled.defined() && pooled.use_count() == 1 && pooled.dtype() == dtype &&
                    pooled.rows() == rows &&
                    (cols < 0 ? pooled.dims() == 1 : pooled.cols() == cols);
  if (!fits)
    pooled = cols < 0 ? backend_.allocate(dtype, rows) : backend_.allocate(dtype, rows, cols);
  return pooled;
}

std::pair<int64_t, int64_t> LowLatencyMode::combine_buffer_shape(
    const LowLatencyHandle& handle) const {
  require(handle.dispatched != nullptr && handle.dispatched->buffer_id == buffer_id_,
          "get_next_low_latency_combine_buffer",
          "the handle was not made by this Buffer's low_latency_dispatch");
  const LlShape& s = handle.dispatched->shape;
  return {static_cast<int64_t>(s.experts / session_.ranks()) * session_.ranks() * s.tokens,
          s.hidden};
}

gpu_side::ep::Tensor LowLatencyMode::next_combine_buffer(const LowLatencyHandle& handle) {
  const auto [rows, cols] = combine_buffer_shape(handle);
  if (combine_buffer_.rows() != rows || combine_buffer_.cols() != cols)
    combine_buffer_ = ep::Tensor::zeros(ep::DType::bf16, rows, cols);
  return combine_buffer_;
}

}  // namespace proxyep::integrations::low_latency
