// A bare client of proxyepd's attach protocol (daemon/attached_client.hpp), for the data-path
// tests: it attaches as rank 0 of a job of 2 whose other rank is itself (or, with --peer, an
// endpoint it names), starts the proxy and then ends as told. Exercises the daemon's whole
// per-client life (map, open, register, connect, start, stop, deregister, unmap) in ~10 ms,
// which is what lets a test run 100 connect/crash cycles.
//
//   attach_client --socket PATH [--peer HEX] [--end detach|exit|kill|hold]
// Prints "address HEX" once the daemon opened its endpoint, "started" once it runs and
// "attach_ms T" (connect, handshake, mapping, endpoint, registration, start); `hold` then waits
// for stdin to close. Exit 0 on success; 2 with the error on stderr.
#include "common/host_memory.hpp"
#include "control/daemon_connection.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/signal_relay.hpp"

#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

using namespace proxyep;

int main(int argc, char** argv) {
  std::string socket, peer, end = "detach";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--socket") socket = argv[i + 1];
    if (flag == "--peer") peer = argv[i + 1];
    if (flag == "--end") end = argv[i + 1];
  }
  try {
    const auto timeout = std::chrono::milliseconds(5000);
    const auto began = std::chrono::steady_clock::now();
    auto daemon = control::DaemonConnection::open(socket, control::ClientKind::attach, timeout,
                                                  "attach_client");
    auto lap = [&, last = began](const char* step) mutable {
      const auto now = std::chrono::steady_clock::now();
      std::cerr << step << " " << std::chrono::duration<double, std::milli>(now - last).count()
                << " ms\n";
      last = now;
    };
    lap("welcome");
    auto arena = HostMemory::memfd(1 << 20, "arena");
    auto staging = HostMemory::memfd(1 << 20, "staging");
    auto ring_memory = HostMemory::memfd(gpu_side::Ring::bytes_for(64), "ring");
    auto relay_memory = HostMemory::memfd(gpu_side::Ring::bytes_for(proxy::kRelaySlots), "relay");
    gpu_side::Ring::create(ring_memory.bytes(), 64, gpu_side::ProducerMode::single);
    gpu_side::Ring::create(relay_memory.bytes(), proxy::kRelaySlots,
                           gpu_side::ProducerMode::single);
    gpu_side::Doorbell doorbell;
    const int fds[] = {arena.fd(), staging.fd(), ring_memory.fd(), doorbell.fd(),
                       relay_memory.fd()};
    const Deadline deadline(timeout);
    auto opened = daemon.request({{"proxyep", "attach"}, {"rank", 0}, {"ranks", 2}}, fds, "opened",
                                 deadline, "attach_client");
    lap("opened");
    const std::string own = opened["addresses"];
    std::cout << "address " << own << std::endl;
    daemon.request({{"proxyep", "connect"}, {"addresses", {own, peer.empty() ? own : peer}}}, {},
                   "connected", deadline, "attach_client");
    lap("connected");
    const std::string arena_descriptor = opened["arena"];
    daemon.request({{"proxyep", "arenas"}, {"descriptors", {arena_descriptor, arena_descriptor}}},
                   {}, "arenas_added", deadline, "attach_client");
    lap("arenas_added");
    daemon.request({{"proxyep", "start"}}, {}, "started", deadline, "attach_client");
    lap("started");
    const auto took =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began);
    std::cout << "started" << std::endl << "attach_ms " << took.count() << std::endl;
    if (end == "kill") ::raise(SIGKILL);
    if (end == "exit") ::_exit(0);  // no detach, no destructors: as a crash leaves it
    if (end == "hold") {
      std::string line;
      while (std::getline(std::cin, line)) {
      }
    }
    daemon.request({{"proxyep", "detach"}}, {}, "detached", Deadline(timeout), "attach_client");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "attach_client: " << e.what() << std::endl;
    return 2;
  }
}
