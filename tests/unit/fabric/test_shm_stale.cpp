// Its own binary (a fresh process): the shm leftovers of a dead process with this pid must not
// keep this process from opening shm (fabric/shm_stale.hpp).
#include "common/params.hpp"
#include "fabric/fabric.hpp"
#include "fabric/shm_stale.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
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
