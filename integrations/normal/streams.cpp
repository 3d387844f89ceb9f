// Chunk streams over the peer channels (streams.hpp).
#include "integrations/normal/streams.hpp"

#include "common/error.hpp"
#include "integrations/normal/publish_queue.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

namespace {

uint64_t area_bytes(uint64_t rows, const ep::RowFormat& format) {
  return ep::RowAreas::of(rows, format).end;
}

// One rank's run of one call's streams: the sending and receiving cursors of every pair.
class StreamRun {
 public:
  StreamRun(proxy::Session& session, uint64_t call, RowStreams& streams, BufferStats& stats,
            PhaseClock& clock, std::string_view phase);
  void run();

 private:
  proxy::PeerChannel& channel(int r) const { return session_.channel(r); }
  std::vector<int> send_order() const;
  bool can_send(int d) const;
  void send(int d);
  void post(int d, uint64_t j, uint64_t rows);
  void count_sent(int d);
  uint64_t arrived(int s) const;
  bool take_arrived(int s);
  bool pending(int r) const;
  bool done() const;
  bool can_progress() const;
  std::string where(int r) const;

  proxy::Session& session_;
  const uint64_t call_;
  RowStreams& streams_;
  BufferStats& stats_;
  PhaseClock& clock_;
  const std::string_view phase_;
  const int ranks_, me_;
  std::vector<uint64_t> sent_, taken_;  // chunks, by peer
  std::vector<char> filling_;           // by peer: a chunk is filled and waits for its post
  PublishQueue publish_;
};

StreamRun::StreamRun(proxy::Session& session, uint64_t call, RowStreams& streams,
                     BufferStats& stats, PhaseClock& clock, std::string_view phase)
    : session_(session),
      call_(call),
      streams_(streams),
      stats_(stats),
      clock_(clock),
      phase_(phase),
      ranks_(session.ranks()),
      me_(session.rank()),
      sent_(static_cast<size_t>(ranks_), 0),
      taken_(static_cast<size_t>(ranks_), 0),
      filling_(static_cast<size_t>(ranks_), 0),
      publish_(streams.backend, phase) {
  for (int r = 0; r < ranks_; ++r) {
    if (r == me_) continue;
    channel(r).begin_streams(call, phase);
    // Eager streams went out with the records (send_eager).
    if (streams.out[r].eager) sent_[r] = 1;
  }
}

// Peers whose writes complete in the background first (their bytes travel while the others'
// are stored), each group in rotation from this rank, so that ranks do not all start on the
// same destination.
std::vector<int> StreamRun::send_order() const {
  std::vector<int> order;
  for (bool background : {true, false})
    for (int k = 1; k < ranks_; ++k) {
      const int d = (me_ + k) % ranks_;
      if (channel(d).background() == background) order.push_back(d);
    }
  return order;
}

bool StreamRun::can_send(int d) const {
  // One chunk at a time per peer: a fabric channel packs every chunk into its next staging slot.
  const ChunkPlan& p = streams_.out[d];
  return !filling_[d] && sent_[d] < p.chunks &&
         streams_.rows_ready(d, p.first_row(sent_[d]) + p.rows_in(sent_[d])) &&
         channel(d).can_send(sent_[d], p.shape());
}

void StreamRun::send(int d) {
  const ChunkPlan& p = streams_.out[d];
  const uint64_t j = sent_[d], rows = p.rows_in(j);
  proxy::PeerChannel& to = channel(d);
  if (to.sends_from_caller())
    if (const std::byte* rows_at = streams_.caller_rows(d, p.first_row(j), rows)) {
      to.send_chunk_from(j, p.shape(), rows_at, rows * streams_.stream_format(d).hidden_bytes,
                         phase_);
      clock_.lap(&PhaseTimes::post_ns);
      ++sent_[d];
      count_sent(d);
      ++stats_.chunks_sent_from_caller;
      return;
    }
  std::byte* slot = to.send_buffer(j, p.shape());
  streams_.fill(d, p.first_row(j), rows, slot);
  clock_.lap(&PhaseTimes::pack_ns);
  filling_[d] = 1;
  publish_.after_work(
      [this, d, j, rows] {
        clock_.lap(&PhaseTimes::pack_ns);  // waiting for the backend's packing
        post(d, j, rows);
      },
      to.posts_in_stream_order());
}

void StreamRun::post(int d, uint64_t j, uint64_t rows) {
  const ChunkPlan& p = streams_.out[d];
  proxy::PeerChannel& to = channel(d);
  const ep::RowFormat& format = streams_.stream_format(d);
  if (const int64_t at = streams_.landing_offset(d, p.first_row(j)); at >= 0) {
    // The token bytes lead the chunk (RowAreas::x is 0); the rest starts at the next area.
    const auto areas = ep::RowAreas::of(rows, format);
    to.send_chunk_in_place(j, p.shape(), rows * format.hidden_bytes, static_cast<uint64_t>(at),
                           areas.scales, areas.end - areas.scales, phase_);
  } else {
    to.send_chunk(j, p.shape(), area_bytes(rows, format), phase_);
  }
  session_.flush_device_route();  // a stream that posts leaves it once its packing ran
  clock_.lap(&PhaseTimes::post_ns);
  filling_[d] = 0;
  ++sent_[d];
  count_sent(d);
}

void StreamRun::count_sent(int d) {
  ++stats_.chunks_sent;
  if (session_.layout().fabric_peer(d)) ++stats_.chunks_to_fabric;
}

uint64_t StreamRun::arrived(int s) const {
  const ChunkPlan& p = streams_.in[s];
  if (p.eager) return channel(s).eager_arrived(call_) ? 1 : 0;
  return std::min(channel(s).landed(), p.chunks);
}

bool StreamRun::take_arrived(int s) {
  const ChunkPlan& p = streams_.in[s];
  const uint64_t upto = arrived(s);
  if (taken_[s] >= upto) return false;
  proxy::PeerChannel& from = channel(s);
  if (p.eager) {
    // No credit: the slot's next user is call + 2, after this rank's next record.
    streams_.take(s, 0, 0, p.rows, from.eager(call_));
    clock_.lap(&PhaseTimes::unpack_ns);
    taken_[s] = 1;
    return true;
  }
  for (uint64_t j = taken_[s]; j < upto; ++j)
    streams_.take(s, j, p.first_row(j), p.rows_in(j), from.chunk(j, p.shape()));
  clock_.lap(&PhaseTimes::unpack_ns);
  stats_.chunks_received += upto - taken_[s];
  taken_[s] = upto;
  publish_.after_work(
      [this, &from, &p, upto] {
        clock_.lap(&PhaseTimes::unpack_ns);  // waiting for the backend's copies out of the slots
        from.consumed(upto, p.chunks, p.shape(), phase_);  // these slots may be written again
        session_.flush_device_route();
        clock_.lap(&PhaseTimes::post_ns);
      },
      from.posts_in_stream_order());
  return true;
}

bool StreamRun::pending(int r) const {
  return r != me_ && (sent_[r] < streams_.out[r].chunks || taken_[r] < streams_.in[r].chunks);
}

bool StreamRun::done() const {
  for (int r = 0; r < ranks_; ++r)
    if (pending(r)) return false;
  return true;
}

bool StreamRun::can_progress() const {
  for (int r = 0; r < ranks_; ++r)
    if (r != me_ && (can_send(r) || arrived(r) > taken_[r])) return true;
  return false;
}

std::string StreamRun::where(int r) const {
  return fmt::format("sent {} of {} chunks ({}), received {} of {} (landed {})", sent_[r],
                     streams_.out[r].chunks, channel(r).send_progress(), taken_[r],
                     streams_.in[r].chunks, arrived(r));
}

void StreamRun::run() {
  const std::vector<int> order = send_order();
  bool local_done = false;
  while (true) {
    bool progressed = false;
    for (int d : order) {
      while (can_send(d)) {
        send(d);
        progressed = true;
      }
      if (!filling_[d] && sent_[d] < streams_.out[d].chunks) ++stats_.credit_stalls;
    }
    if (!local_done) {
      clock_.lap(&PhaseTimes::post_ns);  // the loop's own bookkeeping, with the posts
      streams_.local();
      clock_.lap(&PhaseTimes::local_ns);
      local_done = progressed = true;
    }
    for (int k = 1; k < ranks_; ++k)
      progressed |= take_arrived((me_ + k) % ranks_);
    // Nothing waits across the loop's own wait: the peers need these chunks and credits.
    publish_.publish_all();
    if (done()) return;
    if (!progressed) {
      clock_.lap(&PhaseTimes::post_ns);
      session_.await({.ready = [&] { return can_progress(); },
                      .pending = [&](int r) { return pending(r); },
                      .phase = phase_,
                      .what = "chunks of rows or their credits",
                      .detail = [&](int r) { return where(r); },
                      .on_lost = {}});
      clock_.lap(&PhaseTimes::wait_ns);
    }
  }
}

}  // namespace

