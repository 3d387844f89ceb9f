# Every dependency is a Debian package; scripts/install-deps.sh installs them.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(LIBFABRIC REQUIRED IMPORTED_TARGET libfabric>=1.17)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
# libcrypto: HMAC-SHA256 and the CSPRNG behind the bootstrap's membership proof and memory keys.
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto)
# The metrics endpoint (metrics/): Prometheus' C++ client, its HTTP exposer included.
find_package(prometheus-cpp REQUIRED COMPONENTS core pull)
if(PROXYEP_BUILD_TESTS)
  find_package(doctest REQUIRED)
endif()

# moodycamel::ConcurrentQueue is header-only and ships neither a CMake nor a pkg-config file.
find_path(CONCURRENTQUEUE_INCLUDE_DIR concurrentqueue/concurrentqueue.h REQUIRED)
add_library(concurrentqueue INTERFACE)
target_include_directories(concurrentqueue SYSTEM INTERFACE ${CONCURRENTQUEUE_INCLUDE_DIR})

# MPI is optional: only proxyep-mpi-baseline, the baseline of `proxyep bench ep --baseline mpi`,
# uses it (Debian: libopenmpi-dev). Without it the project builds and that option says why not.
find_package(MPI COMPONENTS CXX QUIET)
set(PROXYEP_HAVE_MPI ${MPI_CXX_FOUND})
