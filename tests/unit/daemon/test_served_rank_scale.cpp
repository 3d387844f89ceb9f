// The node daemon's per-rank state at the largest job an immediate names (4096 ranks): two
// ranks of such a job served in this process over tcp on loopback (ranks 0 and 4095; every
// other rank's fabric address and arena are rank 4095's, which is all the daemon's tables need),
// through connect, arenas, the connection probe, start and stop, within stated bounds of time
// and memory. And a job one rank larger is refused before anything is opened.
#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "control/imm_layout.hpp"
#include "daemon/served_rank.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

using namespace proxyep;
using namespace proxyep::daemon;
using namespace std::chrono_literals;

namespace {

#ifndef PROXYEP_TEST_TIMEOUT_SCALE
#define PROXYEP_TEST_TIMEOUT_SCALE 1
#endif
constexpr int kWorld = static_cast<int>(control::imm::kMaxStreams);
constexpr auto kBound = std::chrono::milliseconds(10'000 * PROXYEP_TEST_TIMEOUT_SCALE);

// What a client hands the daemon at attach (proxy/session/proxy_host_daemon.cpp), small.
struct ClientMemory {
  HostMemory arena = HostMemory::memfd(1 << 20, "test-arena");
  HostMemory staging = HostMemory::memfd(1 << 20, "test-staging");
  HostMemory ring = HostMemory::memfd(gpu_side::Ring::bytes_for(64), "test-ring");
  HostMemory relay = HostMemory::memfd(gpu_side::Ring::bytes_for(64), "test-relay");
  gpu_side::Doorbell doorbell;
  ClientMemory() {
    gpu_side::Ring::create(ring.bytes(), 64, gpu_side::ProducerMode::single);
    gpu_side::Ring::create(relay.bytes(), 64, gpu_side::ProducerMode::single);
  }
  // The daemon closes what it is given: duplicates, as a socket's SCM_RIGHTS would be.
  std::vector<int> fds() const {
    std::vector<int> fds;
    for (int fd : {arena.fd(), staging.fd(), ring.fd(), doorbell.fd(), relay.fd()})
      fds.push_back(::dup(fd));
    return fds;
  }
};

std::unique_ptr<ServedRank> serve(const ClientMemory& memory, int rank, int ranks) {
  AttachRequest request;
  request.rank = rank;
  request.ranks = ranks;
  return std::make_unique<ServedRank>(request, memory.fds());
}

// Resident set of this process, from /proc/self/statm (pages).
uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("the daemon serves ranks of a 4096-rank job; a larger job is refused at attach") {
  ::setenv("PROXYEP_FABRIC_PROVIDER", "tcp", 1);
  ::setenv("PROXYEP_FABRIC_DOMAIN", "lo", 1);
  ClientMemory first_memory, last_memory;
  const uint64_t resident_before = resident_bytes();
  const auto begin = std::chrono::steady_clock::now();
  {
    auto first = serve(first_memory, 0, kWorld);
    auto last = serve(last_memory, kWorld - 1, kWorld);
    std::vector<fabric::Bytes> group(kWorld, last->addresses());
    group[0] = first->addresses();
    first->connect(group);
    last->connect(group);
    std::vector<fabric::Bytes> arenas(kWorld, last->arena_descriptor());
    arenas[0] = first->arena_descriptor();
    first->add_arenas(arenas, {}, {});
    last->add_arenas(arenas, {}, {});
    first->open_connections({kWorld - 1});
    last->open_connections({});
    const auto deadline = std::chrono::steady_clock::now() + kBound;
    while (!first->connections_open()) {
      last->progress();
      if (std::chrono::steady_clock::now() > deadline)
        FAIL("the probe from rank 0 to rank 4095 did not complete");
    }
    CHECK(last->connections_open());
    // A probe to a rank outside the job is refused before anything is sent.
    CHECK_THROWS_WITH_AS(first->open_connections({kWorld}), doctest::Contains("rank 4096"), Error);
    first->start();
    last->start();
    CHECK(first->failure() == std::nullopt);
    CHECK(first->new_peer_failures().empty());
    const uint64_t grown = resident_bytes() - std::min(resident_bytes(), resident_before);
    MESSAGE("two served ranks of a ", kWorld, "-rank job: ", grown >> 20, " MiB resident, ",
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  begin)
                .count(),
            " ms");
    // Tables of a few words per peer, and the provider's endpoints: far below this.
    CHECK(grown < (256ull << 20));
  }
  CHECK(std::chrono::steady_clock::now() - begin < 2 * kBound);
  CHECK_THROWS_WITH_AS(serve(first_memory, 0, kWorld + 1), doctest::Contains("4096"), Error);
  ::unsetenv("PROXYEP_FABRIC_PROVIDER");
  ::unsetenv("PROXYEP_FABRIC_DOMAIN");
}
