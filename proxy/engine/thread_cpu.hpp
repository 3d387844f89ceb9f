// CPU time of one thread of this process, from /proc/self/task/<tid>/stat (utime + stime, in
// clock ticks: 10 ms on most kernels, so measure over seconds). Used to check that idle proxy
// threads stay cheap (DESIGN.md: idle proxies cost at most a few percent of a core).
#pragma once

#include <sys/types.h>

#include <optional>

namespace proxyep::proxy {

// Seconds of CPU the thread `tid` of this process has used so far; nullopt when the kernel does
// not expose it (no procfs, thread gone).
std::optional<double> thread_cpu_seconds(pid_t tid);

}  // namespace proxyep::proxy
