// The ids a rank's memory has in the region table (region_table.hpp): what a transfer
// descriptor's local_region and remote_region name (gpu_side/descriptor.hpp). One list, so that
// the session that posts (session/fabric_poster.hpp, session/step_link.hpp) and the rank proxy
// that registers (rank_proxy.hpp) can never disagree on a number.
#pragma once

#include <cstdint>

namespace proxyep::proxy::region {

inline constexpr uint32_t kArena = 0;    // every rank's arena: remote target
inline constexpr uint32_t kStaging = 1;  // this rank's staging: local source
inline constexpr uint32_t kLanding = 2;  // every rank's landing region (recv_x): remote target
// This process's address space, unregistered (RegionTable::add_local_address_space): a local
// source only, and only where the provider reads memory nobody registered.
inline constexpr uint32_t kCallerMemory = 3;
inline constexpr uint32_t kDeviceStaging = 4;  // this rank's device staging (FI_HMEM): local source
// The device arenas of the ranks that registered theirs (FI_HMEM): the remote target of a
// device call's eager bytes and chunks.
inline constexpr uint32_t kDeviceArena = 5;
// Captured steps' memory, every rank's (session/step_link.hpp): source and target.
inline constexpr uint32_t kSteps = 6;

}  // namespace proxyep::proxy::region
