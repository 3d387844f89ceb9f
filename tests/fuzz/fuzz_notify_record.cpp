// Fuzzes decode_record (integrations/normal/notify_record.hpp): every normal-mode call reads the
// record each peer wrote into its slot (shared memory on the node, an RMA write from another
// node). The first two input bytes give the group size (1..1024), the rest is the slot's payload.
// decode_record must throw proxyep::Error or return a record that RecordEncoder writes back as
// the same bytes, within the slot size of that group (record_payload_bytes).
#include "common/error.hpp"
#include "integrations/normal/notify_record.hpp"
#include "tests/fuzz/fuzz_check.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

using namespace proxyep::integrations::normal;
using proxyep::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int ranks = 1 + (data[0] | data[1] << 8) % 1024;
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(data + 2), size - 2);
  NotifyRecord record;
  try {
    record = decode_record(payload, ranks, 1, "fuzz.notify");
  } catch (const proxyep::Error&) {
    return 0;
  }
  check(record.rows_to.size() == static_cast<size_t>(ranks), "a record of another group size");
  const std::vector<int64_t> rows_to(record.rows_to.begin(), record.rows_to.end());
  RecordEncoder encoder;
  encoder.begin(record.header, rows_to);
  std::vector<std::byte> slot(record_payload_bytes(ranks));
  uint64_t written = 0;
  try {
    written = encoder.write(slot, record.experts, "fuzz.notify", record.fabric_rows);
  } catch (const proxyep::Error&) {
    check(false, "a record decode_record accepts does not fit the group's slot");
  }
  check(written <= payload.size() &&
            std::equal(slot.begin(), slot.begin() + static_cast<std::ptrdiff_t>(written),
                       payload.begin()),
        "a decoded record does not encode back to its bytes");
  return 0;
}
