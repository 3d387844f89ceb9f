// Fuzzes decode() of the 64-byte transfer descriptor (gpu_side/descriptor.hpp), which a proxy
// runs on every ring slot a producer wrote (a GPU kernel, another process through a memfd).
// Input: the slot's 64 bytes, then an optional byte whose bit 0 asks to recompute the check word
// (so that the fuzzer also reaches the checks behind it). decode() must return a result for any
// image and leave `out` untouched unless it is ok, and an image it accepts must be exactly what
// encode() makes of the decoded descriptor under the same sequence word.
#include "gpu_side/descriptor.hpp"
#include "tests/fuzz/fuzz_check.hpp"

#include <cstring>
#include <string_view>

using namespace proxyep::gpu_side;
using proxyep::fuzz::check;

namespace {

bool same(const Descriptor& a, const Descriptor& b) {
  return a.op == b.op && a.flags == b.flags && a.dst_rank == b.dst_rank &&
         a.local_region == b.local_region && a.remote_region == b.remote_region &&
         a.src_offset == b.src_offset && a.dst_offset == b.dst_offset && a.length == b.length &&
         a.cookie == b.cookie && a.imm == b.imm;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kDescriptorBytes) return 0;
  WireDescriptor image;
  std::memcpy(&image, data, kDescriptorBytes);
  if (size > kDescriptorBytes && (data[kDescriptorBytes] & 1) != 0)
    image.check = descriptor_check(image);

  Descriptor sentinel;
  sentinel.op = Op::nop;
  sentinel.flags = 0xdead;
  sentinel.dst_rank = 0xfeedf00d;
  sentinel.cookie = 0x0123456789abcdefull;
  Descriptor out = sentinel;
  const DecodeResult result = decode(image, out);
  check(std::string_view(to_string(result)) != "unknown", "decode returned an unnamed result");
  if (result != DecodeResult::ok) {
    check(same(out, sentinel), "decode changed `out` although it rejected the image");
    return 0;
  }
  const WireDescriptor again = encode(out, image.seq);
  check(std::memcmp(&again, &image, kDescriptorBytes) == 0,
        "an accepted image is not what encode() makes of its descriptor");
  check(std::string_view(to_string(out.op)) != "unknown", "decode accepted an unnamed op");
  return 0;
}
