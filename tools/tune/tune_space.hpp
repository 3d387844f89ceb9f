// What `proxyep tune` searches: the candidate values of the four parameters it tunes
// (proxy.threads, proxy.pin, ep.chunk_bytes, ep.eager_bytes), parsed from its list options and
// checked against what each parameter accepts before any benchmark runs, plus the point the
// search starts from (the values in force now: defaults, or an earlier tuned file).
//
// List syntax: comma-separated values; integers take the registry's K/M/G suffixes; --threads
// also takes ranges ("1..3", "1..3,6"). Values are sorted and deduplicated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::tools::tune {

// One configuration of the four tuned parameters.
struct Candidate {
  int64_t threads = 1;
  bool pin = true;
  int64_t chunk_bytes = 0;
  int64_t eager_bytes = 0;

  bool operator==(const Candidate&) const = default;
};

// The values each parameter may take; `start` is where the search begins (each of its values is
// in its list).
struct SearchSpace {
  std::vector<int64_t> threads;
  std::vector<bool> pin;
  std::vector<int64_t> chunk_bytes;
  std::vector<int64_t> eager_bytes;
  Candidate start;
};

// The list options as given; "" = the default for that parameter.
struct SpaceOptions {
  std::string threads;      // default "1..cores-1" (at least 1)
  std::string pin;          // default "true,false"
  std::string chunk_bytes;  // default: current value, half and double (those in range)
  std::string eager_bytes;  // default: current value, half and double (those in range)
};

// The CPUs this process may run on (its affinity mask), at least 1.
int usable_cores();

// Builds the search space for a machine with `cores` CPUs around `current` (the values in force
// now). Throws proxyep::Error("tune") naming the option, the item and why, for anything a
// parameter would refuse, a malformed item or a range elsewhere than --threads.
SearchSpace make_search_space(const SpaceOptions& options, int cores, const Candidate& current);

// The four tuned parameters' values in force in this process (registry).
Candidate current_values();

// "1M", "128K", "1000": the registry's own size spelling.
std::string format_bytes(int64_t value);

// "threads=2 pin=true chunk=1M eager=128K".
std::string describe(const Candidate& candidate);

}  // namespace proxyep::tools::tune
