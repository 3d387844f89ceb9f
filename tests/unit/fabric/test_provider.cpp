// Provider choice by name, what each provider reports, and options from the parameter registry.
#include "common/params.hpp"
#include "fabric/fabric.hpp"
#include "fabric/provider.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>
#include <rdma/fabric.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>

using namespace proxyep;
using namespace proxyep::fabric;
using namespace proxyep::fabric::testing;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("user provider names map onto libfabric names") {
  CHECK(requests_for("tcp").front().prov_name == "tcp;ofi_rxm");
  CHECK(requests_for("verbs").front().prov_name == "verbs;ofi_rxm");
  auto direct = requests_for("efa-direct");
  REQUIRE(direct.size() == 1);
  CHECK(direct[0].prov_name == "efa");
  CHECK(direct[0].fabric_name == "efa-direct");
  auto efa = requests_for("efa");
  CHECK(efa.front().exclude_fabric == "efa-direct");
  auto automatic = requests_for("auto");
  CHECK(automatic.front().fabric_name == "efa-direct");
  CHECK(automatic.back().prov_name == "shm");
  CHECK(requests_for("shm").front().prov_name == "shm");
  CHECK(requests_for("tcp;ofi_rxm").front().prov_name == "tcp;ofi_rxm");
  CHECK_THROWS_AS(requests_for(""), Error);
}

TEST_CASE("shm and tcp report sensible capabilities") {
  auto shm = list_providers("shm");
  REQUIRE(!shm.empty());
  for (const auto& caps : shm) {
    CHECK(caps.provider == "shm");
    CHECK(caps.cq_data_size == 8);
    CHECK(caps.mr_virt_addr);
    CHECK_FALSE(caps.mr_prov_key);
    CHECK_FALSE(caps.rma_write_ordered);  // shm orders send-after-send only
    CHECK(caps.manual_progress);
    CHECK(caps.shared_memory);  // never driven by waiters
    CHECK((caps.caps & FI_RMA) != 0);
    CHECK(caps.tx_size > 0);
    CHECK(caps.api_version >= FI_VERSION(1, 17));
  }
  auto tcp = list_providers("tcp");
  REQUIRE(!tcp.empty());
  bool loopback = false;
  for (const auto& caps : tcp) {
    CHECK(caps.provider == "tcp;ofi_rxm");
    CHECK(caps.cq_data_size == 8);
    CHECK_FALSE(caps.mr_virt_addr);
    CHECK_FALSE(caps.mr_prov_key);
    CHECK(caps.rma_write_ordered);  // one TCP connection per peer: more ordered than EFA
    CHECK_FALSE(caps.shared_memory);
    loopback = loopback || caps.domain_name == "lo";
  }
  CHECK(loopback);
  auto json = shm.front().to_json();
  CHECK(json["provider"] == "shm");
  CHECK(json["cq_data_size"] == 8);
  CHECK(contains(json["mr_mode"].get<std::string>(), "FI_MR_VIRT_ADDR"));
  CHECK(contains(json["caps"].get<std::string>(), "FI_RMA"));
  CHECK(json.contains("manual_progress"));
  CHECK(json["shared_memory"] == true);
  auto all = list_providers();
  CHECK(all.size() >= shm.size() + tcp.size());
  CHECK(list_providers("no-such-provider").empty());
}

TEST_CASE("an unknown or absent provider is an error that lists what exists") {
  for (std::string name : {"no-such-provider", "efa", "efa-direct", "verbs"}) {
    CAPTURE(name);
    try {
      Fabric::open(options_for(name, 0));
      FAIL("opened " << name);
    } catch (const Error& error) {
      CHECK(error.phase() == "fabric.open");
      CHECK(contains(error.message(), name));
      CHECK(contains(error.message(), "shm [shm]"));
      CHECK(contains(error.message(), "tcp;ofi_rxm"));
    }
  }
}

