// One normal-mode dispatch's state from its arguments to its rows' arrival (dispatch.cpp runs
// it, dispatch_landing.cpp places its rows in the receivers' landing regions), and the rule every
// rank applies alike to find where a rank's recv_x is.
#pragma once

#include "integrations/normal/dispatch_args.hpp"
#include "integrations/normal/dispatch_rows.hpp"
#include "integrations/normal/landing_blocks.hpp"
#include "integrations/normal/notify_record.hpp"
#include "integrations/normal/row_counts.hpp"
#include "integrations/normal_types.hpp"
#include "integrations/phase_clock.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace proxyep::integrations::normal {

// One dispatch from its arguments to its rows' arrival. A cached dispatch keeps a copy of the
// handle (tensors are shared, not copied): the caller's may be gone before an async call ends.
struct DispatchCall {
  DispatchCall(const DispatchArgs& caller, const PhaseClock& started)
      : args(caller), clock(started) {
    if (caller.handle != nullptr) args.handle = &handle.emplace(*caller.handle);
  }
  DispatchCall(const DispatchCall&) = delete;
  DispatchCall& operator=(const DispatchCall&) = delete;

  DispatchArgs args;              // the caller's views: read until the rows moved
  RowBackend* backend = nullptr;  // the host backend, or a device call's
  bool on_device = false;         // DeviceCall (normal_mode.hpp)
  std::optional<DispatchHandle> handle;
  DispatchInput in;
  TokenRouting routing;
  std::unique_ptr<DispatchStreams> streams;  // points into the members above
  DispatchResult out;                        // shares its tensors with what the caller got
  uint64_t call = 0;
  int64_t num_recv = 0;
  LandingBlocks::Offer offer;        // of this rank's landing region, in its record
  std::vector<int> landing_sources;  // other nodes' ranks writing into this rank's recv_x
  PhaseClock clock;
};

// The rows of rank d's recv_x in this call (num_worst_tokens pads it).
inline int64_t recv_x_rows(const NotifyRecord& record, const RowCounts& counts, int d) {
  const uint32_t worst = record.header.num_worst_tokens;
  return worst > 0 ? static_cast<int64_t>(worst) : counts.received_by(d);
}

// Where rank d's recv_x is in its landing region (-1: not there), from the runs it offered: every
// rank decides it alike from d's record and the counts, so d and its peers agree without asking.
inline int64_t landing_place(const NotifyRecord& record, const RowCounts& counts, int d) {
  const uint64_t bytes =
      static_cast<uint64_t>(recv_x_rows(record, counts, d)) * record.header.format.hidden_bytes;
  return record.header.landing.place(bytes);
}

}  // namespace proxyep::integrations::normal
