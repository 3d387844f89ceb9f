// Provider selection: turns the user's provider name ("auto", "efa", "efa-direct", "tcp", "shm",
// or any libfabric name) into fi_getinfo entries, one per physical domain (NIC) the rails use.
//
// Hints (the same for every provider, so behaviour follows the returned capabilities):
// - FI_EP_RDM; caps FI_RMA | FI_WRITE | FI_REMOTE_WRITE (+ FI_HMEM in CUDA builds, tried first);
// - mode FI_CONTEXT | FI_CONTEXT2 accepted: every operation carries an fi_context2 slot anyway;
// - mr_mode FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT
//   (+ FI_MR_HMEM): everything the registration code handles, so a provider may demand any;
// - domain_attr->cq_data_size = 4 (EFA's size; FI_REMOTE_CQ_DATA is an operation flag and in
//   caps it makes every provider answer -FI_ENODATA); FI_THREAD_DOMAIN.
// FI_RX_CQ_DATA (each CQ-data write consumes a posted receive) is accepted only in a second
// query, together with FI_MSG for the receives: offering it up front would make efa-direct turn
// off unsolicited write receives, which costs a receive per write.
#pragma once

#include "fabric/resources.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace proxyep::fabric {

// One way of asking libfabric for a user's provider name.
struct ProviderRequest {
  std::string prov_name;       // hints->fabric_attr->prov_name; empty = every provider
  std::string fabric_name;     // accept only this fabric_attr->name; empty = any
  std::string exclude_fabric;  // reject this fabric_attr->name (efa minus efa-direct)
};

// The requests to try, in order, for a user's provider name. "tcp" becomes "tcp;ofi_rxm" (RDM
// over tcp), "efa-direct" the efa provider's efa-direct fabric, "auto" efa (direct first) and
// then shm. Throws proxyep::Error("fabric.open") for an empty name.
std::vector<ProviderRequest> requests_for(std::string_view user_name);

// Every fi_getinfo entry that matches `request` under ProxyEP's hints, each an independent copy,
// deduplicated by (provider, fabric, domain); hint variants in preference order (see above).
std::vector<InfoPtr> query_infos(const ProviderRequest& request);

// The entries the rails of one rank will use: one per physical domain, at most `rails`, in
// fi_getinfo order. With a `domain_filter`, only the domain of exactly that name when there is
// one, else those whose name contains it; the loopback interface ("lo") is skipped unless the
// filter names it or it is the only domain, because rails on it cannot reach another host. For
// tcp a domain is a network interface and the endpoints listen on its address (its first
// subnet, IPv4 before IPv6), so the filter decides where peers, and anyone else who can reach
// that interface, can connect: "lo" keeps a single-host job on 127.0.0.1. Throws
// proxyep::Error("fabric.open") listing what exists when the provider is unknown or unavailable or
// no domain matches.
std::vector<InfoPtr> select_domains(std::string_view user_name, std::string_view domain_filter,
                                    int rails);
// The rule above on domain names alone (distinct, in the given order).
std::vector<std::string> filter_domain_names(const std::vector<std::string>& names,
                                             std::string_view filter);

// "tcp;ofi_rxm [eth0, lo], shm [shm]": what this host offers, for error messages.
std::string describe_available_providers();

}  // namespace proxyep::fabric
