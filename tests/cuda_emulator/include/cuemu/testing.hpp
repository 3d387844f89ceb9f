// For the emulator's own tests (test_emu_detector.cpp): the kinds of the faults reported since the
// last call, in order; the call also clears the sticky error, so the next case starts clean.
#pragma once

#include <string>
#include <vector>

namespace cuemu::testing {

std::vector<std::string> take_faults();

}  // namespace cuemu::testing
