// `proxyep info --memory`: one rank's host memory for a job's shape, item by item, from the
// memory model (integrations/memory_model.hpp), with the job's total.
#pragma once

#include "integrations/memory_model.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace proxyep::tools {

struct MemoryCli {
  bool memory = false;
  integrations::MemoryShape shape;
};

// Adds --memory and the shape's options (--ranks, --ranks-per-node, --tokens, --hidden, --topk,
// --experts, --low-latency) to `info`.
void add_memory_options(CLI::App& info, MemoryCli& cli);
// Prints the model (as JSON with `json`); returns the exit code.
int print_memory(const MemoryCli& cli, bool json);

}  // namespace proxyep::tools
