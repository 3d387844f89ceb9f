// keep_forever: hands an object over to the rest of the process's life, on purpose. For state a
// thread we could not stop may still use (a proxy thread stuck inside a fabric provider that
// stop() had to detach): destroying it would turn that thread's next step into a use after free,
// so it is kept, and LeakSanitizer is told that this "leak" is deliberate (the object and all it
// reaches count as reachable), so sanitizer runs stay clean without a blanket suppression.
#pragma once

#include <memory>

#if defined(__SANITIZE_ADDRESS__)
#define PROXYEP_HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PROXYEP_HAVE_LSAN 1
#endif
#endif
#if PROXYEP_HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace proxyep {

template <typename T>
T* keep_forever(std::unique_ptr<T> owned) {
  T* kept = owned.release();
#if PROXYEP_HAVE_LSAN
  if (kept != nullptr) __lsan_ignore_object(kept);
#endif
  return kept;
}

}  // namespace proxyep
