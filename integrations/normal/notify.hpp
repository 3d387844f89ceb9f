// The notify exchange that starts every normal-mode call k: each rank writes its record
// (notify_record.hpp) to every rank, itself included, and waits for every rank's.
//
// Why it is also the barrier that frees memory: receiving rank d's record of call k proves d
// has finished call k - 1 (every chunk consumed, the rows reduced), so every slot d owns is free
// for call k; two parities of record slots suffice because no rank can enter k + 1 before every
// rank has entered k. Eager bytes of call k go before the record into the receiver's eager slot
// [k % 2]: the record of k - 1 the sender holds proves the receiver finished k - 2, that slot's
// last user, so they need no credit.
#pragma once

#include "integrations/normal/notify_record.hpp"
#include "proxy/session/session.hpp"

#include <functional>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::integrations::normal {

// The local experts' counts this rank announces to rank d (empty: none).
using ExpertsFor = std::function<std::span<const int32_t>(int d)>;

// Sends this rank's record of `call` to every rank and waits for every rank's; returns them by
// source. Eager bytes announced to this rank are expected from here on (also when the call then
// fails on a disagreement: every write stays counted). Throws proxyep::Error(phase) naming the
// ranks whose records did not arrive, or a record that does not decode.
std::vector<NotifyRecord> exchange_records(proxy::Session& session, uint64_t call,
                                           RecordEncoder& encoder, const RecordHeader& header,
                                           std::span<const int64_t> rows_to,
                                           const ExpertsFor& experts_for, std::string_view phase);

}  // namespace proxyep::integrations::normal
