// Multi-rank stress test of the ordering layer's counters (run under `proxyep launch`, exit code
// 0 = pass; with the reorder shim on, writes land and complete in any order as on EFA).
//
// 100,000 writes in total (all ranks, all epochs), each to a random rank and random counter key
// (source rank x key), carrying a counter immediate. Per epoch:
//   phase A  every rank sends most of its writes and waits until they completed locally, so
//            their completions reach the receivers before the receivers know what to expect;
//   notify   the per-destination count matrix is allgathered (a few writes per key are held
//            back, but counted); receivers set_expected() for every (source, key), checking
//            the counts against the plan they regenerate from the shared seed;
//   phase B  after a barrier, the held-back writes go out; every flag must rise by the deadline.
// Checks: a flag that rises while a write of its key is known unsent (held back, before the
// barrier), or before every byte of every write of its key landed, or with the receiver's own
// count of arrivals short of the plan, fails the run ("raised early"); a flag that does not rise
// by the deadline fails it, naming the keys ("missed"); begin_epoch() retiring each epoch must
// report no leak. Ranks move to epoch e+1 without a barrier, so early writes (tag e+1) reach
// ranks still finishing epoch e.
// --negative extra|missing: rank 0 sends one uncounted write to rank 1 in epoch 1 (or omits one
// counted write); rank 1 must report "too many" (or the missed key) and then the LEAK.
#include "control/counter_bank.hpp"
#include "control/imm_layout.hpp"
#include "ordering_harness.hpp"

#include <cstdio>
#include <cstring>
#include <random>

using namespace proxyep;
using testing::Harness;
namespace imm = control::imm;

namespace {

struct Config {
  testing::HarnessOptions harness;
  uint64_t writes = 100000;  // in total, across ranks and epochs
  int epochs = 4;
  uint32_t keys = 32;  // per source rank; the last 2 never receive writes (expect 0)
  std::string negative = "none";
};

struct Write {
  int dst = 0;
  uint32_t key = 0;  // the source's key 0..keys-1
  uint32_t length = 0;
  bool held = false;
  uint64_t send_offset = 0;  // in the source's send arena
  uint64_t recv_offset = 0;  // in the destination's section
};

using Plans = std::vector<std::vector<std::vector<Write>>>;  // [epoch][source]

Plans make_plans(const Config& cfg, int n, size_t& section_bytes, size_t& send_bytes) {
  Plans plans(cfg.epochs, std::vector<std::vector<Write>>(n));
  uint64_t slots = static_cast<uint64_t>(cfg.epochs) * n;
  section_bytes = send_bytes = 0;
  for (int e = 0; e < cfg.epochs; ++e) {
    std::vector<uint64_t> incoming(n, 0);
    for (int s = 0; s < n; ++s) {
      uint64_t index = static_cast<uint64_t>(e) * n + s;
      uint64_t count = cfg.writes / slots + (index < cfg.writes % slots ? 1 : 0);
      std::mt19937_64 rng(testing::mix(cfg.harness.seed, index));
      uint64_t offset = 0;
      for (uint64_t i = 0; i < count; ++i) {
        Write w;
        w.dst = static_cast<int>(rng() % n);
        w.key = static_cast<uint32_t>(rng() % (cfg.keys - 2));
        uint64_t shape = rng() % 64;
        w.length = static_cast<uint32_t>(shape == 0   ? 0                     // signal only
                                         : shape <= 2 ? 4096 + rng() % 16384  // segmented
                                                      : 8 + rng() % 249);
        w.held = w.key % 4 == 0 && rng() % 4 == 0;  // keys 1-3 mod 4: all in phase A
        w.send_offset = offset;
        offset += w.length;
        plans[e][s].push_back(w);
      }
      send_bytes = std::max<size_t>(send_bytes, offset);
    }
    for (int s = 0; s < n; ++s)  // sections: by source, then in plan order
      for (Write& w : plans[e][s]) {
        w.recv_offset = incoming[w.dst];
        incoming[w.dst] += w.length;
      }
    for (uint64_t bytes : incoming)
      section_bytes = std::max<size_t>(section_bytes, bytes);
  }
  return plans;
}

class StressRank {
 public:
  StressRank(const Config& cfg, Harness& h)
      : cfg_(cfg),
        h_(h),
        me_(h.rank()),
        n_(h.world()),
        keyspace_(n_ * cfg.keys),
        bank_(keyspace_, [this](uint64_t e, uint32_t key) { on_raise(e, key); }) {
    require(cfg.keys >= 3, "ordering", "--keys must be at least 3");
    require(cfg.negative == "none" || (cfg.epochs >= 2 && n_ >= 2), "ordering",
            "--negative needs 2 epochs and 2 ranks");
    plans_ = make_plans(cfg, n_, section_bytes_, send_bytes_);
    recv_ = h.open_region(2 * section_bytes_ + 64);  // two sections (epoch parity), extra slot
    send_ = h.open_send(send_bytes_);
    h.router().attach_counters(bank_);
    h.observe = [this](uint32_t raw) { observe(raw); };
    h.route_error = [this](const std::string& what) { route_failed(what); };
    for (auto& s : shadow_)
      s.assign(keyspace_, 0);
    if (cfg.negative != "none") pick_negative_key();
  }