std::vector<ChunkPlan> plan_streams(const proxy::Session& session, const ep::RowFormat& format,
                                    std::span<const int64_t> rows) {
  const uint64_t eager = session.layout().sizes().eager_limit;
  std::vector<ChunkPlan> plans(static_cast<size_t>(session.ranks()));
  for (int r = 0; r < session.ranks(); ++r)
    if (r != session.rank())
      plans[r] =
          plan_stream(static_cast<uint64_t>(rows[r]), format, session.channel(r).slots(), eager);
  return plans;
}

void chunk_fabric_out(const proxy::Session& session, RowStreams& streams, FabricChunking mine) {
  for (int r = 0; r < session.ranks(); ++r)
    if (session.layout().fabric_peer(r)) streams.out[r] = limit_chunks(streams.out[r], mine);
}

void chunk_fabric_in(const proxy::Session& session, RowStreams& streams,
                     const std::vector<NotifyRecord>& records) {
  for (int r = 0; r < session.ranks(); ++r)
    if (session.layout().fabric_peer(r))
      streams.in[r] =
          limit_chunks(streams.in[r], records[static_cast<size_t>(r)].header.fabric_chunking);
}

void require_row_fits(const proxy::Session& session, const ep::RowFormat& format,
                      std::string_view phase) {
  std::string why;
  for (int r = 0; r < session.ranks(); ++r)
    require(fits_one_row(format, session.channel(r).slots(), &why), phase, "{}", why);
}

