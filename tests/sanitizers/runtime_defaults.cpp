// Sanitizer runtime defaults, compiled into every executable of a sanitizer build (presets
// sanitize, tsan, debug; cmake/Sanitizers.cmake adds this file). Being in the binary, they hold
// however a program starts: under ctest, by hand, or as a rank of `proxyep launch` (which passes
// its own environment on). ASAN_OPTIONS, UBSAN_OPTIONS, LSAN_OPTIONS and TSAN_OPTIONS in the
// environment still override them one option at a time.
//
// Suppressions are for third-party code only, each with the reason it cannot be fixed here
// (the runtimes skip lines starting with '#'). None is needed today: the runs are clean.

// The runtimes look these up by name; nothing in the program calls them.
// NOLINTBEGIN(readability-identifier-naming)
extern "C" {

// AddressSanitizer: stop at the first error; also catch use of a stack frame after return and
// static initialisers that read another file's globals before they are constructed.
//
// intercept_tls_get_addr=0: Clang 14's runtime guesses where a dynamic-TLS block starts and how
// big it is from a header that glibc dropped in 2.25 (google/sanitizers#1409, fixed upstream in
// 2023). When a block happens to sit 16 bytes past a page boundary it reads heap bytes as that
// header, and LeakSanitizer's tracer later scans the made-up range and dies at exit ("Tracer caught
// signal 11", "DTLS 9 at 0x760-0x400001862" with verbosity=1): one run in ~12 of the 3-rank
// low-latency test. Nothing is missed without the interception: since glibc 2.25 those blocks
// come from malloc, and the thread's DTV that points at them is itself a heap block reachable
// from the thread's static TLS, which LeakSanitizer scans.
__attribute__((used, visibility("default"))) const char* __asan_default_options() {
  return "halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:"
         "check_initialization_order=1:strict_init_order=1:intercept_tls_get_addr=0";
}

// UndefinedBehaviorSanitizer: every check is fatal (-fno-sanitize-recover), with the stack.
__attribute__((used, visibility("default"))) const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1";
}

// LeakSanitizer: runs at exit in every process of the ASan build.
__attribute__((used, visibility("default"))) const char* __lsan_default_options() {
  return "print_suppressions=0";
}

__attribute__((used, visibility("default"))) const char* __lsan_default_suppressions() {
  return "";
}

// ThreadSanitizer: stop at the first report; both stacks of a lock-order inversion.
__attribute__((used, visibility("default"))) const char* __tsan_default_options() {
  return "halt_on_error=1:second_deadlock_stack=1";
}

__attribute__((used, visibility("default"))) const char* __tsan_default_suppressions() {
  return "";
}

}  // extern "C"
// NOLINTEND(readability-identifier-naming)
