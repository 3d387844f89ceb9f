// Fuzzes decode_ll_record (integrations/low_latency/ll_record.hpp): every low-latency call reads
// the record each peer wrote into its slot (shared memory on the node, an RMA write from another
// node). decode_ll_record must throw proxyep::Error or return a record that encode_ll_record
// writes back as the same bytes, within the slot's payload (ll_record_payload_bytes).
#include "common/error.hpp"
#include "integrations/low_latency/ll_record.hpp"
#include "tests/fuzz/fuzz_check.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

using namespace proxyep::integrations::low_latency;
using proxyep::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(data), size);
  LlRecord record;
  try {
    record = decode_ll_record(payload, 1, "fuzz.ll_record");
  } catch (const proxyep::Error&) {
    return 0;
  }
  std::vector<std::byte> slot(ll_record_payload_bytes());
  uint64_t written = 0;
  try {
    written = encode_ll_record(record, slot, "fuzz.ll_record");
  } catch (const proxyep::Error&) {
    check(false, "a record decode_ll_record accepts does not fit a record slot");
  }
  check(written <= payload.size() &&
            std::equal(slot.begin(), slot.begin() + static_cast<std::ptrdiff_t>(written),
                       payload.begin()),
        "a decoded record does not encode back to its bytes");
  return 0;
}
