// What a peer (or anyone on the network) could exploit in the fabric layer: memory keys it could
// guess, and where the tcp provider listens.
#include "common/error.hpp"
#include "fabric/domain.hpp"
#include "fabric/fabric.hpp"
#include "fabric/provider.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace proxyep;
using namespace proxyep::fabric;
using namespace proxyep::fabric::testing;

namespace {

// Keys of `count` regions registered one after another (each on every rail).
std::vector<std::vector<uint64_t>> register_keys(Fabric& fabric, int count,
                                                 std::vector<std::unique_ptr<MemoryRegion>>& keep,
                                                 std::vector<uint8_t>& memory) {
  memory.assign(static_cast<size_t>(count) * 4096, 0);
  std::vector<std::vector<uint64_t>> keys;
  for (int i = 0; i < count; ++i) {
    keep.push_back(fabric.register_memory(memory.data() + static_cast<size_t>(i) * 4096, 4096));
    std::vector<uint64_t> per_rail;
    for (const auto& rail : keep.back()->descriptor().rails)
      per_rail.push_back(rail.key);
    keys.push_back(per_rail);
  }
  return keys;
}

// "LISTEN" lines of /proc/net/tcp{,6} for `port`: their local addresses as the kernel writes
// them ("0100007F" is 127.0.0.1, "00000000" any IPv4 address, 32 zeros any IPv6 address).
std::vector<std::string> listeners_on(uint16_t port) {
  std::vector<std::string> found;
  char wanted[8];
  std::snprintf(wanted, sizeof wanted, "%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      auto colon = local.rfind(':');
      if (state == "0A" && local.substr(colon + 1) == wanted)
        found.push_back(local.substr(0, colon));
    }
  }
  return found;
}

}  // namespace

TEST_CASE("memory keys are random, unique and within the provider's key size where we choose") {
  for (const char* provider : {"tcp", "shm"}) {
    CAPTURE(provider);
    // Two rails on one NIC: fake rails register on a shared domain, so keys must not clash there.
    auto fabric = Fabric::open(options_for(provider, 0, /*rails=*/2));
    const Capabilities& caps = fabric->capabilities();
    std::vector<std::unique_ptr<MemoryRegion>> regions;
    std::vector<uint8_t> memory;
    auto keys = register_keys(*fabric, 64, regions, memory);
    if (caps.mr_prov_key) {
      MESSAGE(provider << " chooses its own keys (FI_MR_PROV_KEY): nothing for us to randomise");
      continue;
    }
    std::set<uint64_t> all;
    size_t count = 0;
    int bits = caps.mr_key_size >= 1 && caps.mr_key_size < 8 ? int(caps.mr_key_size) * 8 : 64;
    uint64_t high_keys = 0;
    for (const auto& per_rail : keys) {
      for (uint64_t key : per_rail) {
        ++count;
        all.insert(key);
        CHECK(key != 0);
        if (bits < 64) CHECK(key < (uint64_t{1} << bits));
        if (bits == 64 && key >> 32 != 0) ++high_keys;
      }
    }
    CHECK(all.size() == count);  // unique across regions and rails of one domain
    // Not sequential, not a fixed stride: consecutive registrations are unrelated.
    std::set<uint64_t> strides;
    size_t ones = 0;
    for (size_t i = 1; i < keys.size(); ++i) {
      uint64_t stride = keys[i][0] - keys[i - 1][0];
      strides.insert(stride);
      ones += stride == 1 ? 1 : 0;
    }
    CHECK(ones == 0);
    CHECK(strides.size() > keys.size() / 2);
    // The whole width is used (with 64-bit keys, all 128 below 2^32 is a 2^-4096 event).
    if (bits == 64) CHECK(high_keys > 0);
  }
}

TEST_CASE("registration with random keys still carries writes on tcp and shm") {
  for (const char* provider : {"tcp", "shm"}) {
    CAPTURE(provider);
    FabricPair pair([&](int rank) { return options_for(provider, rank); }, 64 * 1024);
    exchange(pair, 40, 64 * 1024);
  }
}

TEST_CASE("a domain's key space is never handed out twice, and runs out with an error") {
  auto fabric = Fabric::open(options_for("tcp", 0));
  (void)fabric;
  // DomainContext::requested_key on a one-byte key space: 254 keys (0 and 0xff are never used).
  auto infos = select_domains("tcp", "lo", 1);
  REQUIRE(infos.size() == 1);
  infos[0]->domain_attr->mr_key_size = 1;
  auto domain = DomainContext::open(std::move(infos[0]));
  CHECK(domain->key_bits() == 8);
  std::set<uint64_t> keys;
  for (int i = 0; i < 254; ++i) {
    uint64_t key = domain->requested_key();
    CHECK(key > 0);
    CHECK(key < 0xff);
    keys.insert(key);
  }
  CHECK(keys.size() == 254);
  CHECK_THROWS_WITH_AS(domain->requested_key(), doctest::Contains("no unused memory key"), Error);
}

TEST_CASE("tcp restricted to the loopback interface listens on 127.0.0.1 only") {
  auto fabric = Fabric::open(options_for("tcp", 0));  // fabric.domain = "lo"
  CHECK(fabric->capabilities().domain_name == "lo");
  Bytes address = fabric->rail(0).address();
  // tcp;ofi_rxm names an endpoint by the sockaddr its listener is bound to.
  REQUIRE(address.size() >= sizeof(sockaddr_in));
  sockaddr_in in{};
  std::memcpy(&in, address.data(), sizeof in);
  REQUIRE(in.sin_family == AF_INET);
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
  CHECK(std::string(text) == "127.0.0.1");
  uint16_t port = ntohs(in.sin_port);
  REQUIRE(port != 0);
  // The kernel agrees: the only listener on that port is bound to 127.0.0.1, not to any address.
  auto listeners = listeners_on(port);
  CAPTURE(listeners.size());
  REQUIRE_FALSE(listeners.empty());
  for (const auto& local : listeners)
    CHECK(local == "0100007F");
}

TEST_CASE("a domain filter that names a domain exactly picks only that one") {
  using Names = std::vector<std::string>;
  // "lo" is part of other interface names (wlo1): restricting tcp to loopback must mean lo.
  const Names host = {"eth0", "wlo1", "lo", "eth1"};
  CHECK(filter_domain_names(host, "lo") == Names{"lo"});
  CHECK(filter_domain_names(host, "wlo1") == Names{"wlo1"});
  CHECK(filter_domain_names(host, "eth") == Names{"eth0", "eth1"});       // no exact name: contains
  CHECK(filter_domain_names(host, "") == Names{"eth0", "wlo1", "eth1"});  // never lo unasked
  CHECK(filter_domain_names({"lo", "lo"}, "") == Names{"lo"});            // lo alone is kept, once
  CHECK(filter_domain_names(host, "ib").empty());
  auto infos = select_domains("tcp", "lo", 4);
  REQUIRE(infos.size() == 1);
  CHECK(std::string(infos[0]->domain_attr->name) == "lo");
}
