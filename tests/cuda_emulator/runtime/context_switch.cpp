// The fiber switch (context_switch.hpp).
#include "runtime/context_switch.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)

// cuemu_switch(void** save, void* load): push rbp, rbx, r12-r15; save rsp; load the other's rsp;
// pop its six registers; return into it.
asm(R"(
  .pushsection .text
  .globl cuemu_switch
  .type cuemu_switch, @function
cuemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuemu_switch, .-cuemu_switch
  .popsection
)");

#elif defined(__aarch64__)

// cuemu_switch(void** save, void* load): x19-x30 and d8-d15 (the callee-saved registers, x30 the
// return address) stored below sp; sp saved; the other's loaded; its registers restored; ret.
asm(R"(
  .pushsection .text
  .globl cuemu_switch
  .type cuemu_switch, %function
cuemu_switch:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mov x9, sp
  str x9, [x0]
  mov sp, x1
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #176
  ret
  .size cuemu_switch, .-cuemu_switch
  .popsection
)");

#endif

#if defined(__x86_64__) || defined(__aarch64__)

extern "C" void cuemu_switch(void** save, void* load);

namespace cuemu {

void make_context(Context& context, void* stack, size_t bytes, void (*entry)()) {
  auto top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15};
#if defined(__x86_64__)
  // [top - 8] a null return address for entry (it never returns); [top - 16] entry, which the
  // first switch's ret jumps to with rsp = top - 8, as after a call; below, six zero registers.
  auto* slots = reinterpret_cast<void**>(top);
  slots[-1] = nullptr;
  slots[-2] = reinterpret_cast<void*>(entry);
  std::memset(slots - 8, 0, 6 * sizeof(void*));
  context.stack_pointer = slots - 8;
#else
  // The 176-byte frame the switch restores, x30 (the return address) = entry; sp 16-aligned.
  auto* frame = reinterpret_cast<uint64_t*>(top - 176);
  std::memset(frame, 0, 176);
  frame[11] = reinterpret_cast<uint64_t>(entry);
  context.stack_pointer = frame;
#endif
}

void switch_context(Context& from, Context& to) {
  cuemu_switch(&from.stack_pointer, to.stack_pointer);
}

}  // namespace cuemu

#else

#include <ucontext.h>

namespace cuemu {

void make_context(Context& context, void* stack, size_t bytes, void (*entry)()) {
  auto* u = new ucontext_t{};
  getcontext(u);
  u->uc_stack.ss_sp = stack;
  u->uc_stack.ss_size = bytes;
  u->uc_link = nullptr;
  makecontext(u, entry, 0);
  context.ucontext = u;
}

void switch_context(Context& from, Context& to) {
  if (from.ucontext == nullptr) from.ucontext = new ucontext_t{};
  swapcontext(static_cast<ucontext_t*>(from.ucontext), static_cast<ucontext_t*>(to.ucontext));
}

}  // namespace cuemu

#endif
