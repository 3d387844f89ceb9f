// Buffer::Impl::run_transfer: one call's rows as chunk streams (the protocol in buffer_impl.hpp,
// the sizes in chunk_plan.hpp). One loop per rank both sends and receives, so two ranks that
// wait for each other's credits always also consume each other's chunks: no pair can deadlock.
#include "control/imm_layout.hpp"
#include "integrations/buffer_impl.hpp"

#include <fmt/format.h>

#include <atomic>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

namespace {

// Stream words: (call + 1) in the high 40 bits, a chunk count in the low 24, so a word left by
// an earlier call reads as 0 chunks.
constexpr uint32_t kCountBits = 24;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
static_assert(kMaxStreamRows <= static_cast<int64_t>(kCountMask));

uint64_t stream_word(uint64_t call, uint64_t count) {
  return ((call + 1) << kCountBits) | count;
}

uint64_t count_in(uint64_t word, uint64_t call) {
  return (word >> kCountBits) == (((call + 1) << kCountBits) >> kCountBits) ? word & kCountMask : 0;
}

uint64_t load_word(const uint64_t* word) {
  // Pairs with the release store of the peer that wrote it: its stores to the slot (published)
  // or its reads of the slot (consumed) happen before what follows the load.
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}

void store_word(uint64_t* word, uint64_t value) {
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_release);
}

}  // namespace

void Buffer::Impl::send_eager(uint64_t call, Transfer& t, std::string_view phase) {
  for (int k = 1; k < ranks; ++k) {
    const int d = (rank + k) % ranks;
    const ChunkPlan& p = t.out[d];
    if (!p.eager) continue;
    ++stats.eager_streams;
    const uint64_t bytes = ep::RowAreas::of(p.rows, t.format).end;
    (node->on_node(d) ? stats.bytes_to_node : stats.bytes_to_fabric) += bytes;
    if (node->on_node(d)) {
      t.fill(d, 0, p.rows, node->peer(d) + eager_offset(rank, call));
      continue;
    }
    const uint64_t at = staging_eager_offset(d, call);
    t.fill(d, 0, p.rows, static_cast<std::byte*>(staging->host()) + at);
    post_write(d, at, eager_offset(rank, call), bytes, call,
               control::imm::encode_counter(call, static_cast<uint32_t>(ranks + rank)), phase);
  }
}