void send_eager(proxy::Session& session, uint64_t call, RowStreams& streams, BufferStats& stats,
                PhaseClock& clock, std::string_view phase) {
  const int R = session.ranks(), me = session.rank();
  // Flushed as it ends.
  const proxy::DeviceRouteScope route(session, streams.backend.stream(), phase);
  PublishQueue publish(streams.backend, phase);
  for (int k = 1; k < R; ++k) {
    const int d = (me + k) % R;
    const ChunkPlan& p = streams.out[d];
    if (!p.eager) continue;
    ++stats.eager_streams;
    proxy::PeerChannel& to = session.channel(d);
    std::byte* slot = to.eager_buffer(call);
    streams.fill(d, 0, p.rows, slot);
    clock.lap(&PhaseTimes::pack_ns);
    publish.after_work(
        [&, d] {
          clock.lap(&PhaseTimes::pack_ns);
          session.channel(d).send_eager(
              call, area_bytes(streams.out[d].rows, streams.stream_format(d)), phase);
          clock.lap(&PhaseTimes::post_ns);
        },
        to.posts_in_stream_order());
  }
  publish.publish_all();
}

void run_streams(proxy::Session& session, uint64_t call, RowStreams& streams, BufferStats& stats,
                 PhaseClock& clock, std::string_view phase) {
  const proxy::DeviceRouteScope route(session, streams.backend.stream(), phase);
  StreamRun(session, call, streams, stats, clock, phase).run();
}

}  // namespace proxyep::integrations::normal
