// What a fuzz target does when a decoder breaks a property it promises (a round trip that does
// not give the input back, a record that does not fit its slot): print what and abort, which
// libFuzzer reports as a crash and saves the input as an artifact. (Test code only: the library
// itself never aborts.)
#pragma once

#include <cstdio>
#include <cstdlib>

namespace proxyep::fuzz {

inline void check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

}  // namespace proxyep::fuzz
