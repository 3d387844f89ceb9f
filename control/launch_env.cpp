#include "control/launch_env.hpp"

#include "common/error.hpp"
#include "common/registry.hpp"

#include <charconv>
#include <optional>

namespace proxyep::control {
namespace {

constexpr const char* kPhase = "bootstrap.env";

// Strict decimal: digits only, no sign, no spaces, no trailing junk, fits in an int. torchrun and
// `proxyep launch` write plain decimals, so anything else is a launch script bug worth naming.
int parse_count(const char* variable, const std::string& text) {
  int value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [stop, ec] = std::from_chars(begin, end, value);
  bool digits_only = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  require(digits_only, kPhase, "{}='{}' is not a non-negative decimal integer", variable, text);
  require(ec == std::errc() && stop == end, kPhase, "{}='{}' is too large", variable, text);
  return value;
}

std::optional<int> read_count(const char* variable) {
  auto text = config::read_environment(variable);
  if (!text) return std::nullopt;
  return parse_count(variable, *text);
}

void require_local_consistency(const LaunchEnv& env) {
  require(env.local_world_size >= 1, kPhase, "LOCAL_WORLD_SIZE={} must be at least 1",
          env.local_world_size);
  require(env.world_size % env.local_world_size == 0, kPhase,
          "WORLD_SIZE={} is not a multiple of LOCAL_WORLD_SIZE={} (every node runs the same "
          "number of ranks)",
          env.world_size, env.local_world_size);
  require(env.local_rank >= 0 && env.local_rank < env.local_world_size, kPhase,
          "LOCAL_RANK={} is out of range for LOCAL_WORLD_SIZE={} (expected 0..{})", env.local_rank,
          env.local_world_size, env.local_world_size - 1);
  // Nodes hold contiguous blocks of ranks (torchrun's assignment); the layout math depends on it.
  require(env.local_rank == env.rank % env.local_world_size, kPhase,
          "LOCAL_RANK={} is inconsistent with RANK={} and LOCAL_WORLD_SIZE={} (expected "
          "LOCAL_RANK = RANK % LOCAL_WORLD_SIZE = {})",
          env.local_rank, env.rank, env.local_world_size, env.rank % env.local_world_size);
}

}  // namespace

void LaunchEnv::validate() const {
  require(world_size >= 1, kPhase, "WORLD_SIZE={} must be at least 1", world_size);
  require(rank >= 0 && rank < world_size, kPhase,
          "RANK={} is out of range for WORLD_SIZE={} (expected 0..{})", rank, world_size,
          world_size - 1);
  require_local_consistency(*this);
  // A single rank needs no rendezvous, so MASTER_* may be absent; when given they must be sane.
  bool need_master = world_size > 1;
  require(!need_master || !master_addr.empty(), kPhase,
          "MASTER_ADDR is not set but WORLD_SIZE={} needs a rendezvous address (the host of "
          "rank 0)",
          world_size);
  require((!need_master && master_port == 0) || (master_port >= 1 && master_port <= 65535), kPhase,
          "MASTER_PORT={} is outside 1..65535{}", master_port,
          need_master && master_port == 0 ? " (not set?)" : "");
}

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv env;
  auto rank = read_count("RANK");
  auto world_size = read_count("WORLD_SIZE");
  // Neither set: a process started on its own is a world of one (no launcher, no rendezvous).
  require(rank.has_value() == world_size.has_value(), kPhase,
          "{} is set but {} is not: set both (or neither, for a single process)",
          rank ? "RANK" : "WORLD_SIZE", rank ? "WORLD_SIZE" : "RANK");
  env.rank = rank.value_or(0);
  env.world_size = world_size.value_or(1);

  auto local_rank = read_count("LOCAL_RANK");
  auto local_world_size = read_count("LOCAL_WORLD_SIZE");
  require(local_rank.has_value() == local_world_size.has_value(), kPhase,
          "{} is set but {} is not: set both (or neither, for a single node)",
          local_rank ? "LOCAL_RANK" : "LOCAL_WORLD_SIZE",
          local_rank ? "LOCAL_WORLD_SIZE" : "LOCAL_RANK");
  env.local_rank = local_rank.value_or(env.rank);
  env.local_world_size = local_world_size.value_or(env.world_size);

  env.master_addr = config::read_environment("MASTER_ADDR").value_or("");
  if (auto port = config::read_environment("MASTER_PORT")) {
    env.master_port = parse_count("MASTER_PORT", *port);
    require(env.master_port >= 1 && env.master_port <= 65535, kPhase,
            "MASTER_PORT='{}' is outside 1..65535", *port);
  } else {
    require(env.world_size == 1, kPhase,
            "MASTER_PORT is not set but WORLD_SIZE={} needs a rendezvous port", env.world_size);
  }
  env.validate();
  return env;
}

}  // namespace proxyep::control