  void run() {
    for (int e = 0; e < cfg_.epochs; ++e)
      run_epoch(e);
    begin(cfg_.epochs);  // retire the last two epochs: leak checks
    begin(cfg_.epochs + 1);
    h_.boot().barrier("ordering(done)");
    report();
  }

 private:
  bool negative_here(uint64_t e) const { return cfg_.negative != "none" && me_ == 1 && e == 1; }
  uint32_t global_key(int src, uint32_t key) const { return src * cfg_.keys + key; }

  // The key (of source 0 at rank 1, epoch 1) the negative test breaks: one with writes, none
  // held back. Both ranks compute it from the plan.
  void pick_negative_key() {
    for (uint32_t k = 0; k < cfg_.keys && negative_key_ < 0; ++k) {
      bool used = false, held = false;
      for (const Write& w : plans_[1][0])
        if (w.dst == 1 && w.key == k) (w.held ? held : used) = true;
      if (used && !held) negative_key_ = static_cast<int>(k);
    }
    require(negative_key_ >= 0, "ordering", "no key fits the negative test; use more writes");
  }

  void begin(uint64_t e) {
    for (uint32_t k = 0; k < keyspace_; ++k)
      shadow_[imm::epoch_tag(e + 2)][k] = 0;
    Status status = bank_.begin_epoch(e);
    if (cfg_.negative != "none" && me_ == 1 && e == 3) {
      std::string want = fmt::format("key {}: ", negative_key_);
      if (status != Status::error ||
          bank_.last_leak().find("LEAK in epoch 1") == std::string::npos ||
          bank_.last_leak().find(want) == std::string::npos)
        fail("ordering.negative", "begin_epoch(3) did not report the leak of key {} in epoch 1: {}",
             negative_key_, bank_.last_leak());
      fmt::print("rank 1: negative test: leak detected: {}\n", bank_.last_leak());
      detected_leak_ = true;
      return;
    }
    if (status != Status::ok) fail("ordering.begin_epoch", "{}", bank_.last_error());
  }

  // The bank's raise hook (this thread: inside set_expected or inside routing an arrival).
  void on_raise(uint64_t e, uint32_t key) {
    raised_.emplace_back(e, key);
    if (!in_notify_)
      ++raised_by_arrival_;
    else
      ++(total_[key] ? raised_by_expectation_ : zero_keys_);
  }

  void observe(uint32_t raw) {
    imm::Decoded d = imm::decode(raw);
    if (d.op() != imm::Op::counter || d.key() >= keyspace_) return;  // the router reports it
    ++shadow_[d.epoch_tag()][d.key()];
    if (d.epoch_tag() == imm::epoch_tag(epoch_ + 1)) ++early_arrivals_;
  }

  void route_failed(const std::string& what) {
    std::string want = fmt::format("key {} in epoch 1: ", negative_key_);
    if (cfg_.negative == "extra" && me_ == 1 && !detected_error_ &&
        what.find(want) != std::string::npos && what.find("too many") != std::string::npos) {
      fmt::print("rank 1: negative test: too many arrivals detected: {}\n", what);
      detected_error_ = true;
      return;
    }
    fail("ordering.route", "{}", what);
  }

  void pump() {
    h_.pump();
    check_raised();
  }

  // Every flag raised since the last call: it must be of this epoch, no write of its key may be
  // unsent, and every byte of every write of its key must have landed.
  void check_raised() {
    for (auto [e, key] : raised_) {
      if (e != epoch_)
        fail("ordering", "flag of key {} for epoch {} rose in epoch {}", key, e, epoch_);
      bool broken = negative_here(e) && key == global_key(0, negative_key_);  // no data check
      if (!broken && !phase_b_ && has_held_[key])
        fail("ordering",
             "epoch {}: flag of key {} (source {}) rose early: it has writes not sent yet", e, key,
             key / cfg_.keys);
      if (!broken && shadow_[imm::epoch_tag(e)][key] != total_[key])
        fail("ordering", "epoch {}: flag of key {} rose after {} of {} arrivals", e, key,
             shadow_[imm::epoch_tag(e)][key], total_[key]);
      if (!broken) verify_key(e, key);
      verified_[key] = true;
      ++verified_count_;
    }
    raised_.clear();
  }

