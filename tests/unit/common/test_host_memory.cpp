// HostMemory: heap memory, a memfd mapped twice (in this process and in a forked child), and
// adopted memory freed by its deleter.
#include "common/error.hpp"
#include "common/host_memory.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

using namespace proxyep;

TEST_CASE("heap host memory is page-aligned, zeroed and movable") {
  auto memory = HostMemory::heap(1000);
  CHECK(memory.size() == 4096);
  CHECK(reinterpret_cast<uintptr_t>(memory.host()) % 4096 == 0);
  CHECK(memory.kind() == HostMemory::Kind::heap);
  CHECK(memory.fd() == -1);
  CHECK(memory.device() == nullptr);
  for (std::byte b : memory.bytes())
    REQUIRE(b == std::byte{0});
  void* address = memory.host();
  HostMemory moved = std::move(memory);
  CHECK(moved.host() == address);
  CHECK(memory.host() == nullptr);
  CHECK_THROWS_AS(HostMemory::heap(0), Error);
}

TEST_CASE("a memfd mapped twice shows the same bytes at two addresses") {
  auto owner = HostMemory::memfd(5000, "proxyep-test-host-memory");
  CHECK(owner.kind() == HostMemory::Kind::memfd);
  CHECK(owner.size() == 8192);
  REQUIRE(owner.fd() >= 0);
  auto second = HostMemory::map_fd(owner.fd());
  CHECK(second.kind() == HostMemory::Kind::memfd);
  CHECK(second.size() == owner.size());
  CHECK(second.host() != owner.host());
  CHECK(second.fd() != owner.fd());
  owner.bytes()[8191] = std::byte{0x5a};
  CHECK(second.bytes()[8191] == std::byte{0x5a});
  second.bytes()[0] = std::byte{0xa5};
  CHECK(owner.bytes()[0] == std::byte{0xa5});
  // The mapping keeps its own fd: it outlives the owner.
  { HostMemory gone = std::move(owner); }
  second.bytes()[1] = std::byte{1};
  CHECK(second.bytes()[0] == std::byte{0xa5});
}

TEST_CASE("a forked child maps the memfd anew and its writes reach the parent") {
  auto memory = HostMemory::memfd(64, "proxyep-test-host-memory-fork");
  const int fd = memory.fd();
  std::fflush(nullptr);  // or the child's exit may flush our buffered output a second time
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 0;
    try {
      auto mapping = HostMemory::map_fd(fd);
      std::memcpy(mapping.host(), "from the child", 15);
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(std::strcmp(static_cast<const char*>(memory.host()), "from the child") == 0);
}

TEST_CASE("map_fd refuses an empty file") {
  auto empty = HostMemory::memfd(1, "proxyep-test-host-memory-empty");
  REQUIRE(::ftruncate(empty.fd(), 0) == 0);
  CHECK_THROWS_WITH_AS(HostMemory::map_fd(empty.fd()), doctest::Contains("is empty"), Error);
}

TEST_CASE("adopted memory is freed once, by its deleter, after moves") {
  int freed = 0;
  void* block = std::malloc(256);
  REQUIRE(block != nullptr);
  int device_marker = 0;
  {
    auto memory = HostMemory::adopt(block, 256, &device_marker, [&freed](void* host) {
      ++freed;
      std::free(host);
    });
    CHECK(memory.kind() == HostMemory::Kind::adopted);
    CHECK(memory.host() == block);
    CHECK(memory.device() == &device_marker);
    CHECK(memory.size() == 256);
    CHECK(memory.fd() == -1);
    HostMemory moved = std::move(memory);
    CHECK(memory.host() == nullptr);
    HostMemory assigned = HostMemory::heap(1);
    assigned = std::move(moved);
    CHECK(assigned.host() == block);
    CHECK(freed == 0);
  }
  CHECK(freed == 1);
  CHECK_THROWS_AS(HostMemory::adopt(nullptr, 16, nullptr, [](void*) {}), Error);
  CHECK_THROWS_AS(HostMemory::adopt(&device_marker, 4, nullptr, nullptr), Error);
}
