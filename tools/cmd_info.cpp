// Placeholder until the info command lands.
#include "tools/commands.hpp"
namespace proxyep::tools {
void register_info(CLI::App&, Action&) {}
}  // namespace proxyep::tools