TEST_CASE("a domain filter that matches nothing names the domains there are") {
  FabricOptions options = options_for("tcp", 0);
  options.domain_filter = "no-such-nic";
  try {
    Fabric::open(options);
    FAIL("opened");
  } catch (const Error& error) {
    CHECK(error.phase() == "fabric.open");
    CHECK(contains(error.message(), "no-such-nic"));
    CHECK(contains(error.message(), "lo"));
  }
}

TEST_CASE("auto picks efa when present, else shm") {
  FabricOptions options = options_for("auto", 0);
  auto fabric = Fabric::open(options);
  bool has_efa = !list_providers("efa").empty();
  CHECK(fabric->capabilities().provider == (has_efa ? "efa" : "shm"));
}

TEST_CASE("tcp without a domain filter leaves the loopback NIC out when another exists") {
  auto infos = select_domains("tcp", "", 4);
  REQUIRE(!infos.empty());
  bool other_nic = false;
  for (const auto& caps : list_providers("tcp"))
    other_nic = other_nic || caps.domain_name != "lo";
  for (const auto& info : infos)
    if (other_nic) CHECK(std::string(info->domain_attr->name) != "lo");
  auto lo = select_domains("tcp", "lo", 4);
  REQUIRE(lo.size() == 1);  // one physical domain: rails beyond it become fake rails
  CHECK(std::string(lo[0]->domain_attr->name) == "lo");
}

TEST_CASE("invalid options are refused") {
  FabricOptions options = options_for("shm", 0);
  options.rails = 0;
  CHECK_THROWS_AS(Fabric::open(options), Error);
  options = options_for("shm", 0);
  options.cq_batch = 0;
  CHECK_THROWS_AS(Fabric::open(options), Error);
  options = options_for("shm", 0);
  options.provider = "";
  CHECK_THROWS_AS(Fabric::open(options), Error);
}

TEST_CASE("FabricOptions::from_params reads every fabric parameter") {
  using config::Source;
  params::fabric_provider.set("tcp");
  params::fabric_domain.set("lo");
  params::fabric_rails.set(3);
  params::fabric_cq_size.set(1024);
  params::fabric_cq_batch.set(8);
  params::fabric_reorder.set(true);
  params::fabric_reorder_seed.set(1234);
  params::fabric_reorder_segment_bytes.set(512);
  params::fabric_reorder_max_held.set(5);
  FabricOptions options = FabricOptions::from_params(3);
  CHECK(options.provider == "tcp");
  CHECK(options.domain_filter == "lo");
  CHECK(options.rails == 3);
  CHECK(options.cq_size == 1024);
  CHECK(options.cq_batch == 8);
  CHECK(options.rank == 3);
  CHECK(options.reorder.enabled);
  CHECK(options.reorder.seed == 1234);
  CHECK(options.reorder.segment_bytes == 512);
  CHECK(options.reorder.max_held == 5);
  // Out-of-range values never reach from_params: the registry refuses them when they are set.
  CHECK_THROWS_AS(params::fabric_rails.set(0), Error);
  CHECK_THROWS_AS(params::fabric_reorder_max_held.set(-1), Error);
  CHECK(FabricOptions::from_params(0).rails == 3);
  config::Registry::global().reset_all();
  FabricOptions defaults = FabricOptions::from_params(0);
  CHECK(defaults.provider == "auto");
  CHECK(defaults.rails == 1);
  CHECK_FALSE(defaults.reorder.enabled);
}

TEST_CASE("rxm's message buffers are sized before libfabric loads its providers") {
  // ctest starts this program without FI_OFI_RXM_BUFFER_SIZE: the first provider query puts
  // fabric.rxm_buffer_bytes there (about 80 MiB less per rank on tcp than libfabric's default).
  const char* before = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
  REQUIRE(!list_providers("tcp").empty());
  const char* after = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
  REQUIRE(after != nullptr);
  if (before == nullptr)
    CHECK(std::string(after) == std::to_string(params::fabric_rxm_buffer_bytes.get()));
  else
    CHECK(std::string(after) == std::string(before));  // the environment's own value wins
}
