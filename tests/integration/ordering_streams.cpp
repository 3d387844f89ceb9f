// Multi-rank test of the ordering layer's sequence windows and credits (run under `proxyep
// launch`, exit code 0 = pass; meant for the reorder shim, which lands and completes writes in
// any order as EFA does).
//
// Every rank streams chunks to every other rank: chunk p of the stream from s to d lands in
// slot p mod W of d's ring for s, with a stream immediate (stream id = s, 16-bit sequence). The
// receiver's SequenceWindow advances the visible tail over contiguous landed chunks only; the
// consumer reads every chunk below the tail and checks every byte, then returns credits as
// credit immediates (stream id = the receiver, its consumed tail) on zero-length writes. The
// sender's SenderCredits keep it within W unconsumed chunks. Sequences start just below 65536,
// so every stream wraps. A tail that passed an unlanded chunk, or a sender that overwrote an
// unconsumed slot, shows up as a wrong byte; a duplicate or out-of-window chunk, or a credit for
// chunks never sent, as a routing error. The send arena's slots are reused only after the
// QuietTracker says the write that last used them completed.
#include "control/imm_layout.hpp"
#include "control/sequence_window.hpp"
#include "ordering_harness.hpp"

#include <cstdio>
#include <memory>

using namespace proxyep;
using testing::Harness;
namespace imm = control::imm;

namespace {

struct Config {
  testing::HarnessOptions harness;
  uint64_t chunks = 24000;  // in total, over all streams
  uint32_t window = 32;
  uint32_t max_chunk = 6000;  // bytes; above the shim's 4096-byte segments
  uint16_t start = 65536 - 700;
};

class StreamRank {
 public:
  StreamRank(const Config& cfg, Harness& h)
      : cfg_(cfg),
        h_(h),
        me_(h.rank()),
        n_(h.world()),
        slot_(cfg.max_chunk),
        per_stream_(cfg.chunks / (static_cast<uint64_t>(n_) * (n_ - 1))),
        streams_(static_cast<size_t>(n_)) {
    require(n_ >= 2, "streams", "needs at least 2 ranks");
    recv_ = h.open_region(static_cast<size_t>(n_) * cfg.window * slot_);
    send_ = h.open_send(static_cast<size_t>(n_) * cfg.window * slot_);
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;
      Stream& s = streams_[p];
      s.in = std::make_unique<control::SequenceWindow>(cfg.window, cfg.start);
      s.out = std::make_unique<control::SenderCredits>(cfg.window, cfg.start);
      s.tickets.assign(cfg.window, 0);
      h.router().attach_stream(static_cast<uint32_t>(p), *s.in);    // chunks from p
      h.router().attach_credits(static_cast<uint32_t>(p), *s.out);  // credits from p
    }
  }

  void run() {
    while (!done()) {
      for (int p = 0; p < n_; ++p)
        if (p != me_) send_some(p);
      h_.pump();
      for (int p = 0; p < n_; ++p)
        if (p != me_) consume(p);
    }
    h_.quiet_all("streams(end)");
    h_.boot().barrier("streams(done)");
    fmt::print(
        "rank {}: {} chunks sent and {} received in order over {} streams each way "
        "(window {}), {} credits returned, {} sends stalled for credit\n",
        me_, sent_total_, consumed_total_, n_ - 1, cfg_.window, credits_sent_, stalls_);
  }

 private:
  struct Stream {
    std::unique_ptr<control::SequenceWindow> in;
    std::unique_ptr<control::SenderCredits> out;
    std::vector<uint64_t> tickets;  // ticket of the write that last used each send slot + 1
    uint64_t sent = 0, consumed = 0, credited = 0;
  };

  size_t chunk_length(int src, int dst, uint64_t p) const {
    uint64_t h = testing::mix(testing::mix(src, dst), p);
    return h % 32 == 0 ? 0 : 1 + h % cfg_.max_chunk;
  }
  uint64_t chunk_hash(int src, int dst, uint64_t p) const {
    return testing::mix(testing::mix(src * 1000 + dst, p), cfg_.harness.seed);
  }

