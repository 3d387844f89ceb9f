// What a libfabric provider offers, read once from fi_getinfo. The rest of ProxyEP consults this
// struct instead of provider names: behaviour follows capabilities, never `if (name == "efa")`.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct fi_info;

namespace proxyep::fabric {

struct Capabilities {
  std::string provider;     // prov_name as libfabric reports it, e.g. "tcp;ofi_rxm", "shm", "efa"
  std::string fabric_name;  // fabric_attr->name
  std::string domain_name;  // domain_attr->name: one NIC on multi-NIC hosts
  uint32_t api_version = 0;

  uint64_t caps = 0;               // info->caps
  uint64_t mode = 0;               // info->mode (FI_CONTEXT2, FI_RX_CQ_DATA, ...)
  uint64_t msg_order = 0;          // tx_attr->msg_order
  bool rma_write_ordered = false;  // FI_ORDER_WAW or FI_ORDER_RMA_WAW: false on EFA
  size_t cq_data_size = 0;         // bytes of remote CQ data (4 on EFA, 8 on tcp/shm)
  size_t inject_size = 0;
  size_t max_msg_size = 0;
  size_t rma_iov_limit = 0;
  size_t tx_size = 0;
  size_t rx_size = 0;
  uint64_t mr_mode = 0;
  bool mr_virt_addr = false;     // FI_MR_VIRT_ADDR: remote addresses are VAs, else region offsets
  bool mr_prov_key = false;      // FI_MR_PROV_KEY: keys come from fi_mr_key, else app-chosen
  size_t mr_key_size = 0;        // bytes of a memory key; an app-chosen key must fit them
  bool mr_local = false;         // FI_MR_LOCAL: every operation must pass a local descriptor
  bool hmem = false;             // FI_HMEM: device (CUDA) memory can be registered
  bool manual_progress = false;  // FI_PROGRESS_MANUAL: the target must poll for data to move
  // The provider moves data through memory shared with its peers (libfabric's shm), where a
  // dead peer can hold a lock that progress calls spin on.
  bool shared_memory = false;

  nlohmann::json to_json() const;
};

// Capabilities from one fi_getinfo entry (the hints ProxyEP uses: RDM endpoints, FI_RMA,
// remote CQ data).
Capabilities capabilities_from(const fi_info& info);

// Every provider/domain pair on this host that can serve ProxyEP (RDM + RMA write with remote
// CQ data), optionally restricted to one provider name. Never throws for "nothing found": an
// empty list is an answer.
std::vector<Capabilities> list_providers(const std::string& provider_filter = "");

}  // namespace proxyep::fabric
