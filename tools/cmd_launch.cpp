// Placeholder until the launch command lands.
#include "tools/commands.hpp"
namespace proxyep::tools {
void register_launch(CLI::App&, Action&) {}
}  // namespace proxyep::tools
