// The hooks that GCC and clang call from code compiled with -fsanitize=thread. The emulated
// kernels are compiled with it but never linked with a sanitizer runtime: these definitions are
// that runtime, and feed every load, store and atomic of the kernels to the detector (and make the
// atomics scheduling points). They return at once on a thread that runs no emulated kernel, so
// the host code compiled into the same objects runs as plain code. This file is not instrumented.
#include "runtime/detector.hpp"

#include <cstddef>
#include <cstdint>

using cuemu::Order;

namespace {

Order order_of(int model) {
  switch (model & 0xffff) {  // the compilers may add HLE bits above the C11 order
    case __ATOMIC_RELAXED:
      return Order::relaxed;
    case __ATOMIC_CONSUME:
    case __ATOMIC_ACQUIRE:
      return Order::acquire;
    case __ATOMIC_RELEASE:
      return Order::release;
    case __ATOMIC_ACQ_REL:
      return Order::acq_rel;
    default:
      return Order::seq_cst;
  }
}

}  // namespace

extern "C" {

void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_ignore_thread_begin() {}
void __tsan_ignore_thread_end() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}

#define CUEMU_PLAIN_HOOKS(bytes)                         \
  void __tsan_read##bytes(void* a) {                     \
    cuemu::on_access(a, bytes, false);                   \
  }                                                      \
  void __tsan_write##bytes(void* a) {                    \
    cuemu::on_access(a, bytes, true);                    \
  }                                                      \
  void __tsan_unaligned_read##bytes(void* a) {           \
    cuemu::on_access(a, bytes, false);                   \
  }                                                      \
  void __tsan_unaligned_write##bytes(void* a) {          \
    cuemu::on_access(a, bytes, true);                    \
  }                                                      \
  void __tsan_volatile_read##bytes(void* a) {            \
    cuemu::on_access(a, bytes, false);                   \
  }                                                      \
  void __tsan_volatile_write##bytes(void* a) {           \
    cuemu::on_access(a, bytes, true);                    \
  }                                                      \
  void __tsan_unaligned_volatile_read##bytes(void* a) {  \
    cuemu::on_access(a, bytes, false);                   \
  }                                                      \
  void __tsan_unaligned_volatile_write##bytes(void* a) { \
    cuemu::on_access(a, bytes, true);                    \
  }
CUEMU_PLAIN_HOOKS(1)
CUEMU_PLAIN_HOOKS(2)
CUEMU_PLAIN_HOOKS(4)
CUEMU_PLAIN_HOOKS(8)
CUEMU_PLAIN_HOOKS(16)
#undef CUEMU_PLAIN_HOOKS

void __tsan_read_range(void* a, unsigned long bytes) {
  cuemu::on_access(a, bytes, false);
}
void __tsan_write_range(void* a, unsigned long bytes) {
  cuemu::on_access(a, bytes, true);
}

// The atomics run as the sequentially consistent builtins (at least as strong as asked); the
// order that was asked for goes to the detector.
#define CUEMU_ATOMIC_HOOKS(bits, type)                                                             \
  type __tsan_atomic##bits##_load(const volatile type* a, int mo) {                                \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), false);                     \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                   \
  }                                                                                                \
  void __tsan_atomic##bits##_store(volatile type* a, type v, int mo) {                             \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                \
  type __tsan_atomic##bits##_exchange(volatile type* a, type v, int mo) {                          \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                                \
  type __tsan_atomic##bits##_fetch_add(volatile type* a, type v, int mo) {                         \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  type __tsan_atomic##bits##_fetch_sub(volatile type* a, type v, int mo) {                         \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  type __tsan_atomic##bits##_fetch_and(volatile type* a, type v, int mo) {                         \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  type __tsan_atomic##bits##_fetch_or(volatile type* a, type v, int mo) {                          \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                              \
  }                                                                                                \
  type __tsan_atomic##bits##_fetch_xor(volatile type* a, type v, int mo) {                         \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  type __tsan_atomic##bits##_fetch_nand(volatile type* a, type v, int mo) {                        \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                                \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile type* a, type* c, type v, int mo,     \
                                                    int) {                                         \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
  }                                                                                                \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile type* a, type* c, type v, int mo,       \
                                                  int) {                                           \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
  }                                                                                                \
  type __tsan_atomic##bits##_compare_exchange_val(volatile type* a, type c, type v, int mo, int) { \
    cuemu::on_atomic(const_cast<type*>(a), sizeof(type), order_of(mo), true);                      \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
    return c;                                                                                      \
  }
CUEMU_ATOMIC_HOOKS(8, uint8_t)
CUEMU_ATOMIC_HOOKS(16, uint16_t)
CUEMU_ATOMIC_HOOKS(32, uint32_t)
CUEMU_ATOMIC_HOOKS(64, uint64_t)
#undef CUEMU_ATOMIC_HOOKS

void __tsan_atomic_thread_fence(int) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  cuemu::on_fence();
}
void __tsan_atomic_signal_fence(int) {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

}  // extern "C"