void Buffer::Impl::run_transfer(uint64_t call, Transfer& t, std::string_view phase) {
  const int R = ranks;
  std::vector<uint64_t> sent(static_cast<size_t>(R), 0), taken(static_cast<size_t>(R), 0);
  // Eager streams went out with the notify records (exchange_notify expects those from other
  // nodes in the counter bank).
  for (int r = 0; r < R; ++r)
    if (t.out[r].eager) sent[r] = 1;
  // Streams between nodes number their chunks across calls: this call's chunk j is base + j.
  std::vector<uint64_t> recv_base(static_cast<size_t>(R), 0), credited(static_cast<size_t>(R), 0);
  for (int r = 0; r < R; ++r) {
    if (windows.size() <= static_cast<size_t>(r) || !windows[r]) continue;
    recv_base[r] = consumed_total[r];
    // Receivers send no credit for a call's last `window` chunks (the sender needs none, and it
    // may be gone when one would land): r's notify record of this call proved that r consumed
    // every chunk of the previous call, which is that credit.
    if (credits[r]->credit(static_cast<uint16_t>(credits[r]->posted())) != Status::ok)
      fail(std::string(phase), "stream to rank {}: {}", r, credits[r]->last_error());
  }
  std::byte* staging_base = staging ? static_cast<std::byte*>(staging->host()) : nullptr;

  auto can_send = [&](int d) {
    const ChunkPlan& p = t.out[d];
    const uint64_t j = sent[d];
    if (j >= p.chunks) return false;
    if (node->on_node(d))
      return j < p.window || count_in(load_word(consumed_word(rank, d)), call) + p.window > j;
    // The staging slot this chunk is packed into must have been read by its previous write.
    const auto slot = static_cast<uint32_t>(credits[d]->posted() % geometry.stage_window);
    const uint64_t previous = staged_at[d][slot];
    if (previous != kNeverPosted && engine->retired(ring_index) <= previous) return false;
    return credits[d]->available() > 0;
  };
  auto send = [&](int d) {
    const ChunkPlan& p = t.out[d];
    const uint64_t j = sent[d];
    const uint64_t first = p.first_row(j), rows = p.rows_in(j);
    if (node->on_node(d)) {
      t.fill(d, first, rows, data_area(d) + slot_offset(d, rank, p, j));
      store_word(published_word(d, rank), stream_word(call, j + 1));
    } else {
      const auto slot = static_cast<uint32_t>(credits[d]->posted() % geometry.stage_window);
      uint16_t seq = 0;
      if (credits[d]->acquire(seq) != Status::ok)
        fail(std::string(phase), "stream to rank {}: no credit after all ({})", d,
             credits[d]->last_error());
      const uint64_t at = staging_slot_offset(d, slot);
      t.fill(d, first, rows, staging_base + at);
      staged_at[d][slot] = pushed;  // the ring position of the write below
      post_write(d, at, data_offset() + slot_offset(d, rank, p, j),
                 ep::RowAreas::of(rows, t.format).end, call,
                 control::imm::encode_stream(call, static_cast<uint32_t>(rank), seq), phase);
    }
    ++sent[d];
    ++stats.chunks_sent;
    (node->on_node(d) ? stats.bytes_to_node : stats.bytes_to_fabric) +=
        ep::RowAreas::of(rows, t.format).end;
  };
  auto arrived = [&](int s) -> uint64_t {
    if (t.in[s].eager)  // a node peer's were published with its notify record
      return node->on_node(s) || counters->ready(call, static_cast<uint32_t>(R + s)) ? 1 : 0;
    const uint64_t landed = node->on_node(s) ? count_in(load_word(published_word(rank, s)), call)
                                             : windows[s]->tail() - recv_base[s];
    return std::min(landed, t.in[s].chunks);
  };
  auto take_arrived = [&](int s) {
    const ChunkPlan& p = t.in[s];
    const uint64_t upto = arrived(s);
    if (taken[s] >= upto) return false;
    if (p.eager) {
      t.take(s, 0, 0, p.rows, node->local() + eager_offset(s, call));
      taken[s] = 1;
      return true;  // no credit: the slot's next user is call + 2, after this rank's next record
    }
    for (uint64_t j = taken[s]; j < upto; ++j)
      t.take(s, j, p.first_row(j), p.rows_in(j), data_area(rank) + slot_offset(rank, s, p, j));
    stats.chunks_received += upto - taken[s];
    taken[s] = upto;
    // The credit: these slots may be written again.
    if (node->on_node(s)) {
      store_word(consumed_word(s, rank), stream_word(call, upto));
    } else {
      consumed_total[s] = recv_base[s] + upto;
      // Only credits that unlock one of this call's chunks: the sender posts its last chunk once
      // it holds chunks - window of them, and waits for nothing after that.
      const uint64_t useful = std::min(upto, p.chunks > p.window ? p.chunks - p.window : 0);
      if (useful <= credited[s]) return true;
      credited[s] = useful;
      post_write(s, 0, 0, 0, call,
                 control::imm::encode_credit(call, static_cast<uint32_t>(rank),
                                             static_cast<uint16_t>(recv_base[s] + useful)),
                 phase);
    }
    return true;
  };

  // Other nodes first (their writes travel while node peers' rows are stored), each group in
  // rotation from this rank, so that ranks do not all start on the same destination.
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass)
    for (int k = 1; k < R; ++k) {
      int d = (rank + k) % R;
      if (node->on_node(d) == (pass == 1)) order.push_back(d);
    }
  bool local_done = !t.local;
  auto pending = [&](int r) {
    return r != rank && (sent[r] < t.out[r].chunks || taken[r] < t.in[r].chunks);
  };
  auto can_progress = [&] {
    for (int r = 0; r < R; ++r)
      if (r != rank && (can_send(r) || arrived(r) > taken[r])) return true;
    return false;
  };
  while (true) {
    bool progressed = false;
    for (int d : order) {
      while (can_send(d)) {
        send(d);
        progressed = true;
      }
      if (sent[d] < t.out[d].chunks) ++stats.credit_stalls;
    }
    if (!local_done) {
      t.local();
      local_done = progressed = true;
    }
    for (int k = 1; k < R; ++k)
      progressed |= take_arrived((rank + k) % R);
    bool done = true;
    for (int r = 0; r < R && done; ++r)
      done = !pending(r);
    if (done) break;
    if (!progressed)
      await(can_progress, pending, phase, "chunks of rows or their credits", [&](int r) {
        std::string credit =
            node->on_node(r)
                ? fmt::format("consumed {}", count_in(load_word(consumed_word(rank, r)), call))
                : fmt::format("credits for {} of {} posted", credits[r]->acked(),
                              credits[r]->posted());
        return fmt::format("sent {} of {} chunks ({}), received {} of {} (landed {})", sent[r],
                           t.out[r].chunks, credit, taken[r], t.in[r].chunks, arrived(r));
      });
  }
}

}  // namespace proxyep
