// The step transport through the node daemon (daemon_steps.hpp).
#include "proxy/daemon_steps.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "control/daemon_frames.hpp"

#include <fmt/format.h>

#include <array>

namespace proxyep::proxy {

namespace {

// The daemon's answer to step_memory: the registered region's descriptor, or (device memory
// only) why it declined.
struct Registered {
  fabric::Bytes descriptor;
  std::string note;
};

Registered read_registered(const nlohmann::json& reply, std::string_view phase) {
  Registered out;
  if (const auto region = reply.find("region"); region != reply.end() && region->is_string())
    out.descriptor = control::hex_decode(region->get<std::string>(), "region", phase);
  out.note = reply.value("note", std::string());
  require(!out.descriptor.empty() || !out.note.empty(), std::string(phase),
          "proxyepd's 'step_memory_registered' answer has neither 'region' nor 'note'");
  return out;
}

}  // namespace

HostMemory DaemonSteps::host_memory(uint64_t bytes, std::string_view what) {
  std::string name = fmt::format("proxyep-{}-{}", what, rank_);
  for (char& c : name)
    if (c == ' ') c = '-';
  return HostMemory::memfd(bytes, name);
}

DeviceStepMemory DaemonSteps::register_device_memory(gpu_side::device::DeviceRuntime& device,
                                                     uint64_t bytes, const Deadline& deadline) {
  // Memory the daemon opens by its handle, as the device staging and arena of the attach.
  gpu_side::device::SharedMemory shared = device.allocate_shared(bytes);
  if (!shared.memory || !shared.nic_reads) return {};
  const nlohmann::json offer{
      {"kind", std::string(device.kind())},
      {"step",
       {{"handle", control::hex_encode(shared.handle)}, {"bytes", bytes}, {"fd", shared.fd >= 0}}}};
  std::vector<int> fds;
  if (shared.fd >= 0) fds.push_back(shared.fd);
  const Registered registered = read_registered(
      daemon_.request({{"proxyep", "step_memory"}, {"bytes", bytes}, {"device_memory", offer}}, fds,
                      "step_memory_registered", deadline, phase_),
      phase_);
  if (registered.descriptor.empty()) {
    log::info(
        "buffer: rank {}: proxyepd: step memory not registered in device memory ({}); host "
        "memory serves",
        rank_, registered.note);
    return {};
  }
  return {.memory = shared.memory, .descriptor = registered.descriptor};
}

fabric::Bytes DaemonSteps::register_host_memory(const HostMemory& memory,
                                                const Deadline& deadline) {
  const std::array<int, 1> fds{memory.fd()};
  const Registered registered =
      read_registered(daemon_.request({{"proxyep", "step_memory"}, {"bytes", memory.size()}}, fds,
                                      "step_memory_registered", deadline, phase_),
                      phase_);
  require(!registered.descriptor.empty(), phase_, "proxyepd did not register the step memory: {}",
          registered.note);
  return registered.descriptor;
}

void DaemonSteps::link(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
                       bool keep_polling, const Deadline& deadline) {
  nlohmann::json request{{"proxyep", "step_link"},
                         {"words", words.size()},
                         {"keep_polling", keep_polling},
                         {"descriptors", nlohmann::json::array()}};
  for (const fabric::Bytes& descriptor : descriptors)
    request["descriptors"].push_back(control::hex_encode(descriptor));
  const std::array<int, 1> fds{words.fd()};
  daemon_.request(request, fds, "step_linked", deadline, phase_);
}

}  // namespace proxyep::proxy
