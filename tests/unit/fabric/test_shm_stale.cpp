// Its own binary (a fresh process): the shm leftovers of a dead process with this pid must not
// keep this process from opening shm, and the leftovers of dead processes are swept unless
// someone still maps them (fabric/shm_stale.hpp).
#include "common/params.hpp"
#include "fabric/fabric.hpp"
#include "fabric/shm_stale.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

using namespace proxyep;

TEST_CASE("shm: a region left by a dead process with our pid does not block fi_enable") {
  // What libfabric 1.17's shm provider leaves behind when a process dies with an endpoint open.
  const std::string stale = "/dev/shm/" + std::to_string(::getpid()) + ":0:0";
  int fd = ::open(stale.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 4096) == 0);
  ::close(fd);
  params::fabric_provider.set("shm");
  std::unique_ptr<fabric::Fabric> fabric;
  CHECK_NOTHROW(fabric = fabric::Fabric::open(fabric::FabricOptions::from_params(0)));
  fabric.reset();
  params::fabric_provider.reset();
  ::unlink(stale.c_str());  // if the open failed, the test's own file is still there
}

TEST_CASE("shm: only regions named after the pid and owned by this user are removed") {
  char pattern[] = "/tmp/proxyep_shm_test_XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const std::string dir = pattern;
  auto make = [&](const std::string& name) {
    int fd = ::open((dir + "/" + name).c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  };
  // 4242 stands for a dead rank's pid; nothing here checks liveness, the caller vouches for it.
  for (const char* name : {"4242:0:0", "4242:1:3", "42420:0:0", "4242", "x4242:0:0", "424:0:0"})
    make(name);
  REQUIRE(::mkdir((dir + "/4242:dir").c_str(), 0700) == 0);  // not a region: left alone
  // Another user's region with the same name pattern (only root can make one to test with).
  const bool as_root = ::geteuid() == 0;
  if (as_root) {
    make("4242:9:9");
    REQUIRE(::chown((dir + "/4242:9:9").c_str(), 65534, 65534) == 0);
  }

  auto removed = fabric::remove_shm_regions_of(4242, dir);
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{dir + "/4242:0:0", dir + "/4242:1:3"});
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  std::vector<std::string> expected = {"4242", "42420:0:0", "4242:dir", "424:0:0", "x4242:0:0"};
  if (as_root) expected.insert(expected.begin() + 2, "4242:9:9");
  CHECK(left == expected);
  CHECK(fabric::remove_shm_regions_of(4242, dir + "/missing").empty());
  std::filesystem::remove_all(dir);
}

namespace {

// A pid no process has: a child's, after it has been reaped (reuse needs the pid space to wrap).
pid_t dead_pid() {
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

}  // namespace

TEST_CASE("shm: the sweep removes regions nobody maps whose process is gone, and only those") {
  // In a directory of /dev/shm's file system (tmpfs), where the regions live.
  char pattern[] = "/dev/shm/proxyep_sweep_test_XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const std::string dir = pattern;
  auto make = [&](const std::string& name) {
    int fd = ::open((dir + "/" + name).c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 4096) == 0);
    return fd;
  };
  const std::string dead = std::to_string(dead_pid());
  // A dead process's leftover: nobody maps it.
  ::close(make(dead + ":0:0"));
  // A dead process's region that a peer still maps read-write, and one it maps read-only (the
  // fd closed, as libfabric's shm provider closes it after mmap).
  void* shared = nullptr;
  void* read_only = nullptr;
  {
    int fd = make(dead + ":1:0");
    shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    fd = make(dead + ":2:0");
    ::close(fd);
    fd = ::open((dir + "/" + dead + ":2:0").c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    read_only = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
  }
  REQUIRE(shared != MAP_FAILED);
  REQUIRE(read_only != MAP_FAILED);
  // Named after a live process (this one), mapped by nobody: its pid still guards it.
  const std::string live = std::to_string(::getpid()) + ":0:0";
  ::close(make(live));
  // Not regions: other names.
  ::close(make("x" + dead + ":0:0"));
  ::close(make(dead));

  auto removed = fabric::remove_unused_shm_regions(dir);
  CHECK(removed == std::vector<std::string>{dir + "/" + dead + ":0:0"});
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  std::vector<std::string> expected = {dead, dead + ":1:0", dead + ":2:0", live,
                                       "x" + dead + ":0:0"};
  std::sort(expected.begin(), expected.end());
  CHECK(left == expected);

  // Once the peer unmaps them, they go too.
  REQUIRE(::munmap(shared, 4096) == 0);
  REQUIRE(::munmap(read_only, 4096) == 0);
  removed = fabric::remove_unused_shm_regions(dir);
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{dir + "/" + dead + ":1:0", dir + "/" + dead + ":2:0"});
  CHECK(fabric::remove_unused_shm_regions(dir + "/missing").empty());
  std::filesystem::remove_all(dir);
}
