#include "proxy/engine/thread_cpu.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace proxyep::proxy {

std::optional<double> thread_cpu_seconds(pid_t tid) {
  std::ifstream file("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  if (!file || !std::getline(file, line)) return std::nullopt;
  // Field 2 (comm) is in parentheses and may contain spaces: parse after the last ')'.
  auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  // Fields 3..13 precede utime (14) and stime (15).
  for (int i = 3; i <= 13; ++i)
    if (!(rest >> field)) return std::nullopt;
  unsigned long long utime = 0, stime = 0;
  if (!(rest >> utime >> stime)) return std::nullopt;
  long ticks = ::sysconf(_SC_CLK_TCK);
  if (ticks <= 0) return std::nullopt;
  return static_cast<double>(utime + stime) / static_cast<double>(ticks);
}

}  // namespace proxyep::proxy
