// Placeholder until the bench command lands.
#include "tools/commands.hpp"
namespace proxyep::tools {
void register_bench(CLI::App&, Action&) {}
}  // namespace proxyep::tools
