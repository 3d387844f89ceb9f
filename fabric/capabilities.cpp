#include "fabric/capabilities.hpp"

#include "fabric/provider.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>
#include <set>
#include <tuple>

namespace proxyep::fabric {
namespace {

std::string text(const char* s) {
  return s != nullptr ? std::string(s) : std::string();
}

bool write_ordered(uint64_t msg_order) {
  uint64_t bits = 0;
#ifdef FI_ORDER_WAW
  bits |= FI_ORDER_WAW;
#endif
#ifdef FI_ORDER_RMA_WAW
  bits |= FI_ORDER_RMA_WAW;
#endif
  return (msg_order & bits) != 0;
}

// libfabric's own rendering of a flag set ("FI_MSG | FI_RMA"); fi_tostr_r is thread safe.
std::string flags_text(uint64_t value, fi_type type) {
  std::array<char, 1024> buffer{};
  const char* rendered = fi_tostr_r(buffer.data(), buffer.size(), &value, type);
  return text(rendered);
}

std::string mr_mode_text(uint64_t mr_mode) {
  int as_int = static_cast<int>(mr_mode);
  std::array<char, 512> buffer{};
  return text(fi_tostr_r(buffer.data(), buffer.size(), &as_int, FI_TYPE_MR_MODE));
}

}  // namespace

Capabilities capabilities_from(const fi_info& info) {
  Capabilities caps;
  caps.provider = text(info.fabric_attr->prov_name);
  caps.fabric_name = text(info.fabric_attr->name);
  caps.domain_name = text(info.domain_attr->name);
  caps.api_version = info.fabric_attr->api_version;
  caps.caps = info.caps;
  caps.mode = info.mode;
  caps.msg_order = info.tx_attr->msg_order;
  caps.rma_write_ordered = write_ordered(caps.msg_order);
  caps.cq_data_size = info.domain_attr->cq_data_size;
  caps.inject_size = info.tx_attr->inject_size;
  caps.max_msg_size = info.ep_attr->max_msg_size;
  caps.rma_iov_limit = info.tx_attr->rma_iov_limit;
  caps.tx_size = info.tx_attr->size;
  caps.rx_size = info.rx_attr->size;
  caps.mr_mode = static_cast<uint64_t>(info.domain_attr->mr_mode);
  caps.mr_virt_addr = (caps.mr_mode & FI_MR_VIRT_ADDR) != 0;
  caps.mr_prov_key = (caps.mr_mode & FI_MR_PROV_KEY) != 0;
  caps.mr_key_size = info.domain_attr->mr_key_size;
  caps.mr_local = (caps.mr_mode & FI_MR_LOCAL) != 0;
  caps.hmem = (info.caps & FI_HMEM) != 0;
  caps.manual_progress = info.domain_attr->data_progress == FI_PROGRESS_MANUAL;
  // libfabric has no capability for "works through memory shared with the peers": FI_LOCAL_COMM
  // and FI_REMOTE_COMM are secondary, unreported unless asked for, and shm refuses to be asked
  // for either (fi_getinfo -61); probing each entry again with fi_getinfo also left the process
  // in a state that crashed LeakSanitizer's exit check in one run of five. So: by name.
  caps.shared_memory = caps.provider == "shm";
  return caps;
}

nlohmann::json Capabilities::to_json() const {
  return nlohmann::json{
      {"provider", provider},
      {"fabric", fabric_name},
      {"domain", domain_name},
      {"api_version", fmt::format("{}.{}", FI_MAJOR(api_version), FI_MINOR(api_version))},
      {"caps", flags_text(caps, FI_TYPE_CAPS)},
      {"mode", flags_text(mode, FI_TYPE_MODE)},
      {"msg_order", flags_text(msg_order, FI_TYPE_MSG_ORDER)},
      {"rma_write_ordered", rma_write_ordered},
      {"cq_data_size", cq_data_size},
      {"inject_size", inject_size},
      {"max_msg_size", max_msg_size},
      {"rma_iov_limit", rma_iov_limit},
      {"tx_size", tx_size},
      {"rx_size", rx_size},
      {"mr_mode", mr_mode_text(mr_mode)},
      {"mr_virt_addr", mr_virt_addr},
      {"mr_prov_key", mr_prov_key},
      {"mr_key_size", mr_key_size},
      {"mr_local", mr_local},
      {"hmem", hmem},
      {"manual_progress", manual_progress},
      {"shared_memory", shared_memory},
  };
}

std::vector<Capabilities> list_providers(const std::string& provider_filter) {
  std::vector<ProviderRequest> requests;
  if (provider_filter.empty())
    requests.push_back({});
  else
    requests = requests_for(provider_filter);
  std::vector<Capabilities> out;
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  for (const ProviderRequest& request : requests) {
    for (const InfoPtr& info : query_infos(request)) {
      Capabilities caps = capabilities_from(*info);
      if (seen.insert({caps.provider, caps.fabric_name, caps.domain_name}).second)
        out.push_back(std::move(caps));
    }
  }
  return out;
}

}  // namespace proxyep::fabric
