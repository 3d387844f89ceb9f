// A fixed pool of per-operation slots. Every libfabric operation ProxyEP posts carries one slot
// as its context: the provider uses the slot's leading fi_context2 as scratch space (FI_CONTEXT2
// mode, required by efa-direct), and the completion hands the same pointer back, so the slot
// tells which peer and which operation finished or failed.
//
// Allocated once at construction and never resized, so slot addresses stay valid while the
// provider holds them; acquire/release are O(1) through a free-index stack, with no allocation
// on the hot path. An empty pool is back-pressure (the caller returns Status::again), not an
// error. Single-threaded, like the rail that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace proxyep::fabric {

template <typename Slot>
class SlotPool {
 public:
  explicit SlotPool(size_t capacity) : slots_(capacity), free_(capacity) {
    // Hand out low indices first: the slots in use stay clustered in the cache.
    for (size_t i = 0; i < capacity; ++i)
      free_[i] = static_cast<uint32_t>(capacity - 1 - i);
  }
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // nullptr when every slot is in use.
  Slot* acquire() {
    if (free_.empty()) return nullptr;
    uint32_t index = free_.back();
    free_.pop_back();
    return &slots_[index];
  }

  void release(Slot* slot) { free_.push_back(static_cast<uint32_t>(slot - slots_.data())); }

  // Whether `pointer` is the address of one of this pool's slots: completions carry raw context
  // pointers, and one that is not ours (a provider-internal or foreign context) must be ignored
  // rather than dereferenced.
  bool owns(const void* pointer) const {
    auto address = reinterpret_cast<uintptr_t>(pointer);
    auto begin = reinterpret_cast<uintptr_t>(slots_.data());
    auto end = begin + slots_.size() * sizeof(Slot);
    return address >= begin && address < end && (address - begin) % sizeof(Slot) == 0;
  }

  size_t capacity() const { return slots_.size(); }
  size_t in_use() const { return slots_.size() - free_.size(); }

 private:
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
};

}  // namespace proxyep::fabric
