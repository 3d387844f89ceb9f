#include "integrations/config.hpp"

#include "common/error.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace proxyep;

namespace {

struct Chunks {
  int nvl_send, nvl_recv, rdma_send, rdma_recv;
};

Chunks chunks(const Config& c) {
  return {c.num_max_nvl_chunked_send_tokens, c.num_max_nvl_chunked_recv_tokens,
          c.num_max_rdma_chunked_send_tokens, c.num_max_rdma_chunked_recv_tokens};
}

bool operator==(const Chunks& a, const Chunks& b) {
  return a.nvl_send == b.nvl_send && a.nvl_recv == b.nvl_recv && a.rdma_send == b.rdma_send &&
         a.rdma_recv == b.rdma_recv;
}

// Restores the class-wide num_sms however a test case ends.
struct NumSmsGuard {
  int saved = get_num_sms();
  ~NumSmsGuard() { set_num_sms(saved); }
};

constexpr int64_t kHidden7168Bf16 = 7168 * 2;

int64_t nvl_hint(int ranks) {
  return std::max(get_dispatch_config(ranks).get_nvl_buffer_size_hint(kHidden7168Bf16, ranks),
                  get_combine_config(ranks).get_nvl_buffer_size_hint(kHidden7168Bf16, ranks));
}

int64_t rdma_hint(int ranks) {
  return std::max(get_dispatch_config(ranks).get_rdma_buffer_size_hint(kHidden7168Bf16, ranks),
                  get_combine_config(ranks).get_rdma_buffer_size_hint(kHidden7168Bf16, ranks));
}

}  // namespace

TEST_CASE("config: constructor invariants and the rdma rounding") {
  Config c = Config::make(24, 6, 256, 20, 128);
  CHECK(c.num_sms == 24);
  CHECK(c.channels() == 12);
  CHECK(chunks(c) == Chunks{6, 256, 20, 140});  // 128 rounded up to whole chunks of 20
  // DeepEP rounds its own defaults too: 256 with chunks of 6 becomes 258.
  CHECK(Config::make().num_max_rdma_chunked_recv_tokens == 258);
  CHECK(Config::make(0).num_sms == 0);

  CHECK_THROWS_WITH_AS(Config::make(-2), doctest::Contains("num_sms"), Error);
  CHECK_THROWS_AS(Config::make(20, 0, 256), Error);
  CHECK_THROWS_WITH_AS(Config::make(20, 256, 256), doctest::Contains("less than"), Error);
  CHECK_THROWS_AS(Config::make(20, 6, 256, 0, 128), Error);
  CHECK_THROWS_AS(Config::make(20, 6, 256, 6, 0), Error);
  // The receive ring is rounded up to whole send chunks before the checks: 9 -> 10 with 5, and
  // 128 -> 129 with 129, which is no longer larger than the send chunk.
  CHECK(Config::make(20, 6, 256, 5, 9).num_max_rdma_chunked_recv_tokens == 10);
  CHECK_NOTHROW(Config::make(20, 6, 256, 50, 100));
  CHECK_THROWS_WITH_AS(Config::make(20, 6, 256, 129, 128), doctest::Contains("less than"), Error);
}

TEST_CASE("config: default tables") {
  NumSmsGuard guard;
  CHECK(get_num_sms() == 20);
  CHECK(chunks(get_dispatch_config(2)) == Chunks{24, 256, 6, 132});
  CHECK(chunks(get_combine_config(2)) == Chunks{10, 256, 6, 132});
  CHECK(chunks(get_dispatch_config(8)) == Chunks{6, 256, 6, 132});
  CHECK(chunks(get_combine_config(8)) == Chunks{4, 256, 6, 132});
  CHECK(chunks(get_dispatch_config(16)) == Chunks{36, 288, 20, 140});
  CHECK(chunks(get_combine_config(16)) == Chunks{4, 288, 12, 132});
  CHECK(chunks(get_dispatch_config(64)) == Chunks{32, 288, 8, 128});
  CHECK(chunks(get_dispatch_config(96)) == Chunks{20, 480, 12, 132});
  CHECK(chunks(get_dispatch_config(128)) == Chunks{20, 560, 12, 132});
  CHECK(chunks(get_combine_config(160)) == Chunks{2, 720, 8, 128});
  for (int ranks : {2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160}) {
    CHECK(get_dispatch_config(ranks).num_sms == 20);
    CHECK(get_combine_config(ranks).num_sms == 20);
  }
  for (int ranks : {0, 1, 3, 12, 256})
    CHECK_THROWS_WITH_AS(get_dispatch_config(ranks), doctest::Contains("no default config"), Error);
  CHECK_THROWS_AS(get_combine_config(7), Error);

  set_num_sms(24);
  CHECK(get_num_sms() == 24);
  CHECK(get_dispatch_config(8).num_sms == 24);
  CHECK_THROWS_WITH_AS(set_num_sms(23), doctest::Contains("even"), Error);
  CHECK_THROWS_AS(set_num_sms(0), Error);
  CHECK_THROWS_AS(set_num_sms(-2), Error);
  CHECK(get_num_sms() == 24);
}

TEST_CASE("config: size hints reproduce DeepEP's worked values") {
  NumSmsGuard guard;
  // Hidden 7168 bf16, num_sms 20, the larger of the dispatch and combine defaults
  // (DEEPEP_CONTRACT 3.4: EP8 ~336 MB / 0, EP16 ~378 / ~92, EP32 ~378 / ~168, EP64 ~378 / ~336).
  CHECK(nvl_hint(8) == 335709824);
  CHECK(rdma_hint(8) == 0);
  CHECK(nvl_hint(16) == 377673984);
  CHECK(rdma_hint(16) == 91887744);
  CHECK(nvl_hint(32) == 377675264);
  CHECK(rdma_hint(32) == 168023680);
  CHECK(nvl_hint(64) == 377677824);
  CHECK(rdma_hint(64) == 336047360);
  for (int ranks : {2, 4, 8, 16, 32, 64, 160}) {
    CHECK(nvl_hint(ranks) % 128 == 0);
    CHECK(rdma_hint(ranks) % 128 == 0);
  }
  // Fewer ranks need fewer NVL peers: EP2 reserves a quarter of EP8's rings.
  CHECK(nvl_hint(2) == (10 * 2 * (5 * 4 + 256 * (14336 + 8 + 1024 + 512 + 512)) + 127) / 128 * 128);

  Config wide = Config::make(40, 6, 256, 6, 128);
  Config narrow = Config::make(20, 6, 256, 6, 128);
  // The hint scales with the channels (up to the final rounding to 128 bytes).
  const int64_t doubled = 2 * narrow.get_nvl_buffer_size_hint(kHidden7168Bf16, 8);
  CHECK(wide.get_nvl_buffer_size_hint(kHidden7168Bf16, 8) > doubled - 256);
  CHECK(wide.get_nvl_buffer_size_hint(kHidden7168Bf16, 8) <= doubled);

  CHECK_THROWS_WITH_AS(narrow.get_nvl_buffer_size_hint(kHidden7168Bf16, 12),
                       doctest::Contains("multiple of 8"), Error);
  CHECK_THROWS_AS(narrow.get_rdma_buffer_size_hint(kHidden7168Bf16, 0), Error);
  CHECK_THROWS_AS(narrow.get_rdma_buffer_size_hint(0, 16), Error);
  CHECK_THROWS_WITH_AS(Config::make(21).get_rdma_buffer_size_hint(kHidden7168Bf16, 16),
                       doctest::Contains("even"), Error);
}
