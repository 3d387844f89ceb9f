// proxyep::Buffer for Python: the collective constructor over a rendezvous the Python side set
// up through its torch.distributed group, every call with torch tensor views in and DLPack
// capsules out (tensor_bridge.hpp), the GIL released while the runtime works or waits.
#include "bindings.hpp"
#include "python_signals.hpp"
#include "tensor_bridge.hpp"

#include "common/crypto.hpp"
#include "common/error.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "gpu_side/device/open_device.hpp"
#include "integrations/buffer.hpp"

#include <pybind11/stl.h>

#include <chrono>
#include <initializer_list>
#include <memory>
#include <string>

namespace py = pybind11;
namespace ep = proxyep::gpu_side::ep;

namespace proxyep::python {
namespace {

using GilRelease = py::gil_scoped_release;
using DeviceEventPtr = std::shared_ptr<gpu_side::device::DeviceEvent>;

// What the Python side learnt from its group: where rank 0 of the group listens, this rank's
// place, and the per-Buffer job id and secret that keep strangers out of the rendezvous.
struct GroupRendezvous {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  int ranks_per_node = 1;
  std::string job_id;
  std::string secret;  // raw bytes
};

// A Buffer with the bootstrap it was made over (the Buffer must go first).
class NativeBuffer {
 public:
  // `interrupt`: checks Python's signals while the constructor waits for the other ranks.
  NativeBuffer(const GroupRendezvous& group, const BufferOptions& options,
               std::function<void()> interrupt)
      : device_(options.device) {
    control::LaunchEnv env;
    env.master_addr = group.master_addr;
    env.master_port = group.master_port;
    env.rank = group.rank;
    env.world_size = group.world_size;
    env.local_world_size = group.ranks_per_node;
    env.local_rank = group.rank % group.ranks_per_node;
    env.validate();
    auto boot_options = control::Bootstrap::options_for(env);
    boot_options.job_id = group.job_id;
    if (!group.secret.empty()) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(group.secret.data());
      boot_options.secret =
          std::make_shared<const SecretBytes>(std::span<const uint8_t>(bytes, group.secret.size()));
    }
    boot_options.progress = std::move(interrupt);
    boot_ = control::Bootstrap::connect(std::move(boot_options));
    buffer_ = std::make_unique<Buffer>(*boot_, options);
    // Later collectives (barrier, destroy) may run on any thread, late in the interpreter's life.
    boot_->set_progress({});
  }
  ~NativeBuffer() { close(); }

  Buffer& get() {
    require(buffer_ != nullptr, "buffer", "the Buffer was destroyed");
    return *buffer_;
  }
  // Collective over the Buffer's bootstrap: what the C++ benches time from, so that
  // python3 -m proxyep.bench compares like with like (a gloo barrier releases ranks less evenly).
  void barrier() {
    require(boot_ != nullptr, "buffer", "the Buffer was destroyed");
    boot_->barrier("python(barrier)");
  }
  // Frees the Buffer and the bootstrap (not collective; destroy() is).
  void close() {
    buffer_.reset();
    boot_.reset();
  }

