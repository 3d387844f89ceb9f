// The device-memory race check (global_shadow.hpp).
#include "runtime/global_shadow.hpp"

namespace cuemu {

GlobalShadow::Word& GlobalShadow::Pages::operator[](uintptr_t unit) {
  const uintptr_t page = unit / kPageWords;
  const size_t line = page % kCached;
  if (cached_page[line] != page) {
    std::unique_ptr<Page>& slot = pages[page];
    if (!slot) slot = std::make_unique<Page>();
    cached_page[line] = page;
    cached[line] = slot.get();
  }
  return cached[line]->words[unit % kPageWords];
}

const char* GlobalShadow::access(const Fiber& f, uintptr_t address, size_t bytes, bool write,
                                 bool atomic) {
  if (((address | bytes) & 3u) == 0) {
    for (uintptr_t w = address / 4; w < (address + bytes) / 4; ++w)
      if (const char* conflict = check(words_[w], f, write, atomic)) return conflict;
  } else {
    for (uintptr_t a = address; a < address + bytes; ++a)
      if (const char* conflict = check(bytes_[a], f, write, atomic)) return conflict;
  }
  return nullptr;
}

const char* GlobalShadow::check(Word& s, const Fiber& f, bool write, bool atomic) {
  const Block& b = *f.block;
  const int32_t block = b.linear;
  const auto me = static_cast<int16_t>(f.tid);
  const auto other = [me](int16_t who) { return who != -1 && who != me; };
  const bool foreign_writer = s.writer_block != -1 && s.writer_block != block;
  const bool foreign_toucher = s.block != -1 && s.block != block;
  if ((write && !atomic && foreign_toucher) || foreign_writer)
    return write && !atomic ? "a plain write to a word another block of the launch touched"
                            : "an access to a word another block of the launch wrote plainly";
  if (write && !atomic) s.writer_block = block;
  if (foreign_toucher) {
    s.block = kMany;  // reads (and atomics) from several blocks: fine until someone writes
    return nullptr;
  }
  if (s.block != block || s.epoch != b.generation) {
    s.block = block;
    s.epoch = b.generation;
    s.writer = s.reader = s.atomic = -1;
  }
  if (atomic) {
    if (other(s.writer)) return "an atomic after another thread's plain write";
    if (other(s.reader)) return "an atomic after another thread's plain read";
    s.atomic = (s.atomic == -1 || s.atomic == me) ? me : static_cast<int16_t>(kMany);
  } else if (write) {
    if (other(s.writer)) return "a write after another thread's write";
    if (other(s.reader)) return "a write after another thread's read";
    if (other(s.atomic)) return "a plain write after another thread's atomic";
    s.writer = me;
  } else {
    if (other(s.writer)) return "a read after another thread's write";
    if (other(s.atomic)) return "a plain read after another thread's atomic";
    s.reader = (s.reader == -1 || s.reader == me) ? me : static_cast<int16_t>(kMany);
  }
  return nullptr;
}

}  // namespace cuemu
