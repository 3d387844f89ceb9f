// How the command-line programs (`proxyep`, `proxyepd`) fill the parameter registry: the config
// file (--config), then --set name=value, then a program's own shorthand options (proxyepd's
// --socket), then the environment (PROXYEP_* variables; PROXYEP_CONFIG's file under all of
// them). Every source is read, and every invalid value of every source is named in one error.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace proxyep::tools {

void load_parameters(const std::string& config_file, const std::vector<std::string>& overrides,
                     const std::vector<std::pair<std::string, std::string>>& shorthands = {});

}  // namespace proxyep::tools
