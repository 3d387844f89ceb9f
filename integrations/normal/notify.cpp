// The notify exchange (notify.hpp).
#include "integrations/normal/notify.hpp"

#include "common/error.hpp"
#include "integrations/await_every.hpp"
#include "integrations/normal/chunk_plan.hpp"

namespace proxyep::integrations::normal {

namespace {

void send_records(proxy::Session& session, uint64_t call, RecordEncoder& encoder,
                  const RecordHeader& header, std::span<const int64_t> rows_to,
                  const ExpertsFor& experts_for, std::string_view phase) {
  encoder.begin(header, rows_to);
  for (int d = 0; d < session.ranks(); ++d) {
    proxy::PeerChannel& to = session.channel(d);
    const uint64_t bytes = encoder.write(
        to.record_buffer(call), experts_for ? experts_for(d) : std::span<const int32_t>{}, phase);
    to.send_record(call, bytes, phase);
  }
}

}  // namespace

std::vector<NotifyRecord> exchange_records(proxy::Session& session, uint64_t call,
                                           RecordEncoder& encoder, const RecordHeader& header,
                                           std::span<const int64_t> rows_to,
                                           const ExpertsFor& experts_for, std::string_view phase) {
  const int R = session.ranks(), me = session.rank();
  send_records(session, call, encoder, header, rows_to, experts_for, phase);
  for (int s = 0; s < R; ++s)
    session.channel(s).expect_record(call, phase);
  await_every(
      session, [&](int s) { return session.channel(s).record_arrived(call); }, phase,
      "the notify record (call start)");

  std::vector<NotifyRecord> records;
  records.reserve(static_cast<size_t>(R));
  const uint64_t eager_bytes = session.layout().sizes().eager_limit;
  for (int s = 0; s < R; ++s) {
    records.push_back(decode_record(session.channel(s).record(call), R, s, phase));
    const NotifyRecord& r = records.back();
    if (s != me &&
        fits_eager(static_cast<uint64_t>(std::max(0, r.rows_to[me])), r.header.format, eager_bytes))
      session.channel(s).expect_eager(call, phase);
  }
  return records;
}

}  // namespace proxyep::integrations::normal
