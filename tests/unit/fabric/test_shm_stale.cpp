// Its own binary (a fresh process): the shm leftovers of a dead process with this pid must not
// keep this process from opening shm (fabric/shm_stale.hpp).
#include "common/params.hpp"
#include "fabric/fabric.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <string>

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
