// The launch environment of one rank, in torchrun's variables: MASTER_ADDR, MASTER_PORT, RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (so torchrun, `proxyep launch`, mpirun wrappers and
// Kubernetes jobs start ProxyEP ranks without new tooling).
#pragma once

#include <string>

namespace proxyep::control {

struct LaunchEnv {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // ranks per node; ranks [n*L, (n+1)*L) form node n

  int node() const { return rank / local_world_size; }
  int num_nodes() const { return (world_size + local_world_size - 1) / local_world_size; }

  // Reads the variables above (through config::read_environment). Missing LOCAL_* default to a
  // single node; with neither RANK nor WORLD_SIZE set the process is a world of one (no launcher,
  // no rendezvous, MASTER_* optional). Throws proxyep::Error (phase "bootstrap.env") naming the
  // variable and its value for missing or malformed values (non-numbers, signs, trailing junk,
  // RANK >= WORLD_SIZE, ports outside 1..65535, only one of a RANK/WORLD_SIZE or LOCAL_* pair,
  // LOCAL_RANK != RANK % LOCAL_WORLD_SIZE, WORLD_SIZE not a multiple of LOCAL_WORLD_SIZE, no
  // MASTER_ADDR/MASTER_PORT when WORLD_SIZE > 1).
  static LaunchEnv from_environment();
  // Same checks on given values (tests, in-process launches).
  void validate() const;
};

}  // namespace proxyep::control