  bool done() const {
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;
      const Stream& s = streams_[p];
      if (s.sent < per_stream_ || s.consumed < per_stream_ ||
          s.out->acked() != cfg_.start + per_stream_)
        return false;
    }
    return true;
  }

  void send_some(int dst) {
    Stream& s = streams_[dst];
    for (int burst = 0; burst < 8 && s.sent < per_stream_; ++burst) {
      uint16_t seq = 0;
      Status status = s.out->acquire(seq);
      if (status == Status::again) {
        ++stalls_;
        return;
      }
      uint64_t p = cfg_.start + s.sent;
      if (seq != static_cast<uint16_t>(p)) fail("streams", "credits gave seq {} for {}", seq, p);
      size_t slot = p % cfg_.window;
      // The send slot's previous write (chunk p - W) must have completed locally.
      h_.quiet().wait(s.tickets[slot], "streams(send slot)", h_.deadline(), [this] { h_.pump(); });
      size_t offset = (static_cast<size_t>(dst) * cfg_.window + slot) * slot_;
      size_t length = chunk_length(me_, dst, p);
      uint64_t h = chunk_hash(me_, dst, p);
      for (size_t i = 0; i < length; ++i)
        send_[offset + i] = testing::pattern_byte(h, i);
      uint64_t remote = (static_cast<size_t>(me_) * cfg_.window + slot) * slot_;
      s.tickets[slot] = h_.quiet().posted() + 1;  // the ticket write() is about to take, + 1
      h_.write(dst, offset, length, remote, imm::encode_stream(p >> 7, me_, seq));  // any epoch
      ++s.sent;
      ++sent_total_;
    }
  }

  void consume(int src) {
    Stream& s = streams_[src];
    uint64_t tail = s.in->tail();  // acquire: the chunks below it have landed
    for (; cfg_.start + s.consumed < tail; ++s.consumed, ++consumed_total_) {
      uint64_t p = cfg_.start + s.consumed;
      const uint8_t* slot =
          recv_ + (static_cast<size_t>(src) * cfg_.window + p % cfg_.window) * slot_;
      uint64_t h = chunk_hash(src, me_, p);
      for (size_t i = 0, n = chunk_length(src, me_, p); i < n; ++i)
        if (slot[i] != testing::pattern_byte(h, i))
          fail("streams",
               "chunk {} from rank {}: byte {} is wrong (the tail passed a chunk that "
               "had not landed, or the sender overwrote an unconsumed slot)",
               p, src, i);
    }
    bool last = s.consumed == per_stream_ && s.credited < per_stream_;
    if (s.consumed - s.credited >= cfg_.window / 4 || last) {
      auto tail16 = static_cast<uint16_t>(cfg_.start + s.consumed);
      h_.write(src, 0, 0, 0, imm::encode_credit(0, me_, tail16));
      s.credited = s.consumed;
      ++credits_sent_;
    }
  }

  const Config& cfg_;
  Harness& h_;
  int me_, n_;
  size_t slot_;
  uint64_t per_stream_;
  std::vector<Stream> streams_;  // by peer rank
  uint8_t* recv_ = nullptr;
  uint8_t* send_ = nullptr;
  uint64_t sent_total_ = 0, consumed_total_ = 0, credits_sent_ = 0, stalls_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ordering layer test: chunk streams with sequence windows and credits"};
  Config cfg;
  cfg.harness.add_to(app);
  app.add_option("--chunks", cfg.chunks, "chunks in total, over all streams");
  app.add_option("--window", cfg.window, "sequence window (a power of two <= 32768)");
  app.add_option("--max-chunk", cfg.max_chunk, "largest chunk in bytes");
  app.add_option("--start", cfg.start, "first sequence number of every stream");
  CLI11_PARSE(app, argc, argv);
  try {
    Harness h(cfg.harness);
    StreamRank rank(cfg, h);
    rank.run();
    h.finish("ordering_streams");
    if (h.rank() == 0)
      fmt::print("ordering_streams: {} ranks, provider {}, reorder {}: OK\n", h.world(),
                 h.fabric().capabilities().provider, cfg.harness.reorder ? "on" : "off");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "ordering_streams: error: %s\n", e.what());
    return 1;
  }
}
