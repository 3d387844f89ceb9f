#include "gpu_side/descriptor.hpp"

namespace proxyep::gpu_side {

const char* to_string(DecodeResult result) {
  switch (result) {
    case DecodeResult::ok:
      return "ok";
    case DecodeResult::bad_version:
      return "bad_version";
    case DecodeResult::bad_op:
      return "bad_op";
    case DecodeResult::bad_flags:
      return "bad_flags";
    case DecodeResult::bad_length:
      return "bad_length";
    case DecodeResult::bad_check:
      return "bad_check";
  }
  return "unknown";
}

const char* to_string(Op op) {
  switch (op) {
    case Op::write_imm:
      return "write_imm";
    case Op::signal:
      return "signal";
    case Op::nop:
      return "nop";
  }
  return "unknown";
}

}  // namespace proxyep::gpu_side
