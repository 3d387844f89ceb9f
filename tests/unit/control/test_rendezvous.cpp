// Only the job's own ranks join a rendezvous (control/rendezvous_auth.hpp): strangers of every
// kind are refused, logged and dropped while the job completes; ranks of another job, or with
// another secret, fail naming why; a rank does not join a rank 0 that cannot prove the secret.
#include "common/crypto.hpp"
#include "common/log.hpp"
#include "control/bootstrap.hpp"
#include "control/bootstrap_wire.hpp"
#include "control/rendezvous_auth.hpp"
#include "tests/unit/control/rank_threads.hpp"
#include "tests/unit/control/raw_peer.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

using namespace proxyep;
using namespace proxyep::control;
using namespace proxyep::control::testing;

namespace {

std::shared_ptr<const SecretBytes> secret_of(const std::string& text) {
  return std::make_shared<const SecretBytes>(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// Long enough for a loaded 2-core machine to finish a rendezvous; short because tests whose rank
// 0 must wait for a rank that was refused wait this long.
constexpr auto kShort = 3000ms;

const auto kSecretA = secret_of("job A's secret: 0123456789abcdef");
const auto kSecretB = secret_of("another secret: fedcba9876543210");

// Rank 0's warnings, as the operator would read them.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    log::logger().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = log::logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  bool contains(const std::string& text) const {
    for (const auto& line : sink_->last_formatted())
      if (line.find(text) != std::string::npos) return true;
    return false;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

// A member of a job: connects with the job's id and secret (after `delay`), then one barrier.
RankBody member(std::string job_id, std::shared_ptr<const SecretBytes> secret,
                std::function<void()> wait_before = {}) {
  return [=](Bootstrap::Options options) {
    if (wait_before) wait_before();
    options.job_id = job_id;
    options.secret = secret;
    auto boot = Bootstrap::connect(std::move(options));
    boot->barrier("joined");
  };
}

// Waits (bounded) until `flag` is set: a test's ordering, never its verdict.
void await_flag(const std::atomic<bool>& flag, std::chrono::milliseconds limit = 10s) {
  Deadline deadline(limit);
  while (!flag.load() && !deadline.expired())
    std::this_thread::sleep_for(5ms);
}

wire::Header hello_header(uint32_t rank, uint32_t world) {
  return wire::Header{.kind = wire::Kind::hello, .rank = rank, .aux = world};
}

// A hello as a real rank would build it for `challenge`, with the given credentials.
wire::Bytes real_hello(const wire::Challenge& challenge, uint32_t rank, uint32_t world,
                       const std::string& job_id, const SecretBytes* secret,
                       const wire::Nonce* server_nonce = nullptr) {
  wire::Hello hello{job_id, fresh_nonce(), std::nullopt, "pid 1 on host stranger"};
  HandshakeClaims claims{rank,         world,
                         job_id,       server_nonce ? server_nonce : &challenge.nonce,
                         &hello.nonce, hello.identity};
  if (secret) hello.mac = hello_mac(*secret, claims);
  return wire::encode_hello(hello);
}

// One way a stranger can knock: what it sends once it has read rank 0's challenge.
struct Stranger {
  const char* what;
  std::function<void(RawPeer&, const wire::Challenge&)> act;
  const char* refusal;  // part of rank 0's logged reason and of the abort it sends back
};

std::vector<Stranger> strangers() {
  const std::string job = "job-a";
  return {
      {"bytes that are not a frame",
       [](RawPeer& peer, const wire::Challenge&) {
         std::string junk = "GET / HTTP/1.0\r\n\r\n and some more bytes";
         peer.send_raw(wire::as_bytes(junk));
       },
       "not a ProxyEP rank: bad magic"},
      {"an old-style (version 1) hello claiming rank 1",
       [](RawPeer& peer, const wire::Challenge&) {
         auto header = hello_header(1, 2);
         header.version = 1;
         peer.send(header, wire::as_bytes("pid 1 on host old"));
       },
       "protocol version 1"},
      {"a hello without a MAC",
       [=](RawPeer& peer, const wire::Challenge& c) {
         peer.send(hello_header(1, 2), real_hello(c, 1, 2, job, nullptr));
       },
       "offers no proof of the job's secret"},
      {"a hello with a MAC under another secret",
       [=](RawPeer& peer, const wire::Challenge& c) {
         peer.send(hello_header(1, 2), real_hello(c, 1, 2, job, kSecretB.get()));
       },
       "does not verify"},
      {"a replayed hello (right secret, another connection's challenge)",
       [=](RawPeer& peer, const wire::Challenge& c) {
         wire::Nonce recorded = fresh_nonce();
         peer.send(hello_header(1, 2), real_hello(c, 1, 2, job, kSecretA.get(), &recorded));
       },
       "does not verify"},
      {"a hello whose MAC does not cover its claims (rank 1 claimed, rank 2 signed)",
       [=](RawPeer& peer, const wire::Challenge& c) {
         peer.send(hello_header(1, 2), real_hello(c, 2, 2, job, kSecretA.get()));
       },
       "does not verify"},
      {"a hello of another job",
       [=](RawPeer& peer, const wire::Challenge& c) {
         peer.send(hello_header(1, 2), real_hello(c, 1, 2, "job-b", kSecretA.get()));
       },
       "belongs to job 'job-b', rank 0 to job 'job-a'"},
      {"a malformed hello",
       [](RawPeer& peer, const wire::Challenge&) {
         peer.send(hello_header(1, 2), wire::Bytes{0xff, 0xff, 0, 0, 'x'});
       },
       "malformed hello"},
      {"a frame larger than a handshake",
       [](RawPeer& peer, const wire::Challenge&) {
         wire::Bytes big(64 * 1024, 'x');
         peer.send(hello_header(1, 2), big);
       },
       "exceeds this connection's limit"},
      {"a contribution instead of a hello",
       [](RawPeer& peer, const wire::Challenge&) {
         peer.send(wire::Header{.kind = wire::Kind::contribute, .seq = 1, .rank = 1}, {});
       },
       "expected a hello"},
  };
}

}  // namespace

TEST_CASE("rendezvous: a stranger claiming rank 1 first is refused and logged; the job completes") {
  for (const auto& stranger : strangers()) {
    std::string what = stranger.what;
    CAPTURE(what);
    LogCapture log;
    std::atomic<bool> refused{false};
    std::string answer;  // what the stranger was told
    wire::Challenge challenge;
    auto intruder = [&](Bootstrap::Options options) {
      auto peer = RawPeer::connect(options.env.master_port);
      auto first = peer.read(10s);
      if (!first || first->header.kind != wire::Kind::challenge) {
        refused = true;
        throw std::runtime_error("no challenge from rank 0");
      }
      challenge = wire::decode_challenge(first->payload);
      stranger.act(peer, challenge);
      if (auto abort = peer.read_until(wire::Kind::abort, 10s))
        answer = wire::as_text(abort->payload);
      refused = true;
    };
    // The real rank 1 arrives only after the stranger has been dealt with.
    auto late_rank1 = member("job-a", kSecretA, [&] { await_flag(refused); });
    auto outcomes =
        run_bodies({member("job-a", kSecretA), late_rank1, intruder}, 2, 10s, {0, 1, 1});
    CHECK_MESSAGE(outcomes[0].ok, outcomes[0].error);
    CHECK_MESSAGE(outcomes[1].ok, outcomes[1].error);
    CHECK_MESSAGE(outcomes[2].ok, outcomes[2].error);
    CHECK(challenge.job_id == "job-a");
    CHECK(challenge.secret_required);
    CAPTURE(answer);
    CHECK(contains(answer, "rank 0 refused this rank"));
    CHECK(contains(answer, stranger.refusal));
    CHECK(log.contains("rank 0 refused a connection"));
    CHECK(log.contains(stranger.refusal));
  }
}

TEST_CASE("rendezvous: without a secret, a stranger of another job does not displace rank 1") {
  LogCapture log;
  std::atomic<bool> refused{false};
  std::string answer;
  auto intruder = [&](Bootstrap::Options options) {
    auto peer = RawPeer::connect(options.env.master_port);
    auto challenge = peer.read_until(wire::Kind::challenge, 10s);
    if (!challenge) throw std::runtime_error("no challenge from rank 0");
    auto decoded = wire::decode_challenge(challenge->payload);
    peer.send(hello_header(1, 2), real_hello(decoded, 1, 2, "job-b", nullptr));
    if (auto abort = peer.read_until(wire::Kind::abort, 10s))
      answer = wire::as_text(abort->payload);
    refused = true;
  };
  auto late_rank1 = member("job-a", nullptr, [&] { await_flag(refused); });
  auto outcomes = run_bodies({member("job-a", nullptr), late_rank1, intruder}, 2, 10s, {0, 1, 1});
  for (const auto& outcome : outcomes)
    CHECK_MESSAGE(outcome.ok, outcome.error);
  CHECK(contains(answer, "belongs to job 'job-b'"));
  CHECK(log.contains("refused a connection"));
}

TEST_CASE("rendezvous: two jobs on one port do not pair up; the intruding job's rank names why") {
  for (bool with_secret : {false, true}) {
    CAPTURE(with_secret);
    std::atomic<bool> intruder_done{false};
    auto secret_a = with_secret ? kSecretA : nullptr;
    auto secret_b = with_secret ? kSecretB : nullptr;
    auto job_b_rank1 = [&](Bootstrap::Options options) {
      try {
        member("job-b", secret_b)(std::move(options));
      } catch (...) {
        intruder_done = true;
        throw;
      }
      intruder_done = true;
    };
    auto job_a_rank1 = member("job-a", secret_a, [&] { await_flag(intruder_done); });
    auto outcomes =
        run_bodies({member("job-a", secret_a), job_a_rank1, job_b_rank1}, 2, 10s, {0, 1, 1});
    CHECK_MESSAGE(outcomes[0].ok, outcomes[0].error);
    CHECK_MESSAGE(outcomes[1].ok, outcomes[1].error);
    CAPTURE(outcomes[2].error);
    CHECK_FALSE(outcomes[2].ok);
    CHECK(contains(outcomes[2].error, "bootstrap.rendezvous"));
    CHECK(contains(outcomes[2].error,
                   "serves another job: its job id is 'job-a', this rank's is "
                   "'job-b'"));
    // It failed on what it was told, long before its own deadline.
    CHECK(outcomes[2].elapsed < 5s);
  }
}

TEST_CASE("rendezvous: a rank with the wrong secret is refused with a clear error on its side") {
  LogCapture log;
  auto outcomes = run_bodies({member("job-a", kSecretA), member("job-a", kSecretB)}, 2, kShort);
  CAPTURE(outcomes[1].error);
  CHECK_FALSE(outcomes[1].ok);
  CHECK(contains(outcomes[1].error, "bootstrap.rendezvous: rank 0 refused this rank"));
  CHECK(contains(outcomes[1].error, "its proof of the job's secret does not verify"));
  CHECK(outcomes[1].elapsed < kShort);  // told at once, not timed out
  // Rank 0 waits out its deadline for the real rank 1 and names what it refused meanwhile.
  CAPTURE(outcomes[0].error);
  CHECK_FALSE(outcomes[0].ok);
  CHECK(contains(outcomes[0].error, "rank 1 did not arrive within"));
  CHECK(contains(outcomes[0].error, "it refused 1 connection"));
  CHECK(contains(outcomes[0].error, "claiming rank 1"));
  CHECK(log.contains("does not verify"));
}

TEST_CASE("rendezvous: a secret on one side only is refused, naming the missing secret") {
  SUBCASE("rank 1 has a secret, rank 0 none") {
    auto outcomes = run_bodies({member("job-a", nullptr), member("job-a", kSecretA)}, 2, kShort);
    CAPTURE(outcomes[1].error);
    CHECK_FALSE(outcomes[1].ok);
    CHECK(contains(outcomes[1].error, "this rank has a job secret but rank 0"));
    CHECK_FALSE(outcomes[0].ok);
  }
  SUBCASE("rank 0 has a secret, rank 1 none") {
    auto outcomes = run_bodies({member("job-a", kSecretA), member("job-a", nullptr)}, 2, kShort);
    CAPTURE(outcomes[1].error);
    CHECK_FALSE(outcomes[1].ok);
    CHECK(contains(outcomes[1].error, "requires the job's secret but this rank has none"));
    CHECK_FALSE(outcomes[0].ok);
  }
}

TEST_CASE("rendezvous: a rank does not join a rank 0 that cannot prove the job's secret") {
  for (bool with_mac : {false, true}) {
    CAPTURE(with_mac);
    std::string error;
    Socket listener;
    int code = 0;
    listener = listen_tcp("127.0.0.1", 0, 1, error, code);
    REQUIRE(listener.valid());
    int port = local_port(listener.fd());
    // The impostor knows the job id (it is no secret) but not the secret.
    std::thread impostor([&] {
      Deadline deadline(10s);
      Socket accepted;
      while (!accepted.valid() && !deadline.expired()) {
        accepted = accept_one(listener);
        std::this_thread::sleep_for(2ms);
      }
      if (!accepted.valid()) return;
      int fd = accepted.release();
      int flags = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      RawPeer peer(fd);
      wire::Challenge challenge{true, fresh_nonce(), "job-a"};
      peer.send(wire::Header{.kind = wire::Kind::challenge, .aux = 2},
                wire::encode_challenge(challenge));
      peer.read_until(wire::Kind::hello, 10s);
      wire::Welcome welcome;
      if (with_mac) {
        Mac guess{};
        secure_random_bytes(guess);
        welcome.mac = guess;
      }
      peer.send(wire::Header{.kind = wire::Kind::welcome}, wire::encode_welcome(welcome));
      peer.read(2s);  // until the rank hangs up
    });
    auto options = loopback_options(1, 2, port, 5s);
    options.job_id = "job-a";
    options.secret = kSecretA;
    std::string joined_error = "joined the impostor";
    try {
      Bootstrap::connect(options);
    } catch (const proxyep::Error& e) {
      joined_error = e.what();
    }
    impostor.join();
    CAPTURE(joined_error);
    CHECK(contains(joined_error, "did not prove that it knows the job's secret"));
  }
}

TEST_CASE("rendezvous: a flood of silent connections does not keep the real ranks out") {
  LogCapture log;
  std::atomic<bool> flooded{false};
  std::vector<RawPeer> silent;
  auto flood = [&](Bootstrap::Options options) {
    for (int i = 0; i < 80; ++i)
      silent.push_back(RawPeer::connect(options.env.master_port));
    flooded = true;
  };
  auto late_rank1 = member("job-a", kSecretA, [&] { await_flag(flooded); });
  auto outcomes = run_bodies({member("job-a", kSecretA), late_rank1, flood}, 2, 10s, {0, 1, 1});
  for (const auto& outcome : outcomes)
    CHECK_MESSAGE(outcome.ok, outcome.error);
  // 80 - 64 dropped (the cap is 64 for a small world), each a warning up to a limit; a flood
  // does not flood the log.
  CHECK(log.contains("dropped the oldest"));
  CHECK(log.contains("further ones are logged at debug level"));
}

TEST_CASE("rendezvous: a whole world connecting in one burst loses none of its ranks") {
  // 130 ranks as threads, all connecting at once: more connections wait for their handshake
  // than the cap on strangers (64) allowed, and rank 0 used to drop its own job's ranks.
  LogCapture log;
  constexpr int kWorld = 130;
  auto outcomes = run_bodies(std::vector<RankBody>(kWorld, member("job-a", kSecretA)), kWorld, 30s);
  int failed = 0;
  std::string first_error;
  for (const auto& outcome : outcomes)
    if (!outcome.ok && failed++ == 0) first_error = outcome.error;
  CHECK_MESSAGE(failed == 0, failed << " ranks failed, the first: " << first_error);
  CHECK_FALSE(log.contains("dropped the oldest"));
}

TEST_CASE("rendezvous: a rank whose connection closes before it was admitted connects again") {
  // What a rank sees when rank 0 drops its unscreened connection (the cap on strangers filled):
  // the connection closes with no word. Here something listening on the job's port first takes
  // rank 1's connection and closes it, then the real rank 0 serves the port; rank 1 must join
  // it within its timeout instead of failing on the first closed connection.
  std::atomic<bool> dropped{false};
  auto rank0 = [&](Bootstrap::Options options) {
    std::string error;
    int code = 0;
    {
      Socket listener = listen_tcp("127.0.0.1", options.env.master_port, 4, error, code);
      if (!listener.valid()) throw std::runtime_error("the stand-in cannot listen: " + error);
      Deadline deadline(5s);
      while (!deadline.expired()) {
        Socket taken = accept_one(listener);
        if (taken.valid()) break;  // closed at once, unread, as a drop does
        std::this_thread::sleep_for(2ms);
      }
    }
    dropped = true;
    member("job-a", kSecretA)(std::move(options));
  };
  auto outcomes = run_bodies({rank0, member("job-a", kSecretA)}, 2, 10s);
  CHECK(dropped.load());
  for (const auto& outcome : outcomes)
    CHECK_MESSAGE(outcome.ok, outcome.error);
}

TEST_CASE("rendezvous: members of the same job that conflict still fail the world") {
  // Proven members (same id, same secret) claiming one rank: a broken launch, named at once.
  auto body = member("job-a", kSecretA);
  auto outcomes = run_bodies({body, body, body}, 3, 20s, {0, 1, 1});
  for (const auto& outcome : outcomes) {
    CAPTURE(outcome.error);
    CHECK_FALSE(outcome.ok);
    CHECK(contains(outcome.error, "two processes claim rank 1"));
    CHECK(outcome.elapsed < 10s);
  }
}

TEST_CASE("rendezvous: each MAC binds every claim, both nonces and its direction") {
  wire::Nonce ns = fresh_nonce(), nc = fresh_nonce();
  HandshakeClaims base{1, 4, "job-a", &ns, &nc, "pid 7 on host h"};
  const Mac reference = hello_mac(*kSecretA, base);
  CHECK(hello_mac(*kSecretA, base) == reference);  // deterministic
  CHECK(welcome_mac(*kSecretA, base) != reference);
  CHECK(hello_mac(*kSecretB, base) != reference);
  auto changed = [&](auto edit) {
    HandshakeClaims claims = base;
    wire::Nonce other_ns = ns, other_nc = nc;
    claims.server_nonce = &other_ns;
    claims.client_nonce = &other_nc;
    edit(claims, other_ns, other_nc);
    return hello_mac(*kSecretA, claims);
  };
  CHECK(changed([](auto& c, auto&, auto&) { c.rank = 2; }) != reference);
  CHECK(changed([](auto& c, auto&, auto&) { c.world_size = 5; }) != reference);
  CHECK(changed([](auto& c, auto&, auto&) { c.job_id = "job-b"; }) != reference);
  CHECK(changed([](auto& c, auto&, auto&) { c.identity = "pid 8 on host h"; }) != reference);
  CHECK(changed([](auto&, auto& s, auto&) { s[0] ^= 1; }) != reference);
  CHECK(changed([](auto&, auto&, auto& c) { c[31] ^= 1; }) != reference);
  CHECK(changed([](auto&, auto&, auto&) {}) == reference);
  // Two nonces never repeat.
  CHECK(fresh_nonce() != fresh_nonce());
}

TEST_CASE("rendezvous: text from strangers is made safe to log") {
  CHECK(printable("pid 1 on host a") == "pid 1 on host a");
  CHECK(printable("evil\n[rank 0] [info] forged") == "evil\\x0a[rank 0] [info] forged");
  CHECK(printable(std::string(500, 'x'), 10) == "xxxxxxxxxx...");
}
