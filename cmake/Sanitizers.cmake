# Sanitizer builds (presets sanitize, debug, tsan). PROXYEP_SANITIZER=address builds every target
# with AddressSanitizer, UndefinedBehaviorSanitizer (every check fatal) and LeakSanitizer;
# PROXYEP_SANITIZER=thread with ThreadSanitizer. Every executable gets the runtimes' default
# options and suppressions compiled in (proxyep_sanitizer_runtime_defaults below), and every test
# fails when its output holds a sanitizer's report (tests/CMakeLists.txt).
# PROXYEP_FUZZ=ON (Clang, with address) also builds the libFuzzer targets of tests/fuzz.
set(PROXYEP_SANITIZER "" CACHE STRING
    "Sanitizers to build with: address (ASan + UBSan + LSan), thread (TSan), or empty for none")
set_property(CACHE PROXYEP_SANITIZER PROPERTY STRINGS "" address thread)
option(PROXYEP_FUZZ "Build the libFuzzer targets of tests/fuzz (Clang, PROXYEP_SANITIZER=address)" OFF)

if(PROXYEP_SANITIZER STREQUAL "address")
  set(proxyep_sanitizer_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined)
elseif(PROXYEP_SANITIZER STREQUAL "thread")
  set(proxyep_sanitizer_flags -fsanitize=thread)
elseif(NOT PROXYEP_SANITIZER STREQUAL "")
  message(FATAL_ERROR "PROXYEP_SANITIZER must be address, thread or empty (is '${PROXYEP_SANITIZER}')")
endif()
if(proxyep_sanitizer_flags)
  # C and C++ only: the CUDA targets are off in sanitizer builds.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${proxyep_sanitizer_flags};-fno-omit-frame-pointer>")
  add_link_options(${proxyep_sanitizer_flags})
  # No MPI baseline (tools/mpi_baseline): Open MPI leaves its allocations to the exit, and inside
  # its plugins (unloaded by then, built without frame pointers) LeakSanitizer's stacks end before
  # any frame a suppression could name. The bench_ep tests then check ProxyEP's side only.
  set(PROXYEP_HAVE_MPI OFF)
endif()

if(PROXYEP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT PROXYEP_SANITIZER STREQUAL "address")
    message(FATAL_ERROR "PROXYEP_FUZZ needs Clang (libFuzzer) and PROXYEP_SANITIZER=address: "
                        "use the sanitize preset")
  endif()
endif()

# proxyep_sanitizer_runtime_defaults(): compiles tests/sanitizers/runtime_defaults.cpp (the
# runtimes' default options and third-party suppressions) into every executable of the build, so
# they hold however a program is started (a rank of `proxyep launch`, a test, by hand). Called
# at the end of the top-level CMakeLists.txt, once every target exists.
function(proxyep_sanitizer_runtime_defaults)
  if(NOT PROXYEP_SANITIZER)
    return()
  endif()
  add_library(proxyep_sanitizer_defaults OBJECT
              ${PROJECT_SOURCE_DIR}/tests/sanitizers/runtime_defaults.cpp)
  set(pending ${PROJECT_SOURCE_DIR})
  while(pending)
    list(POP_FRONT pending dir)
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "EXECUTABLE")
        target_sources(${target} PRIVATE $<TARGET_OBJECTS:proxyep_sanitizer_defaults>)
      endif()
    endforeach()
    get_property(subdirectories DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND pending ${subdirectories})
  endwhile()
endfunction()
