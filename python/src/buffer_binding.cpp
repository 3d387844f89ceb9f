// proxyep::Buffer for Python: the collective constructor over a rendezvous the Python side set
// up through its torch.distributed group (GroupRendezvous) with the Buffer's options
// (BufferOptions, built by keyword), its statistics, and its lifecycle. The calls of each mode
// are bound in normal_binding.cpp and low_latency_binding.cpp; every call takes torch tensor
// views in and gives DLPack capsules out (tensor_bridge.hpp), the GIL released while the
// runtime works or waits.
#include "binding_helpers.hpp"
#include "bindings.hpp"
#include "native_buffer.hpp"
#include "python_signals.hpp"
#include "tensor_bridge.hpp"

#include "common/error.hpp"
#include "integrations/buffer.hpp"

#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

namespace py = pybind11;

namespace proxyep::python {
namespace {

using DevicePtr = std::shared_ptr<gpu_side::device::DeviceRuntime>;

GroupRendezvous make_group(std::string master_addr, int master_port, int rank, int world_size,
                           int ranks_per_node, std::string job_id, const py::bytes& secret) {
  return {std::move(master_addr), master_port,        rank, world_size, ranks_per_node,
          std::move(job_id),      std::string(secret)};
}

void bind_group_rendezvous(py::module_& m) {
  const GroupRendezvous defaults;
  py::class_<GroupRendezvous>(m, "GroupRendezvous")
      .def(py::init(&make_group), py::kw_only(), py::arg("master_addr") = defaults.master_addr,
           py::arg("master_port") = defaults.master_port, py::arg("rank") = defaults.rank,
           py::arg("world_size") = defaults.world_size,
           py::arg("ranks_per_node") = defaults.ranks_per_node, py::arg("job_id") = defaults.job_id,
           py::arg("secret") = py::bytes(defaults.secret))
      .def_readwrite("master_addr", &GroupRendezvous::master_addr)
      .def_readwrite("master_port", &GroupRendezvous::master_port)
      .def_readwrite("rank", &GroupRendezvous::rank)
      .def_readwrite("world_size", &GroupRendezvous::world_size)
      .def_readwrite("ranks_per_node", &GroupRendezvous::ranks_per_node)
      .def_readwrite("job_id", &GroupRendezvous::job_id)
      .def_property(
          "secret", [](const GroupRendezvous& g) { return py::bytes(g.secret); },
          [](GroupRendezvous& g, const py::bytes& b) { g.secret = std::string(b); });
}

// "per_rank" or "hierarchical", as ep.internode spells them; None: ep.internode.
std::optional<proxy::Internode> parse_internode(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  if (*name == "per_rank") return proxy::Internode::per_rank;
  if (*name == "hierarchical") return proxy::Internode::hierarchical;
  throw py::value_error(
      "BufferOptions: internode must be 'per_rank', 'hierarchical' or None; got '" + *name + "'");
}

std::optional<std::string> internode_name(const std::optional<proxy::Internode>& internode) {
  if (!internode) return std::nullopt;
  return *internode == proxy::Internode::hierarchical ? "hierarchical" : "per_rank";
}

BufferOptions make_options(int64_t num_nvl_bytes, int64_t num_rdma_bytes, bool low_latency_mode,
                           int num_qps_per_rank, bool allow_nvlink_for_low_latency_mode,
                           bool enable_shrink, bool explicitly_destroy, DevicePtr device,
                           const std::optional<std::string>& internode, int64_t timeout_ms) {
  BufferOptions o;
  o.internode = parse_internode(internode);
  o.timeout_ms = timeout_ms;
  o.num_nvl_bytes = num_nvl_bytes;
  o.num_rdma_bytes = num_rdma_bytes;
  o.low_latency_mode = low_latency_mode;
  o.num_qps_per_rank = num_qps_per_rank;
  o.allow_nvlink_for_low_latency_mode = allow_nvlink_for_low_latency_mode;
  o.enable_shrink = enable_shrink;
  o.explicitly_destroy = explicitly_destroy;
  o.device = std::move(device);
  return o;
}

// ranks_per_node is left out: the Buffer takes it from its GroupRendezvous, which the bootstrap
// is made over too, so the two cannot disagree.
void bind_buffer_options(py::module_& m) {
  const BufferOptions defaults;
  py::class_<BufferOptions>(m, "BufferOptions", "a Buffer's options (integrations/buffer.hpp)")
      .def(
          py::init(&make_options), py::kw_only(), py::arg("num_nvl_bytes") = defaults.num_nvl_bytes,
          py::arg("num_rdma_bytes") = defaults.num_rdma_bytes,
          py::arg("low_latency_mode") = defaults.low_latency_mode,
          py::arg("num_qps_per_rank") = defaults.num_qps_per_rank,
          py::arg("allow_nvlink_for_low_latency_mode") = defaults.allow_nvlink_for_low_latency_mode,
          py::arg("enable_shrink") = defaults.enable_shrink,
          py::arg("explicitly_destroy") = defaults.explicitly_destroy, py::arg("device") = nullptr,
          py::arg("internode") = py::none(), py::arg("timeout_ms") = defaults.timeout_ms)
      .def_readwrite("num_nvl_bytes", &BufferOptions::num_nvl_bytes)
      .def_readwrite("num_rdma_bytes", &BufferOptions::num_rdma_bytes)
      .def_readwrite("low_latency_mode", &BufferOptions::low_latency_mode)
      .def_readwrite("num_qps_per_rank", &BufferOptions::num_qps_per_rank)
      .def_readwrite("allow_nvlink_for_low_latency_mode",
                     &BufferOptions::allow_nvlink_for_low_latency_mode)
      .def_readwrite("enable_shrink", &BufferOptions::enable_shrink)
      .def_readwrite("explicitly_destroy", &BufferOptions::explicitly_destroy)
      .def_readwrite("device", &BufferOptions::device)
      .def_property(
          "internode", [](const BufferOptions& o) { return internode_name(o.internode); },
          [](BufferOptions& o, const std::optional<std::string>& name) {
            o.internode = parse_internode(name);
          })
      .def_readwrite("timeout_ms", &BufferOptions::timeout_ms);
}

void bind_phase_times(py::module_& m) {
  py::class_<PhaseTimes>(m, "PhaseTimes")
      .def_readonly("calls", &PhaseTimes::calls)
      .def_readonly("prepare_ns", &PhaseTimes::prepare_ns)
      .def_readonly("notify_ns", &PhaseTimes::notify_ns)
      .def_readonly("pack_ns", &PhaseTimes::pack_ns)
      .def_readonly("post_ns", &PhaseTimes::post_ns)
      .def_readonly("local_ns", &PhaseTimes::local_ns)
      .def_readonly("unpack_ns", &PhaseTimes::unpack_ns)
      .def_readonly("wait_ns", &PhaseTimes::wait_ns)
      .def_readonly("reduce_ns", &PhaseTimes::reduce_ns)
      .def_readonly("quiet_ns", &PhaseTimes::quiet_ns);
  py::class_<StepClock::Step>(m, "SetupStep")
      .def_readonly("name", &StepClock::Step::name)
      .def_readonly("seconds", &StepClock::Step::seconds)
      .def_readonly("cpu_seconds", &StepClock::Step::cpu_seconds)
      .def("__repr__", [](const StepClock::Step& s) {
        return "SetupStep(" + s.name + ", " + std::to_string(s.seconds) + " s)";
      });
}

void bind_buffer_stats(py::module_& m) {
  using S = BufferStats;
  py::class_<BufferStats>(m, "BufferStats")
      .def_readonly("calls", &S::calls)
      .def_readonly("eager_streams", &S::eager_streams)
      .def_readonly("chunks_sent", &S::chunks_sent)
      .def_readonly("chunks_received", &S::chunks_received)
      .def_readonly("chunks_to_fabric", &S::chunks_to_fabric)
      .def_readonly("credit_stalls", &S::credit_stalls)
      .def_readonly("chunks_reduced_in_place", &S::chunks_reduced_in_place)
      .def_readonly("rows_stored_in_place", &S::rows_stored_in_place)
      .def_readonly("chunks_sent_from_caller", &S::chunks_sent_from_caller)
      .def_readonly("bytes_to_node", &S::bytes_to_node)
      .def_readonly("bytes_to_fabric", &S::bytes_to_fabric)
      .def_readonly("internode", &S::internode)
      .def_readonly("rows_to_fabric", &S::rows_to_fabric)
      .def_readonly("rows_forwarded", &S::rows_forwarded)
      .def_readonly("reordered_completions", &S::reordered_completions)
      .def_readonly("writes_from_device", &S::writes_from_device)
      .def_readonly("chunks_from_device_memory", &S::chunks_from_device_memory)
      .def_readonly("sends_to_device_arenas", &S::sends_to_device_arenas)
      .def_readonly("setup_steps", &S::setup_steps)
      .def_readonly("dispatch_phases", &S::dispatch_phases)
      .def_readonly("combine_phases", &S::combine_phases);
}

// What a call gives back to wait on: both wait (or receive) with the GIL released; errors raise
// ProxyEPError.
void bind_completions(py::module_& m) {
  py::class_<RecvHook>(m, "RecvHook")
      .def(
          "__call__", [](const RecvHook& hook) { hook(); }, py::call_guard<GilRelease>())
      .def_property_readonly(
          "device_point", &RecvHook::device_point,
          "a captured call's hook, once called: the DeviceEvent inside the graph where its "
          "receive ends (the capturing stream waits for it), else None");
  py::class_<CallEvent>(m, "CallEvent")
      .def("wait", &CallEvent::wait, py::call_guard<GilRelease>())
      .def_property_readonly(
          "device_point", &CallEvent::device_point,
          "a call with device tensors: the DeviceEvent reached once it ended, else None");
}

// Collective: waits for every rank with the GIL released, letting Python's signal handlers run
// meanwhile (a KeyboardInterrupt they raise replaces the bootstrap's error).
std::unique_ptr<NativeBuffer> make_buffer(const GroupRendezvous& group, BufferOptions options) {
  options.ranks_per_node = group.ranks_per_node;
  PythonSignals signals;
  try {
    GilRelease unlocked;
    return std::make_unique<NativeBuffer>(group, options, signals.hook());
  } catch (const Error&) {
    signals.raise_if_interrupted();
    throw;
  }
}

// Construction, what the Buffer is, and its lifecycle: what neither mode's calls own.
void bind_buffer_lifecycle(BufferClass& buffer) {
  buffer.def(py::init(&make_buffer), py::arg("group"), py::arg("options"))
      .def_property_readonly("rank", [](NativeBuffer& b) { return b.get().rank(); })
      .def_property_readonly("group_size", [](NativeBuffer& b) { return b.get().group_size(); })
      .def_property_readonly("ranks_per_node",
                             [](NativeBuffer& b) { return b.get().ranks_per_node(); })
      .def("stats", [](NativeBuffer& b) { return b.get().stats(); })
      .def_property_readonly("metrics_port", [](NativeBuffer& b) { return b.get().metrics_port(); })
      .def(
          "local_buffer",
          [](NativeBuffer& b, bool use_rdma_buffer, py::object owner) {
            return capsule_of_bytes(b.get().local_buffer(use_rdma_buffer), std::move(owner));
          },
          py::arg("use_rdma_buffer"), py::arg("owner"))
      .def("close", &NativeBuffer::close, py::call_guard<GilRelease>())
      .def("barrier", &NativeBuffer::barrier, py::call_guard<GilRelease>())
      .def(
          "destroy", [](NativeBuffer& b) { b.get().destroy(); }, py::call_guard<GilRelease>());
}

}  // namespace

void bind_buffer(py::module_& m) {
  bind_group_rendezvous(m);
  bind_buffer_options(m);
  bind_phase_times(m);
  bind_buffer_stats(m);
  bind_completions(m);
  // The handles and argument classes first, so that the calls' signatures name them.
  bind_normal_types(m);
  bind_low_latency_types(m);
  bind_elastic_types(m);
  BufferClass buffer(m, "Buffer");
  bind_buffer_lifecycle(buffer);
  bind_normal_calls(buffer);
  bind_elastic_calls(buffer);
  bind_low_latency_calls(buffer);
}

}  // namespace proxyep::python
