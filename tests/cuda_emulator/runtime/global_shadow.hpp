// The race check on device memory (runtime/detector.cpp's `race` kind, for global words): within
// a block, as for shared memory (two threads between barriers, one writing plainly); between
// blocks of one launch, any plain write to a word another block also touched (blocks have no
// barrier between them). Host-mapped memory is left to the publication rules: its ring slots are
// rewritten every lap by other threads, ordered through the consumer's tail, which epochs cannot
// see. One shadow per launch, dropped at its end (a launch boundary orders everything).
#pragma once

#include "runtime/fiber.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

namespace cuemu {

// Aligned 4-, 8- and 16-byte accesses are checked per 4-byte word; narrower or unaligned ones per
// byte (a GPU writes bytes without touching their neighbours: adjacent bools or bytes of two
// threads are no race), in a second shadow. The two are not compared with each other.
class GlobalShadow {
 public:
  // A conflict's description, or null.
  const char* access(const Fiber& f, uintptr_t address, size_t bytes, bool write, bool atomic);

 private:
  struct Word {
    int32_t block = -1;         // the block that first touched it, or kMany
    int32_t writer_block = -1;  // the block that wrote it plainly, or kMany
    uint32_t epoch = 0;         // `block`'s barrier generation the thread fields belong to
    int16_t writer = -1, reader = -1, atomic = -1;  // threads of `block`, kMany, or -1
  };
  static constexpr size_t kPageWords = 1024;  // a 4 KiB page of words
  struct Page {
    Word words[kPageWords];
  };

  // The pages of one granularity, found through a small direct-mapped cache first (a copy
  // alternates between its source's and its destination's pages).
  struct Pages {
    Word& operator[](uintptr_t unit);
    std::unordered_map<uintptr_t, std::unique_ptr<Page>> pages;
    static constexpr size_t kCached = 64;
    uintptr_t cached_page[kCached];
    Page* cached[kCached];
    Pages() {
      for (size_t i = 0; i < kCached; ++i) {
        cached_page[i] = ~uintptr_t{0};
        cached[i] = nullptr;
      }
    }
  };

  const char* check(Word& s, const Fiber& f, bool write, bool atomic);

  Pages words_, bytes_;
};

// The running launch's shadow (null outside a launch).
GlobalShadow* global_shadow();

}  // namespace cuemu
