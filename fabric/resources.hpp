// RAII owners of libfabric objects. Every fid ProxyEP opens lives in one of these unique_ptr
// aliases, so an exception thrown halfway through setup (a bad provider, a failed AV insert)
// closes exactly what was opened, in reverse order, and nothing leaks into the provider.
//
// The deleters call fi_close (fi_freeinfo for fi_info) and log a failure instead of throwing:
// destructors must not throw (docs/ERRORS.md rule 6), and a failed close at teardown is worth a
// warning, not a crash.
//
// Close order matters to libfabric (an endpoint before the CQ and AV bound to it, MRs before
// their domain, a domain before its fabric). Owners state it by member declaration order.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace proxyep::fabric {

// The libfabric API version ProxyEP asks for: the one of the headers it was built against (1.17
// on Debian, newer where AWS installs its own), so newer providers such as efa-direct show up.
inline constexpr uint32_t kApiVersion = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);

namespace detail {

// Closes one fid and logs (never throws) on failure; `kind` names it in the log line.
void close_fid(fid* object, std::string_view kind) noexcept;

template <typename T>
struct FidName;
template <>
struct FidName<fid_fabric> {
  static constexpr std::string_view value = "fabric";
};
template <>
struct FidName<fid_domain> {
  static constexpr std::string_view value = "domain";
};
template <>
struct FidName<fid_ep> {
  static constexpr std::string_view value = "endpoint";
};
template <>
struct FidName<fid_av> {
  static constexpr std::string_view value = "address vector";
};
template <>
struct FidName<fid_cq> {
  static constexpr std::string_view value = "completion queue";
};
template <>
struct FidName<fid_mr> {
  static constexpr std::string_view value = "memory region";
};

template <typename T>
struct FidCloser {
  void operator()(T* object) const noexcept {
    if (object != nullptr) close_fid(&object->fid, FidName<T>::value);
  }
};

struct InfoFreer {
  void operator()(fi_info* info) const noexcept {
    if (info != nullptr) fi_freeinfo(info);
  }
};

}  // namespace detail

using InfoPtr = std::unique_ptr<fi_info, detail::InfoFreer>;
using FabricPtr = std::unique_ptr<fid_fabric, detail::FidCloser<fid_fabric>>;
using DomainPtr = std::unique_ptr<fid_domain, detail::FidCloser<fid_domain>>;
using EndpointPtr = std::unique_ptr<fid_ep, detail::FidCloser<fid_ep>>;
using AvPtr = std::unique_ptr<fid_av, detail::FidCloser<fid_av>>;
using CqPtr = std::unique_ptr<fid_cq, detail::FidCloser<fid_cq>>;
using MrPtr = std::unique_ptr<fid_mr, detail::FidCloser<fid_mr>>;

// fi_dupinfo into an owner (throws proxyep::Error on allocation failure).
InfoPtr duplicate_info(const fi_info& info);

// Throws proxyep::Error(phase, "<what>: <fi_strerror> (rc)") when a setup call returned rc < 0.
void check_fi(int rc, std::string_view phase, std::string_view what);

// "<fi_strerror(-rc)> (-<errno>)" for messages.
std::string fi_error_text(int64_t rc);

}  // namespace proxyep::fabric
