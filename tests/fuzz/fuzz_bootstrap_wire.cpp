// Fuzzes the TCP bootstrap's decoders (control/bootstrap_wire.hpp): they read whatever any
// process that connects to MASTER_PORT sends (the handshake's hello before anything proves who
// sent it). The first input byte picks the decoder, the rest is its input. Each must throw
// BadFrame or decode something that encodes back to those bytes.
#include "control/bootstrap_wire.hpp"
#include "tests/fuzz/fuzz_check.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

using namespace proxyep::control::wire;
using proxyep::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> input(data + 1, size - 1);
  const Bytes bytes(input.begin(), input.end());
  try {
    switch (data[0] % 6) {
      case 0: {
        const Header header = decode_header(input);
        check(header.length <= kMaxPayloadBytes, "decode_header accepted an oversized length");
        // encode_frame writes length from its (empty) payload: every other field must match.
        const Bytes again = encode_frame(header, {});
        check(again.size() == kHeaderBytes && bytes.size() >= kHeaderBytes &&
                  std::equal(again.begin(), again.begin() + 20, bytes.begin()),
              "a decoded header does not encode back to its bytes");
        break;
      }
      case 1: {
        const Contribution contribution = decode_contribution(input);
        check(encode_contribution(contribution.phase, contribution.data) == bytes,
              "a decoded contribution does not encode back to its payload");
        break;
      }
      case 2: {
        const std::vector<Bytes> parts = decode_list(input);
        check(encode_list(parts) == bytes, "a decoded list does not encode back to its payload");
        break;
      }
      case 3:
        check(encode_challenge(decode_challenge(input)) == bytes,
              "a decoded challenge does not encode back to its payload");
        break;
      case 4:
        check(encode_hello(decode_hello(input)) == bytes,
              "a decoded hello does not encode back to its payload");
        break;
      default:
        check(encode_welcome(decode_welcome(input)) == bytes,
              "a decoded welcome does not encode back to its payload");
        break;
    }
  } catch (const BadFrame&) {
    // Rejected with the error the bootstrap turns into "bad frame from <peer>": fine.
  }
  return 0;
}
