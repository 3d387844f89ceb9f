// A bare client of proxyepd's attach protocol (daemon/attached_client.hpp), for the data-path
// tests: it attaches as rank 0 of a job of 2 whose other rank is itself (or, with --peer, an
// endpoint it names), starts the proxy and then ends as told. Exercises the daemon's whole
// per-client life (map, open, register, connect, start, stop, deregister, unmap) in ~10 ms,
// which is what lets a test run 100 connect/crash cycles.
//
//   attach_client --socket PATH [--peer HEX] [--end detach|exit|kill|hold] [--job-tag HEX]
//                 [--pause-after-open] [--descriptors HEX,HEX]
// Prints "address HEX" and "arena HEX" once the daemon opened its endpoint, "started" once it
// runs and "attach_ms T" (connect, handshake, mapping, endpoint, registration, start); `hold`
// then waits for stdin to close. --job-tag: the job's tag in the attach request (as
// control::daemon_job_tag makes it); --pause-after-open: waits for a line on stdin before it
// connects; --descriptors: the arena descriptors it sends for ranks 0 and 1, "own" for its own
// (default: own,own). Exit 0 on success; 2 with the error on stderr.
#include "common/host_memory.hpp"
#include "control/daemon_connection.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/signal_relay.hpp"

#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

using namespace proxyep;

int main(int argc, char** argv) {
  std::string socket, peer, end = "detach", job_tag, descriptors;
  bool pause_after_open = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--pause-after-open") {
      pause_after_open = true;
      continue;
    }
    if (i + 1 >= argc) break;
    if (flag == "--socket") socket = argv[i + 1];
    if (flag == "--peer") peer = argv[i + 1];
    if (flag == "--end") end = argv[i + 1];
    if (flag == "--job-tag") job_tag = argv[i + 1];
    if (flag == "--descriptors") descriptors = argv[i + 1];
    ++i;
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
    nlohmann::json attach{{"proxyep", "attach"}, {"rank", 0}, {"ranks", 2}};
    if (!job_tag.empty()) attach["job_tag"] = job_tag;
    auto opened = daemon.request(attach, fds, "opened", deadline, "attach_client");
    lap("opened");
    const std::string own = opened["addresses"];
    const std::string arena_descriptor = opened["arena"];
    std::cout << "address " << own << std::endl << "arena " << arena_descriptor << std::endl;
    if (pause_after_open) {
      std::string line;
      std::getline(std::cin, line);
    }
    // The pause may outlast the first deadline.
    const Deadline connect_deadline(timeout);
    daemon.request({{"proxyep", "connect"}, {"addresses", {own, peer.empty() ? own : peer}}}, {},
                   "connected", connect_deadline, "attach_client");
    lap("connected");
    nlohmann::json sent = {arena_descriptor, arena_descriptor};
    if (!descriptors.empty()) {
      const auto comma = descriptors.find(',');
      const auto own_if_asked = [&](std::string text) {
        return text == "own" ? arena_descriptor : text;
      };
      sent = {own_if_asked(descriptors.substr(0, comma)),
              own_if_asked(comma == std::string::npos ? "" : descriptors.substr(comma + 1))};
    }
    daemon.request({{"proxyep", "arenas"}, {"descriptors", sent}}, {}, "arenas_added",
                   connect_deadline, "attach_client");
    lap("arenas_added");
    daemon.request({{"proxyep", "start"}}, {}, "started", connect_deadline, "attach_client");
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