  // A device call's previous_event: the caller's, else (DeepEP's default: the Buffer's stream
  // waits for the caller's) the point `caller_stream` has reached, where the device has streams
  // of the caller's (CUDA; the simulated device's callers work on the host). A host call takes
  // none: the host waits for the caller's event first (its tensors may be what that stream
  // made; the GIL released meanwhile).
  // `capturable` (the low-latency calls): while the caller's stream captures a CUDA graph, the
  // point recorded there is inside the capture, and the Buffer's stream joins it (join_back()
  // after the call); other calls are refused there.
  DeviceEventPtr previous_event(std::string_view call, std::initializer_list<ep::TensorRef> tensors,
                                DeviceEventPtr given, uintptr_t caller_stream,
                                bool capturable = false) const {
    bool on_device = false;
    for (const auto& t : tensors)
      on_device = on_device || t.device == ep::Device::cuda;
    if (!on_device) {
      if (given && device_) {
        GilRelease unlocked;
        device_->wait_for(*given, "previous_event",
                          std::chrono::milliseconds(params::ep_timeout_ms.get()));
      }
      return nullptr;
    }
    if (!device_) return given;
    if (!given)
      return gpu_side::device::record_on_caller_stream(*device_, caller_stream, call, capturable);
    // Ordering after the given event alone: the caller's stream is still checked for capture.
    if (!capturable) gpu_side::device::require_no_graph_capture(*device_, caller_stream, call);
    return given;
  }
  // A captured call's end (its event, a point inside the graph): the caller's stream waits for
  // it, joining the Buffer's stream back into the capture, which can then end. Nothing for a
  // call that was not captured.
  void join_back(const CallEvent& event, uintptr_t caller_stream, std::string_view call) const {
    const DeviceEventPtr& point = event.device_point();
    if (device_ && point && point->captured())
      gpu_side::device::caller_stream_wait(*device_, caller_stream, point, call);
  }
  // How the call's device outputs are released: after `caller_stream`'s reads of them. Drops,
  // first, the earlier outputs whose readers are done, unless the caller's stream is being
  // captured (an event query would invalidate the capture).
  DeviceRelease release(uintptr_t caller_stream) const {
    if (releases_) {
      try {
        gpu_side::device::require_no_graph_capture(*device_, caller_stream, "python(release)");
        releases_->collect();
      } catch (const Error&) {
        // captured: collected at a later call
      }
    }
    return {device_, caller_stream, releases_};
  }

 private:
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  // Outputs torch let go, until the streams that read them passed that point; shared with the
  // outputs themselves, which may outlive this Buffer.
  std::shared_ptr<integrations::DeviceReleases> releases_ =
      device_ ? std::make_shared<integrations::DeviceReleases>(device_) : nullptr;
  std::unique_ptr<control::Bootstrap> boot_;
  std::unique_ptr<Buffer> buffer_;
};

// A RecvHook or CallEvent the call made, or None (the call asked for neither).
template <typename T>
py::object defined_or_none(const T& value) {
  return value.defined() ? py::cast(value) : py::none();
}

py::tuple layout_tuple(const DispatchLayout& l, const DeviceRelease& release) {
  return py::make_tuple(
      capsule_of(l.num_tokens_per_rank, &release), capsule_of(l.num_tokens_per_rdma_rank, &release),
      capsule_of(l.num_tokens_per_expert, &release), capsule_of(l.is_token_in_rank, &release));
}

}  // namespace

