// A dispatch's rows straight into the receivers' recv_x (landing_zone.hpp): the block this
// rank's recv_x takes, which peers store or write their rows' token bytes into it, and the wait
// for the writes of other nodes, which land apart from their chunks.
#include "common/error.hpp"
#include "integrations/normal/dispatch_call.hpp"
#include "integrations/normal/landing_zone.hpp"
#include "integrations/normal/normal_mode.hpp"

namespace proxyep::integrations::normal {

namespace {

constexpr const char* kPhase = "dispatch";

}  // namespace

gpu_side::ep::Tensor NormalMode::land_recv_x(const DispatchInput& in, const DispatchArgs& a,
                                             uint64_t offset, int64_t rows) {
  gpu_side::ep::Tensor recv_x = landing_->take(offset, a.x.dtype, rows, in.hidden);
  // The peers store into it already: it cannot be refused now (a bug if it is).
  require(recv_x.defined(), kPhase,
          "recv_x of {} rows does not fit the landing region at {}, which this rank offered", rows,
          offset);
  return recv_x;
}

void NormalMode::plan_in_place(DispatchCall& d, const std::vector<NotifyRecord>& records,
                               const RowCounts& counts) {
  if (!landing_) return;
  const int R = session_.ranks(), me = session_.rank();
  DispatchStreams& streams = *d.streams;
  // Streams that travel through slots only (eager rows went out before the offers) to a node
  // peer whose region is mapped here (stores) or a fabric peer whose region is registered
  // (writes).
  enum class Way { none, store, write };
  auto way = [&](int r, const ChunkPlan& plan) {
    if (r == me || plan.eager || plan.rows == 0) return Way::none;
    const proxy::PeerChannel& channel = session_.channel(r);
    if (!channel.background()) return landing_->region(r) != nullptr ? Way::store : Way::none;
    return channel.lands_in_place() ? Way::write : Way::none;
  };
  std::vector<std::byte*> x_to(static_cast<size_t>(R), nullptr);
  std::vector<int64_t> landing_at(static_cast<size_t>(R), -1);
  std::vector<char> x_from(static_cast<size_t>(R), 0);
  const bool mine_in_place = landing_place(records[me], counts, me) >= 0;
  d.landing_sources.clear();
  for (int r = 0; r < R; ++r) {
    const int64_t place = landing_place(records[r], counts, r);
    if (place >= 0) {
      const int64_t at = place + counts.first_from(me, r) * d.in.format.hidden_bytes;
      const Way to = way(r, streams.out[r]);
      if (to == Way::store) x_to[r] = landing_->region(r) + at;
      if (to == Way::write) landing_at[r] = at;
    }
    const Way from = mine_in_place ? way(r, streams.in[r]) : Way::none;
    x_from[r] = from != Way::none ? 1 : 0;
    if (from == Way::write) {
      session_.channel(r).expect_in_place(d.call, streams.in[r].chunks, kPhase);
      d.landing_sources.push_back(r);
    }
  }
  streams.store_in_place(std::move(x_to), std::move(landing_at), std::move(x_from));
}

// The token bytes other nodes wrote into recv_x land apart from their chunks (which have all
// arrived): wait for the last of them.
void NormalMode::await_in_place(DispatchCall& d) {
  if (d.landing_sources.empty()) return;
  auto landed = [&](int r) { return session_.channel(r).in_place_landed(d.call); };
  session_.await({.ready =
                      [&] {
                        for (int r : d.landing_sources)
                          if (!landed(r)) return false;
                        return true;
                      },
                  .pending =
                      [&](int r) {
                        for (int s : d.landing_sources)
                          if (s == r) return !landed(r);
                        return false;
                      },
                  .phase = kPhase,
                  .what = "rows written into this rank's recv_x",
                  .detail = {},
                  .on_lost = {}});
}

}  // namespace proxyep::integrations::normal
