// The notify exchange of a hierarchical internode call (proxy/session/arena_layout.hpp:
// counterparts over the fabric, relay lanes inside a node). A rank writes only its node's ranks and
// its counterparts, yet every rank still ends with every rank's record, so the checks, the counts
// and the barrier above (notify.hpp) are per_rank's:
//   A. this rank's record to every rank of its node (itself included) and to each counterpart;
//      a counterpart's carries the expert counts of its whole node and the rows this rank sends
//      there over the fabric (NotifyRecord::fabric_rows);
//   B. once the counterparts' records arrived, this rank relays each one to its node peers
//      through the relay lanes (under the counterpart's key, so the peer reads it as that
//      rank's record), with the peer's slice of the expert counts.
// A record reaches a rank of another node after two hops instead of one: the price of talking
// over the fabric to nodes - 1 peers instead of every rank there.
#pragma once

#include "integrations/normal/notify_record.hpp"
#include "proxy/session/session.hpp"

#include <span>
#include <string_view>
#include <vector>

namespace proxyep::integrations::normal {

struct HierNotify {
  const RecordHeader& header;
  std::span<const int64_t> rows_to;  // [R]: this rank's rows to every rank
  // [E]: this rank's (token, expert) counts of every expert (dispatch), or empty; a rank's
  // experts are `local_experts` consecutive ones.
  std::span<const int32_t> experts;
  int local_experts = 0;
  std::span<const int64_t> fabric_rows;  // [nodes]: rows this rank sends each node's counterpart
};

// Returns every rank's record of `call` by source; a counterpart's `experts` are this rank's
// slice. Throws proxyep::Error(phase) naming the ranks whose records did not arrive, a record
// that does not decode, or expert counts of a node that do not fit a record.
std::vector<NotifyRecord> exchange_records_hierarchical(proxy::Session& session, uint64_t call,
                                                        RecordEncoder& encoder,
                                                        RecordEncoder& relay,
                                                        const HierNotify& mine,
                                                        std::string_view phase);

}  // namespace proxyep::integrations::normal