  void verify_key(uint64_t e, uint32_t key) {
    const uint8_t* section = recv_ + (e % 2) * section_bytes_;
    for (auto [src, index] : by_key_[key]) {
      const Write& w = plans_[e][src][index];
      uint64_t h = testing::mix(testing::mix(e, src), index);
      for (size_t i = 0; i < w.length; ++i)
        if (section[w.recv_offset + i] != testing::pattern_byte(h, i))
          fail("ordering",
               "epoch {}: flag of key {} rose before byte {} of write {} from rank {} "
               "landed (early flag)",
               e, key, i, index, src);
    }
  }

  void prepare_epoch(uint64_t e) {
    by_key_.assign(keyspace_, {});
    total_.assign(keyspace_, 0);
    has_held_.assign(keyspace_, false);
    verified_.assign(keyspace_, false);
    verified_count_ = 0;
    phase_b_ = false;
    for (int src = 0; src < n_; ++src)
      for (size_t i = 0; i < plans_[e][src].size(); ++i) {
        const Write& w = plans_[e][src][i];
        if (w.dst != me_) continue;
        uint32_t key = global_key(src, w.key);
        by_key_[key].emplace_back(src, i);
        ++total_[key];
        if (w.held) has_held_[key] = true;
      }
    if (negative_here(e)) {
      uint32_t key = global_key(0, negative_key_);
      total_[key] += cfg_.negative == "extra" ? 1 : -1;
    }
    std::memset(recv_ + ((e + 1) % 2) * section_bytes_, 0, section_bytes_);  // for epoch e+1
    for (size_t i = 0; i < plans_[e][me_].size(); ++i) {
      const Write& w = plans_[e][me_][i];
      uint64_t h = testing::mix(testing::mix(e, me_), i);
      for (size_t b = 0; b < w.length; ++b)
        send_[w.send_offset + b] = testing::pattern_byte(h, b);
    }
  }

  void send(uint64_t e, bool held) {
    int skipped = 0;
    for (const Write& w : plans_[e][me_]) {
      if (w.held != held) continue;
      if (cfg_.negative == "missing" && me_ == 0 && e == 1 && w.dst == 1 &&
          static_cast<int>(w.key) == negative_key_ && skipped++ == 0)
        continue;  // the counted write that never goes out
      h_.write(w.dst, w.send_offset, w.length, (e % 2) * section_bytes_ + w.recv_offset,
               imm::encode_counter(e, global_key(me_, w.key)));
      ++writes_sent_;
      if (writes_sent_ % 16 == 0) pump();
    }
    if (held && cfg_.negative == "extra" && me_ == 0 && e == 1)  // one write nobody counted
      h_.write(1, 0, 8, 2 * section_bytes_, imm::encode_counter(e, global_key(0, negative_key_)));
  }

  void notify(uint64_t e) {
    std::vector<uint32_t> counts(n_ * cfg_.keys, 0);  // [dst][key] of my writes, held included
    for (const Write& w : plans_[e][me_])
      ++counts[w.dst * cfg_.keys + w.key];
    auto all = h_.boot().allgather(
        std::span(reinterpret_cast<const uint8_t*>(counts.data()), counts.size() * 4),
        "ordering(notify)");
    for (int src = 0; src < n_; ++src) {
      const auto* theirs = reinterpret_cast<const uint32_t*>(all[src].data());
      for (uint32_t k = 0; k < cfg_.keys; ++k) {
        uint32_t key = global_key(src, k), count = theirs[me_ * cfg_.keys + k];
        if (count != by_key_[key].size())
          fail("ordering", "notify: rank {} announced {} writes of key {}, the plan has {}", src,
               count, k, by_key_[key].size());
        pre_expectation_arrivals_ += shadow_[imm::epoch_tag(e)][key];
        in_notify_ = true;
        Status status = bank_.set_expected(e, key, count);
        in_notify_ = false;
        if (status != Status::ok) fail("ordering.set_expected", "{}", bank_.last_error());
      }
    }
    check_raised();
  }