void bind_buffer(py::module_& m) {
  py::class_<GroupRendezvous>(m, "GroupRendezvous")
      .def(py::init<>())
      .def_readwrite("master_addr", &GroupRendezvous::master_addr)
      .def_readwrite("master_port", &GroupRendezvous::master_port)
      .def_readwrite("rank", &GroupRendezvous::rank)
      .def_readwrite("world_size", &GroupRendezvous::world_size)
      .def_readwrite("ranks_per_node", &GroupRendezvous::ranks_per_node)
      .def_readwrite("job_id", &GroupRendezvous::job_id)
      .def_property(
          "secret", [](const GroupRendezvous& g) { return py::bytes(g.secret); },
          [](GroupRendezvous& g, const py::bytes& b) { g.secret = std::string(b); });

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

  py::class_<BufferStats>(m, "BufferStats")
      .def_readonly("calls", &BufferStats::calls)
      .def_readonly("eager_streams", &BufferStats::eager_streams)
      .def_readonly("chunks_sent", &BufferStats::chunks_sent)
      .def_readonly("chunks_received", &BufferStats::chunks_received)
      .def_readonly("chunks_to_fabric", &BufferStats::chunks_to_fabric)
      .def_readonly("credit_stalls", &BufferStats::credit_stalls)
      .def_readonly("chunks_reduced_in_place", &BufferStats::chunks_reduced_in_place)
      .def_readonly("rows_stored_in_place", &BufferStats::rows_stored_in_place)
      .def_readonly("chunks_sent_from_caller", &BufferStats::chunks_sent_from_caller)
      .def_readonly("bytes_to_node", &BufferStats::bytes_to_node)
      .def_readonly("bytes_to_fabric", &BufferStats::bytes_to_fabric)
      .def_readonly("internode", &BufferStats::internode)
      .def_readonly("rows_to_fabric", &BufferStats::rows_to_fabric)
      .def_readonly("rows_forwarded", &BufferStats::rows_forwarded)
      .def_readonly("reordered_completions", &BufferStats::reordered_completions)
      .def_readonly("writes_from_device", &BufferStats::writes_from_device)
      .def_readonly("chunks_from_device_memory", &BufferStats::chunks_from_device_memory)
      .def_readonly("sends_to_device_arenas", &BufferStats::sends_to_device_arenas)
      .def_readonly("setup_steps", &BufferStats::setup_steps)
      .def_readonly("dispatch_phases", &BufferStats::dispatch_phases)
      .def_readonly("combine_phases", &BufferStats::combine_phases);

  py::class_<DispatchHandle>(m, "DispatchHandle")
      .def_property_readonly(
          "rank_prefix_matrix",
          [](const DispatchHandle& h) { return capsule_of(h.rank_prefix_matrix); })
      .def_property_readonly("recv_src_idx",
                             [](const DispatchHandle& h) { return capsule_of(h.recv_src_idx); })
      .def_property_readonly("is_token_in_rank",
                             [](const DispatchHandle& h) { return capsule_of(h.is_token_in_rank); })
      .def_property_readonly("send_head",
                             [](const DispatchHandle& h) { return capsule_of(h.send_head); })
      .def_readonly("num_tokens", &DispatchHandle::num_tokens)
      .def_readonly("num_recv_tokens", &DispatchHandle::num_recv_tokens)
      .def_readonly("hidden", &DispatchHandle::hidden);

  py::class_<LowLatencyHandle>(m, "LowLatencyHandle")
      .def_property_readonly("src_info",
                             [](const LowLatencyHandle& h) { return capsule_of(h.src_info); })
      .def_property_readonly("layout_range",
                             [](const LowLatencyHandle& h) { return capsule_of(h.layout_range); })
      .def_readonly("num_max_dispatch_tokens_per_rank",
                    &LowLatencyHandle::num_max_dispatch_tokens_per_rank)
      .def_readonly("hidden", &LowLatencyHandle::hidden)
      .def_readonly("num_experts", &LowLatencyHandle::num_experts);

  // Both wait (or receive) with the GIL released; errors raise ProxyEPError.
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

  py::class_<NativeBuffer>(m, "Buffer")
      .def(py::init([](const GroupRendezvous& group, int64_t num_nvl_bytes, int64_t num_rdma_bytes,
                       bool low_latency_mode, int num_qps_per_rank, bool allow_nvlink,
                       bool enable_shrink, bool explicitly_destroy,
                       std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
             BufferOptions o;
             o.device = std::move(device);
             o.num_nvl_bytes = num_nvl_bytes;
             o.num_rdma_bytes = num_rdma_bytes;
             o.low_latency_mode = low_latency_mode;
             o.num_qps_per_rank = num_qps_per_rank;
             o.allow_nvlink_for_low_latency_mode = allow_nvlink;
             o.enable_shrink = enable_shrink;
             o.explicitly_destroy = explicitly_destroy;
             o.ranks_per_node = group.ranks_per_node;
             PythonSignals signals;
             try {
               GilRelease unlocked;  // collective: waits for every rank
               return std::make_unique<NativeBuffer>(group, o, signals.hook());
             } catch (const Error&) {
               signals.raise_if_interrupted();  // e.g. KeyboardInterrupt, in place of ours
               throw;
             }
           }),
           py::arg("group"), py::arg("num_nvl_bytes"), py::arg("num_rdma_bytes"),
           py::arg("low_latency_mode"), py::arg("num_qps_per_rank"),
           py::arg("allow_nvlink_for_low_latency_mode"), py::arg("enable_shrink"),
           py::arg("explicitly_destroy"), py::arg("device") = nullptr)
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
          "destroy", [](NativeBuffer& b) { b.get().destroy(); }, py::call_guard<GilRelease>())
      .def(
          "get_dispatch_layout",
          [](NativeBuffer& b, const py::object& topk_idx, int num_experts,
             DeviceEventPtr previous_event, uintptr_t caller_stream) {
            const ep::TensorRef idx = view_of(topk_idx, "topk_idx");
            previous_event = b.previous_event("get_dispatch_layout", {idx},
                                              std::move(previous_event), caller_stream);
            DispatchLayout layout;
            {
              GilRelease unlocked;
              layout = b.get().get_dispatch_layout(idx, num_experts, previous_event);
            }
            const DeviceRelease release = b.release(caller_stream);
            return layout_tuple(layout, release);
          },
          py::arg("topk_idx"), py::arg("num_experts"), py::arg("previous_event") = nullptr,
          py::arg("caller_stream") = 0)
      .def(
          "dispatch",
          [](NativeBuffer& b, const py::object& x, const py::object& x_scales,
             const DispatchHandle* handle, const py::object& num_tokens_per_rank,
             const py::object& num_tokens_per_rdma_rank, const py::object& is_token_in_rank,
             const py::object& num_tokens_per_expert, const py::object& topk_idx,
             const py::object& topk_weights, int expert_alignment, int num_worst_tokens,
             std::optional<Config> config, bool async_finish, DeviceEventPtr previous_event,
             uintptr_t caller_stream) {
            DispatchArgs a;
            a.x = view_of(x, "x");
            a.x_scales = view_of(x_scales, "x_scales");
            a.handle = handle;
            a.num_tokens_per_rank = view_of(num_tokens_per_rank, "num_tokens_per_rank");
            a.num_tokens_per_rdma_rank =
                view_of(num_tokens_per_rdma_rank, "num_tokens_per_rdma_rank");
            a.is_token_in_rank = view_of(is_token_in_rank, "is_token_in_rank");
            a.num_tokens_per_expert = view_of(num_tokens_per_expert, "num_tokens_per_expert");
            a.topk_idx = view_of(topk_idx, "topk_idx");
            a.topk_weights = view_of(topk_weights, "topk_weights");
            a.expert_alignment = expert_alignment;
            a.num_worst_tokens = num_worst_tokens;
            a.config = config;
            a.async_finish = async_finish;
            a.previous_event = b.previous_event("dispatch", {a.x, a.topk_idx, a.is_token_in_rank},
                                                std::move(previous_event), caller_stream);
            DispatchResult r;
            {
              GilRelease unlocked;
              r = b.get().dispatch(a);
            }
            const DeviceRelease release = b.release(caller_stream);
            return py::make_tuple(
                capsule_of(r.recv_x, &release), capsule_of(r.recv_x_scales, &release),
                capsule_of(r.recv_topk_idx, &release), capsule_of(r.recv_topk_weights, &release),
                py::cast(r.num_recv_tokens_per_expert), py::cast(std::move(r.handle)),
                defined_or_none(r.event));
          },
          py::arg("x"), py::arg("x_scales"), py::arg("handle"), py::arg("num_tokens_per_rank"),
          py::arg("num_tokens_per_rdma_rank"), py::arg("is_token_in_rank"),
          py::arg("num_tokens_per_expert"), py::arg("topk_idx"), py::arg("topk_weights"),
          py::arg("expert_alignment"), py::arg("num_worst_tokens"), py::arg("config"),
          py::arg("async_finish") = false, py::arg("previous_event") = nullptr,
          py::arg("caller_stream") = 0)
      .def(
          "combine",
          [](NativeBuffer& b, const py::object& x, const DispatchHandle& handle,
             const py::object& topk_weights, const py::object& bias0, const py::object& bias1,
             std::optional<Config> config, bool async_finish, DeviceEventPtr previous_event,
             uintptr_t caller_stream) {
            CombineArgs a;
            a.x = view_of(x, "x");
            a.handle = &handle;
            a.topk_weights = view_of(topk_weights, "topk_weights");
            a.bias0 = view_of(bias0, "bias[0]");
            a.bias1 = view_of(bias1, "bias[1]");
            a.config = config;
            a.async_finish = async_finish;
            a.previous_event =
                b.previous_event("combine", {a.x}, std::move(previous_event), caller_stream);
            CombineResult r;
            {
              GilRelease unlocked;
              r = b.get().combine(a);
            }
            const DeviceRelease release = b.release(caller_stream);
            return py::make_tuple(capsule_of(r.combined_x, &release),
                                  capsule_of(r.combined_topk_weights, &release),
                                  defined_or_none(r.event));
          },
          py::arg("x"), py::arg("handle"), py::arg("topk_weights"), py::arg("bias0"),
          py::arg("bias1"), py::arg("config"), py::arg("async_finish") = false,
          py::arg("previous_event") = nullptr, py::arg("caller_stream") = 0)
      .def(
          "clean_low_latency_buffer",
          [](NativeBuffer& b, int tokens, int hidden, int experts) {
            b.get().clean_low_latency_buffer(tokens, hidden, experts);
          },
          py::call_guard<GilRelease>(), py::arg("num_max_dispatch_tokens_per_rank"),
          py::arg("hidden"), py::arg("num_experts"))
      .def(
          "low_latency_dispatch",
          [](NativeBuffer& b, const py::object& x, const py::object& topk_idx, int tokens,
             int experts, const py::object& recv_stats, const py::object& wait_stats, bool use_fp8,
             bool round_scale, bool use_ue8m0, bool async_finish, bool return_recv_hook,
             DeviceEventPtr previous_event, uintptr_t caller_stream) {
            LowLatencyDispatchArgs a;
            a.x = view_of(x, "x");
            a.topk_idx = view_of(topk_idx, "topk_idx");
            a.num_max_dispatch_tokens_per_rank = tokens;
            a.num_experts = experts;
            a.cumulative_local_expert_recv_stats =
                view_of(recv_stats, "cumulative_local_expert_recv_stats");
            a.dispatch_wait_recv_cost_stats = view_of(wait_stats, "dispatch_wait_recv_cost_stats");
            a.use_fp8 = use_fp8;
            a.round_scale = round_scale;
            a.use_ue8m0 = use_ue8m0;
            a.async_finish = async_finish;
            a.return_recv_hook = return_recv_hook;
            a.previous_event = b.previous_event("low_latency_dispatch", {a.x, a.topk_idx},
                                                std::move(previous_event), caller_stream, true);
            LowLatencyDispatchResult r;
            {
              GilRelease unlocked;
              r = b.get().low_latency_dispatch(a);
            }
            b.join_back(r.event, caller_stream, "low_latency_dispatch");
            const DeviceRelease release = b.release(caller_stream);
            return py::make_tuple(capsule_of(r.recv_x, &release),
                                  capsule_of(r.recv_x_scales, &release),
                                  capsule_of(r.recv_count, &release), py::cast(std::move(r.handle)),
                                  defined_or_none(r.event), defined_or_none(r.hook));
          },
          py::arg("x"), py::arg("topk_idx"), py::arg("num_max_dispatch_tokens_per_rank"),
          py::arg("num_experts"), py::arg("cumulative_local_expert_recv_stats"),
          py::arg("dispatch_wait_recv_cost_stats"), py::arg("use_fp8"), py::arg("round_scale"),
          py::arg("use_ue8m0"), py::arg("async_finish"), py::arg("return_recv_hook"),
          py::arg("previous_event") = nullptr, py::arg("caller_stream") = 0)
      .def(
          "low_latency_combine",
          [](NativeBuffer& b, const py::object& x, const py::object& topk_idx,
             const py::object& topk_weights, const LowLatencyHandle& handle, bool use_logfmt,
             bool zero_copy, bool async_finish, bool return_recv_hook, const py::object& out,
             const py::object& wait_stats, DeviceEventPtr previous_event, uintptr_t caller_stream) {
            LowLatencyCombineArgs a;
            a.x = view_of(x, "x");
            a.topk_idx = view_of(topk_idx, "topk_idx");
            a.topk_weights = view_of(topk_weights, "topk_weights");
            a.handle = &handle;
            a.use_logfmt = use_logfmt;
            a.zero_copy = zero_copy;
            a.async_finish = async_finish;
            a.return_recv_hook = return_recv_hook;
            a.out = view_of(out, "out");
            a.combine_wait_recv_cost_stats = view_of(wait_stats, "combine_wait_recv_cost_stats");
            a.previous_event = b.previous_event("low_latency_combine", {a.x, a.topk_idx},
                                                std::move(previous_event), caller_stream, true);
            LowLatencyCombineResult r;
            {
              GilRelease unlocked;
              r = b.get().low_latency_combine(a);
            }
            b.join_back(r.event, caller_stream, "low_latency_combine");
            const DeviceRelease release = b.release(caller_stream);
            return py::make_tuple(capsule_of(r.combined_x, &release), defined_or_none(r.event),
                                  defined_or_none(r.hook));
          },
          py::arg("x"), py::arg("topk_idx"), py::arg("topk_weights"), py::arg("handle"),
          py::arg("use_logfmt"), py::arg("zero_copy"), py::arg("async_finish"),
          py::arg("return_recv_hook"), py::arg("out"), py::arg("combine_wait_recv_cost_stats"),
          py::arg("previous_event") = nullptr, py::arg("caller_stream") = 0)
      // A handle's tensors as a call hands them to torch: device ones released after the
      // caller's stream (the handle's properties release them on the Buffer's stream only).
      .def(
          "normal_handle_tensors",
          [](NativeBuffer& b, const DispatchHandle& h, uintptr_t caller_stream) {
            const DeviceRelease release = b.release(caller_stream);
            return py::make_tuple(
                capsule_of(h.rank_prefix_matrix, &release), capsule_of(h.recv_src_idx, &release),
                capsule_of(h.is_token_in_rank, &release), capsule_of(h.send_head, &release));
          },
          py::arg("handle"), py::arg("caller_stream") = 0)
      .def(
          "low_latency_handle_tensors",
          [](NativeBuffer& b, const LowLatencyHandle& h, uintptr_t caller_stream) {
            const DeviceRelease release = b.release(caller_stream);
            return py::make_tuple(capsule_of(h.src_info, &release),
                                  capsule_of(h.layout_range, &release));
          },
          py::arg("handle"), py::arg("caller_stream") = 0)
      .def(
          "get_next_low_latency_combine_buffer",
          [](NativeBuffer& b, const LowLatencyHandle& handle) {
            return capsule_of(b.get().get_next_low_latency_combine_buffer(handle));
          },
          py::arg("handle"))
      .def(
          "low_latency_update_mask_buffer",
          [](NativeBuffer& b, int rank, bool mask) {
            b.get().low_latency_update_mask_buffer(rank, mask);
          },
          py::arg("rank_to_mask"), py::arg("mask") = false)
      .def(
          "low_latency_query_mask_buffer",
          [](NativeBuffer& b, const py::object& out) {
            b.get().low_latency_query_mask_buffer(view_of(out, "mask_status"));
          },
          py::arg("mask_status"))
      .def("low_latency_clean_mask_buffer",
           [](NativeBuffer& b) { b.get().low_latency_clean_mask_buffer(); });
}

}  // namespace proxyep::python
