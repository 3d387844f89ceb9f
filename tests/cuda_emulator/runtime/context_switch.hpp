// Switching between fibers: a few instructions that save the callee-saved registers on the
// current stack, store its pointer and load another's. glibc's swapcontext would do, but it makes
// a sigprocmask system call at every switch, which cost more than half of a kernel's emulated run
// time; no emulated code touches the signal mask, so nothing needs restoring but the registers
// the System V ABI says a call preserves. x86-64 and AArch64; other hosts use ucontext.
#pragma once

#include <cstddef>

namespace cuemu {

// A fiber's saved stack pointer (the registers lie on its stack).
struct Context {
  void* stack_pointer = nullptr;
#if !defined(__x86_64__) && !defined(__aarch64__)
  void* ucontext = nullptr;  // the fallback's ucontext_t
#endif
};

// A context that starts running `entry` (which must never return) on [stack, stack + bytes).
void make_context(Context& context, void* stack, size_t bytes, void (*entry)());
// Saves the running context into `from` and resumes `to`.
void switch_context(Context& from, Context& to);

}  // namespace cuemu