  void wait_flags(uint64_t e) {
    auto deadline =
        negative_here(e) && cfg_.negative == "missing" ? Deadline::after_ms(2000) : h_.deadline();
    while (verified_count_ < keyspace_ && !deadline.expired())
      pump();
    if (verified_count_ == keyspace_) return;
    std::vector<std::string> missed;
    for (uint32_t key = 0; key < keyspace_; ++key)
      if (!verified_[key])
        missed.push_back(
            fmt::format("key {} (source {}): {} of {} arrived", key, key / cfg_.keys,
                        shadow_[imm::epoch_tag(e)][key],
                        total_[key] + (negative_here(e) && cfg_.negative == "missing" ? 1 : 0)));
    std::string text =
        fmt::format("epoch {}: {} flags missed: {}", e, missed.size(), fmt::join(missed, "; "));
    if (negative_here(e) && missed.size() == 1 &&
        missed[0].find(fmt::format("key {} ", global_key(0, negative_key_))) == 0) {
      fmt::print("rank 1: negative test: missed flag detected: {}\n", text);
      detected_error_ = true;
      return;
    }
    fail("ordering", "{}", text);
  }

  void run_epoch(uint64_t e) {
    if (e > 0) begin(e);
    epoch_ = e;
    prepare_epoch(e);
    send(e, false);                     // phase A
    h_.quiet_all("ordering(phase A)");  // landed: their completions precede the expectations
    for (int i = 0; i < 200; ++i)
      pump();
    notify(e);
    for (int i = 0; i < 200; ++i)
      pump();
    for (uint32_t key = 0; key < keyspace_; ++key)
      if (has_held_[key] && bank_.ready(e, key))
        fail("ordering", "epoch {}: key {} is ready before its held-back writes were sent", e, key);
    h_.boot().barrier("ordering(phase B)");
    phase_b_ = true;
    send(e, true);  // phase B
    wait_flags(e);
    h_.quiet_all("ordering(epoch end)");
  }

  void report() {
    if (cfg_.negative != "none" && me_ == 1 && !(detected_error_ && detected_leak_))
      fail("ordering.negative", "the {} write was not detected (error: {}, leak: {})",
           cfg_.negative, detected_error_, detected_leak_);
    if (cfg_.negative == "none" && pre_expectation_arrivals_ == 0)
      fail("ordering", "no write arrived before its expectation: the test did not test that");
    fmt::print(
        "rank {}: {} writes sent; {} arrivals before their expectation; flags raised by "
        "set_expected: {} (+{} expecting 0), by the last arrival: {}; {} early-epoch "
        "arrivals; {}\n",
        me_, writes_sent_, pre_expectation_arrivals_, raised_by_expectation_, zero_keys_,
        raised_by_arrival_, early_arrivals_,
        cfg_.negative == "none" ? "no early, missed or leaked count"
        : me_ == 1              ? "the injected fault was reported"
                                : "fault injection run");
  }

  const Config& cfg_;
  Harness& h_;
  int me_, n_;
  uint32_t keyspace_;
  control::CounterBank bank_;
  Plans plans_;
  size_t section_bytes_ = 0, send_bytes_ = 0;
  uint8_t* recv_ = nullptr;
  uint8_t* send_ = nullptr;
  uint64_t epoch_ = 0;
  std::vector<std::pair<uint64_t, uint32_t>> raised_;
  std::vector<uint64_t> shadow_[imm::kEpochTags];            // arrivals by epoch tag and key
  std::vector<std::vector<std::pair<int, size_t>>> by_key_;  // this epoch's writes to me
  std::vector<uint64_t> total_;
  std::vector<bool> has_held_, verified_;
  uint32_t verified_count_ = 0;
  bool phase_b_ = false, in_notify_ = false;
  int negative_key_ = -1;
  bool detected_error_ = false, detected_leak_ = false;
  uint64_t writes_sent_ = 0, pre_expectation_arrivals_ = 0, raised_by_expectation_ = 0,
           early_arrivals_ = 0, zero_keys_ = 0, raised_by_arrival_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ordering layer stress test: counters over an unordered fabric (proxyep launch)"};
  Config cfg;
  cfg.harness.add_to(app);
  app.add_option("--writes", cfg.writes, "writes in total, across ranks and epochs");
  app.add_option("--epochs", cfg.epochs);
  app.add_option("--keys", cfg.keys, "counter keys per source rank");
  app.add_option("--negative", cfg.negative)->check(CLI::IsMember({"none", "extra", "missing"}));
  CLI11_PARSE(app, argc, argv);
  try {
    Harness h(cfg.harness);
    StressRank rank(cfg, h);
    rank.run();
    h.finish("ordering_stress");
    if (h.rank() == 0)
      fmt::print(
          "ordering_stress: {} ranks, provider {}, reorder {}, {} writes over {} epochs: "
          "OK\n",
          h.world(), h.fabric().capabilities().provider, cfg.harness.reorder ? "on" : "off",
          cfg.writes, cfg.epochs);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "ordering_stress: error: %s\n", e.what());
    return 1;
  }
}
