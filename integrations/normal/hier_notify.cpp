// The notify exchange of a hierarchical internode call (hier_notify.hpp).
#include "integrations/normal/hier_notify.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/ep_shape.hpp"
#include "integrations/await_every.hpp"

namespace proxyep::integrations::normal {

namespace {

// The `ranks` x `local` counts starting at rank `first`'s experts (empty when none are sent).
std::span<const int32_t> experts_of(std::span<const int32_t> all, int first, int ranks, int local) {
  if (all.empty()) return {};
  return all.subspan(static_cast<size_t>(first) * static_cast<size_t>(local),
                     static_cast<size_t>(ranks) * static_cast<size_t>(local));
}

// Step A: to this node's ranks and to the counterparts.
void send_direct(proxy::Session& session, uint64_t call, RecordEncoder& encoder,
                 const HierNotify& mine, std::string_view phase) {
  const proxy::ArenaLayout& layout = session.layout();
  const int rpn = session.ranks_per_node();
  encoder.begin(mine.header, mine.rows_to);
  for (int d = 0; d < session.ranks(); ++d) {
    const bool counterpart = layout.fabric_peer(d);
    if (!counterpart && !layout.on_node(d)) continue;
    const int node = d / rpn;
    proxy::PeerChannel& to = session.channel(d);
    const uint64_t bytes =
        counterpart
            ? encoder.write(to.record_buffer(call),
                            experts_of(mine.experts, node * rpn, rpn, mine.local_experts), phase,
                            static_cast<int32_t>(mine.fabric_rows[static_cast<size_t>(node)]))
            : encoder.write(to.record_buffer(call),
                            experts_of(mine.experts, d, 1, mine.local_experts), phase);
    to.send_record(call, bytes, phase);
  }
}

// Step B: counterpart c's record to each node peer q, through the lane that carries c's key.
void relay_record(proxy::Session& session, uint64_t call, RecordEncoder& relay,
                  const NotifyRecord& record, int counterpart, int local_experts,
                  std::string_view phase) {
  const proxy::ArenaLayout& layout = session.layout();
  const int rpn = session.ranks_per_node(), node = counterpart / rpn;
  const std::vector<int64_t> rows_to(record.rows_to.begin(), record.rows_to.end());
  relay.begin(record.header, rows_to);
  for (int q = layout.node() * rpn; q < (layout.node() + 1) * rpn; ++q) {
    if (q == session.rank()) continue;
    // At this rank, the channel to q's counterpart on c's node is the lane to q keyed c.
    proxy::PeerChannel& lane = session.channel(node * rpn + q % rpn);
    const uint64_t bytes = relay.write(
        lane.record_buffer(call), experts_of(record.experts, q % rpn, 1, local_experts), phase);
    lane.send_record(call, bytes, phase);
  }
}

}  // namespace

std::vector<NotifyRecord> exchange_records_hierarchical(proxy::Session& session, uint64_t call,
                                                        RecordEncoder& encoder,
                                                        RecordEncoder& relay,
                                                        const HierNotify& mine,
                                                        std::string_view phase) {
  const proxy::ArenaLayout& layout = session.layout();
  const int R = session.ranks(), me = session.rank(), rpn = session.ranks_per_node();
  require(mine.experts.empty() ||
              static_cast<int64_t>(rpn) * mine.local_experts <= gpu_side::ep::kMaxLocalExperts,
          phase,
          "ep.internode=hierarchical announces a node's expert counts in one record: {} ranks "
          "per node x {} experts each exceed the limit of {} (use ep.internode=per_rank)",
          rpn, mine.local_experts, gpu_side::ep::kMaxLocalExperts);
  send_direct(session, call, encoder, mine, phase);
  auto direct = [&](int r) { return layout.on_node(r) || layout.fabric_peer(r); };
  for (int s = 0; s < R; ++s)
    if (direct(s)) session.channel(s).expect_record(call, phase);
  await_every(
      session, [&](int s) { return !direct(s) || session.channel(s).record_arrived(call); }, phase,
      "the notify record (call start)");

  std::vector<NotifyRecord> records(static_cast<size_t>(R));
  for (int s = 0; s < R; ++s) {
    if (!layout.fabric_peer(s)) continue;
    records[s] = decode_record(session.channel(s).record(call), R, s, phase);
    relay_record(session, call, relay, records[s], s, mine.local_experts, phase);
    // This rank's slice of the node's counts.
    const auto slice = experts_of(records[s].experts, me % rpn, 1, mine.local_experts);
    records[s].experts.assign(slice.begin(), slice.end());
  }
  await_every(
      session, [&](int s) { return session.channel(s).record_arrived(call); }, phase,
      "the notify record relayed by this node's forwarders (call start)");
  for (int s = 0; s < R; ++s)
    if (!layout.fabric_peer(s))
      records[s] = decode_record(session.channel(s).record(call), R, s, phase);
  return records;
}

}  // namespace proxyep::integrations::normal
