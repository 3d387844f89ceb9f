#include "fabric/provider.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "fabric/capabilities.hpp"
#include "fabric/provider_defaults.hpp"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

namespace proxyep::fabric {
namespace {

constexpr uint64_t kBaseCaps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
// Every operation carries an fi_context2 slot, which also satisfies FI_CONTEXT (deprecated in
// libfabric 2, hence the guard).
#ifdef FI_CONTEXT
constexpr uint64_t kAcceptedMode = FI_CONTEXT | FI_CONTEXT2;
#else
constexpr uint64_t kAcceptedMode = FI_CONTEXT2;
#endif
constexpr int kBaseMrMode =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
constexpr size_t kRequestedCqDataSize = 4;  // EFA's: the immediate budget is 32 bits everywhere
constexpr std::string_view kLoopbackDomain = "lo";

struct HintVariant {
  bool hmem = false;        // FI_HMEM + FI_MR_HMEM: device memory registration
  bool rx_cq_data = false;  // accept FI_RX_CQ_DATA (+ FI_MSG to post the receives it needs)
};

std::vector<HintVariant> hint_variants() {
  std::vector<HintVariant> variants;
#ifdef PROXYEP_HAVE_CUDA
  variants.push_back({true, false});
  variants.push_back({true, true});
#endif
  variants.push_back({false, false});
  variants.push_back({false, true});
  return variants;
}

InfoPtr make_hints(const ProviderRequest& request, HintVariant variant) {
  InfoPtr hints(fi_allocinfo());
  require(hints != nullptr, "fabric.open", "fi_allocinfo failed (out of memory)");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = kBaseCaps;
  hints->mode = kAcceptedMode;
  hints->domain_attr->mr_mode = kBaseMrMode;
  if (variant.hmem) {
    hints->caps |= FI_HMEM;
    hints->domain_attr->mr_mode |= FI_MR_HMEM;
  }
  if (variant.rx_cq_data) {
    hints->caps |= FI_MSG | FI_RECV;
    hints->mode |= FI_RX_CQ_DATA;
  }
  hints->domain_attr->cq_data_size = kRequestedCqDataSize;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  // fi_freeinfo releases prov_name with free(), so it must come from strdup.
  if (!request.prov_name.empty()) hints->fabric_attr->prov_name = strdup(request.prov_name.c_str());
  return hints;
}

bool fabric_accepted(const ProviderRequest& request, const fi_info& info) {
  std::string_view name = info.fabric_attr->name != nullptr ? info.fabric_attr->name : "";
  if (!request.fabric_name.empty() && name != request.fabric_name) return false;
  if (!request.exclude_fabric.empty() && name == request.exclude_fabric) return false;
  return true;
}

std::tuple<std::string, std::string, std::string> identity(const fi_info& info) {
  auto text = [](const char* s) { return std::string(s != nullptr ? s : ""); };
  return {text(info.fabric_attr->prov_name), text(info.fabric_attr->name),
          text(info.domain_attr->name)};
}

std::string domain_name(const fi_info& info) {
  return info.domain_attr->name != nullptr ? info.domain_attr->name : "";
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items)
    out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

std::vector<ProviderRequest> requests_for(std::string_view user_name) {
  require(!user_name.empty(), "fabric.open", "empty provider name (use 'auto', 'efa', 'tcp', ...)");
  if (user_name == "auto")
    return {{"efa", "efa-direct", ""}, {"efa", "", "efa-direct"}, {"shm", "", ""}};
  if (user_name == "efa") return {{"efa", "", "efa-direct"}, {"efa", "efa-direct", ""}};
  if (user_name == "efa-direct") return {{"efa", "efa-direct", ""}};
  // Core providers without native RDM endpoints in 1.17 need their utility layer.
  if (user_name == "tcp") return {{"tcp;ofi_rxm", "", ""}, {"tcp", "", ""}};
  if (user_name == "verbs") return {{"verbs;ofi_rxm", "", ""}, {"verbs", "", ""}};
  if (user_name == "udp") return {{"udp;ofi_rxd", "", ""}};
  return {{std::string(user_name), "", ""}};
}

std::vector<InfoPtr> query_infos(const ProviderRequest& request) {
  apply_provider_defaults();  // before the first fi_getinfo loads the providers
  std::vector<InfoPtr> found;
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  for (HintVariant variant : hint_variants()) {
    InfoPtr hints = make_hints(request, variant);
    fi_info* raw = nullptr;
    int rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &raw);
    InfoPtr list(raw);
    if (rc == -FI_ENODATA) continue;  // this variant offers nothing: not an error
    if (rc != 0) {
      log::debug("fabric: fi_getinfo({}) failed: {}", request.prov_name, fi_error_text(rc));
      continue;
    }
    for (fi_info* info = list.get(); info != nullptr; info = info->next) {
      if (!fabric_accepted(request, *info)) continue;
      if (!seen.insert(identity(*info)).second) continue;
      found.push_back(duplicate_info(*info));
    }
  }
  return found;
}

std::string describe_available_providers() {
  std::map<std::string, std::vector<std::string>> domains;  // "prov (fabric)" -> domains
  std::vector<std::string> order;
  for (const Capabilities& caps : list_providers()) {
    std::string label = caps.provider;
    if (caps.provider == "efa") label += " (fabric " + caps.fabric_name + ")";
    if (!domains.contains(label)) order.push_back(label);
    auto& list = domains[label];
    if (std::find(list.begin(), list.end(), caps.domain_name) == list.end())
      list.push_back(caps.domain_name);
  }
  std::vector<std::string> items;
  for (const auto& label : order)
    items.push_back(label + " [" + join(domains[label]) + "]");
  return items.empty() ? std::string("none") : join(items);
}

std::vector<std::string> filter_domain_names(const std::vector<std::string>& names,
                                             std::string_view filter) {
  bool exact = !filter.empty() && std::find(names.begin(), names.end(), filter) != names.end();
  std::vector<std::string> picked;
  for (const auto& name : names) {
    if (exact ? name != filter : name.find(filter) == std::string::npos) continue;
    if (std::find(picked.begin(), picked.end(), name) == picked.end()) picked.push_back(name);
  }
  // Loopback rails cannot reach another host: keep them only when asked for or alone.
  bool has_other = std::any_of(picked.begin(), picked.end(),
                               [](const std::string& name) { return name != kLoopbackDomain; });
  if (filter.empty() && has_other) std::erase(picked, std::string(kLoopbackDomain));
  return picked;
}

namespace {

// One entry per picked domain name, in fi_getinfo order (the first fabric listed for a domain
// wins, which on tcp is its IPv4 subnet).
std::vector<InfoPtr> distinct_domains(std::vector<InfoPtr> infos, std::string_view filter) {
  std::vector<std::string> names;
  for (const auto& info : infos)
    names.push_back(domain_name(*info));
  std::vector<std::string> wanted = filter_domain_names(names, filter);
  std::vector<InfoPtr> picked;
  std::set<std::string> taken;
  for (auto& info : infos) {
    std::string name = domain_name(*info);
    if (std::find(wanted.begin(), wanted.end(), name) == wanted.end()) continue;
    if (taken.insert(name).second) picked.push_back(std::move(info));
  }
  return picked;
}

}  // namespace

std::vector<InfoPtr> select_domains(std::string_view user_name, std::string_view domain_filter,
                                    int rails) {
  require(rails >= 1, "fabric.open", "rails must be at least 1 (got {})", rails);
  std::vector<std::string> unmatched;  // providers found whose domains the filter rejected
  for (const ProviderRequest& request : requests_for(user_name)) {
    std::vector<InfoPtr> infos = query_infos(request);
    if (infos.empty()) continue;
    std::vector<std::string> all_domains;
    for (const auto& info : infos)
      all_domains.push_back(domain_name(*info));
    std::vector<InfoPtr> picked = distinct_domains(std::move(infos), domain_filter);
    if (picked.empty()) {
      unmatched.push_back(request.prov_name + " [" + join(all_domains) + "]");
      continue;
    }
    if (static_cast<int>(picked.size()) > rails) picked.resize(static_cast<size_t>(rails));
    return picked;
  }
  if (!unmatched.empty())
    fail("fabric.open", "provider '{}' has no domain matching '{}'; its domains: {}", user_name,
         domain_filter, join(unmatched));
  fail("fabric.open",
       "provider '{}' is not available on this host (RDM endpoints with RMA write and remote CQ "
       "data); available: {}",
       user_name, describe_available_providers());
}

}  // namespace proxyep::fabric
