// proxyep::Buffer, the facade: checks the options, opens the transport session
// (proxy/session/session.hpp) and the host backend, and hands each call to the normal-mode protocol
// (normal/normal_mode.hpp) or the low-latency one (low_latency/low_latency_mode.hpp), which share
// one call sequence.
#include "integrations/buffer.hpp"

#include "common/log.hpp"
#include "common/params.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "integrations/backend/device_backend.hpp"
#include "integrations/backend/host_backend.hpp"
#include "integrations/buffer_metrics.hpp"
#include "integrations/call_sequence.hpp"
#include "integrations/comm_stream.hpp"
#include "integrations/device_calls.hpp"
#include "integrations/device_ll_calls.hpp"
#include "integrations/device_regions.hpp"
#include "integrations/device_steering.hpp"
#include "integrations/low_latency/ll_captured.hpp"
#include "integrations/low_latency/ll_sizes.hpp"
#include "integrations/low_latency/low_latency_mode.hpp"
#include "integrations/normal/landing_zone.hpp"
#include "integrations/normal/normal_mode.hpp"
#include "integrations/session_sizes.hpp"
#include "metrics/metrics_exporter.hpp"
#include "proxy/session/session.hpp"

#include <unistd.h>

#include <atomic>
#include <random>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

namespace {

constexpr const char* kPhase = "buffer";

// The daemon socket of this rank's node: "{node}" in daemon.socket becomes the node's index, so
// emulated nodes on one machine each reach their own daemon.
std::string node_socket(std::string path, int node) {
  const std::string token = "{node}", index = std::to_string(node);
  for (size_t at = path.find(token); at != std::string::npos; at = path.find(token, at))
    path.replace(at, token.size(), index);
  return path;
}

proxy::SessionConfig session_config(const control::Bootstrap& boot, const BufferOptions& opts,
                                    int ranks_per_node) {
  proxy::SessionConfig config;
  config.device = opts.device;  // its stream hands on the writes it fills
  config.sizes = integrations::session_sizes(opts, boot.world_size(), ranks_per_node);
  require(opts.timeout_ms >= 0, kPhase, "timeout_ms must be >= 0 (0: ep.timeout_ms); got {}",
          opts.timeout_ms);
  config.timeout = std::chrono::milliseconds(opts.timeout_ms > 0 ? opts.timeout_ms
                                                                 : params::ep_timeout_ms.get());
  config.tolerate_peer_failures = opts.enable_shrink;
  if (params::proxy_mode.get() == "daemon")
    config.daemon_socket = node_socket(params::daemon_socket.get(), boot.rank() / ranks_per_node);
  return config;
}

// The landing region's size: none for a Buffer without normal-mode calls.
uint64_t landing_bytes(const BufferOptions& opts) {
  return opts.num_nvl_bytes > 0 ? static_cast<uint64_t>(params::ep_landing_bytes.get()) : 0;
}

// `config` with `landing` (may be null) for the fabric to register (ep.landing_fabric).
// Marks the setup step that ends here: the metrics port, host threads and landing region.
proxy::SessionConfig with_landing(proxy::SessionConfig config,
                                  const integrations::normal::LandingZone* landing,
                                  StepClock& setup_clock) {
  setup_clock.mark("landing region");
  config.setup_clock = &setup_clock;
  if (landing != nullptr) {
    config.landing = landing->local();
    config.landing_fd = landing->local_fd();
  }
  config.landing_fabric = params::ep_landing_fabric.get();
  config.send_from_caller = params::ep_send_from_x.get() != "off";
  return config;
}

// The metrics endpoint (metrics.port), or none; `collect` fills a scrape.
std::unique_ptr<metrics::MetricsExporter> start_metrics(control::Bootstrap& boot,
                                                        metrics::MetricsExporter::Collect collect) {
  const int64_t port = params::metrics_port.get();
  if (port < 0) return nullptr;
  const int64_t mine = port == 0 ? 0 : port + boot.env().local_rank;
  require(mine <= 65535, kPhase, "metrics.port {} + LOCAL_RANK {} is not a TCP port", port,
          boot.env().local_rank);
  return metrics::MetricsExporter::start(params::metrics_address.get(), static_cast<int>(mine),
                                         {{"rank", std::to_string(boot.rank())}},
                                         std::move(collect));
}

uint64_t new_buffer_id() {
  std::random_device entropy;
  return (uint64_t{entropy()} << 32) ^ entropy() ^ static_cast<uint64_t>(::getpid());
}

}  // namespace

struct Buffer::Impl {
  Impl(control::Bootstrap& boot, const BufferOptions& opts)
      : bootstrap(boot),
        // First, before this rank meets the others: a port it cannot listen on fails here alone.
        exporter(start_metrics(boot, [this](metrics::MetricsSink& sink) { collect(sink); })),
        options(opts),
        ranks_per_node(opts.ranks_per_node > 0 ? opts.ranks_per_node : boot.env().local_world_size),
        backend(integrations::HostBackend::default_threads(ranks_per_node)),
        config(session_config(boot, opts, ranks_per_node)),
        landing(integrations::normal::LandingZone::open(boot, landing_bytes(opts),
                                                        params::ep_landing_fabric.get(),
                                                        config.sizes.ranks_per_node, kPhase)),
        session(proxy::Session::open(boot, with_landing(config, landing.get(), setup_clock))),
        calls(*session),
        buffer_id(new_buffer_id()),
        mode(*session, backend, calls, stream, buffer_id, landing),
        low_latency(*session, backend, calls, stream, buffer_id, opts.enable_shrink) {
    if (opts.device) {
      device_backend = std::make_unique<integrations::DeviceBackend>(opts.device);
      device_regions =
          std::make_unique<integrations::DeviceRegions>(opts.device, session->row_memory(), kPhase);
      stream.attach_device(opts.device);  // device points for async_finish calls
    }
    setup_clock.mark("modes");
    log::debug("buffer: {}, {} host threads", session->describe(), backend.threads());
    made.store(true, std::memory_order_release);
  }
  // A scrape: nothing until the Buffer is made (the members it reads exist from then on).
  void collect(metrics::MetricsSink& sink) const {
    if (!made.load(std::memory_order_acquire)) return;
    integrations::collect_buffer_metrics(sink, mode.published_stats(), *session);
  }
  // The modes' background work uses everything below the stream: it finishes first.
  ~Impl() {
    exporter.reset();  // no scrape reads the members about to go
    try {
      stream.settle();
    } catch (const std::exception& e) {
      log::warn("buffer: a call finishing in the background failed: {}", e.what());
    }
  }

  // Every call starts here: calls completing in the background finish first (stream order).
  void check_usable(std::string_view phase) {
    require(!destroyed, phase, "the Buffer was destroyed");
    stream.settle();
    mode.check_usable(phase);
  }
  void check_normal(std::string_view phase) {
    check_usable(phase);
    calls.check_can_begin(integrations::CallKind::sync, phase);
    require(!low_latency.any_masked(), phase,
            "ranks are masked (enable_shrink): normal-mode calls need every rank");
    require(options.num_nvl_bytes > 0, phase,
            "this Buffer was made for low-latency calls only (num_nvl_bytes 0)");
  }
  // The device runtime for a call whose tensors are on the device.
  const std::shared_ptr<gpu_side::device::DeviceRuntime>& device(std::string_view phase) {
    require(options.device != nullptr, phase,
            "the call's tensors are device memory but the Buffer was made without a device "
            "(BufferOptions::device)");
    return options.device;
  }
  void check_low_latency(std::string_view phase) {
    check_usable(phase);
    require(options.low_latency_mode, phase,
            "the Buffer was not created with low_latency_mode=True");
  }

  control::Bootstrap& bootstrap;
  StepClock setup_clock;  // the creation's steps (BufferStats::setup_steps), from here
  // The exporter reads the members below on its HTTP thread once `made`; it is stopped first in
  // ~Impl and destroy().
  std::atomic<bool> made{false};
  std::unique_ptr<metrics::MetricsExporter> exporter;
  BufferOptions options;
  int ranks_per_node;
  integrations::HostBackend backend;
  proxy::SessionConfig config;
  // Before the session, which registers it with the fabric, and after it: outputs in it outlive
  // the Buffer.
  std::shared_ptr<integrations::normal::LandingZone> landing;
  std::unique_ptr<proxy::Session> session;
  integrations::CallSequence calls;
  integrations::CommStream stream;  // async_finish calls and hooks' send phases
  uint64_t buffer_id;
  integrations::normal::NormalMode mode;
  integrations::low_latency::LowLatencyMode low_latency;
  std::unique_ptr<integrations::DeviceBackend> device_backend;  // with BufferOptions::device
  std::unique_ptr<integrations::DeviceRegions> device_regions;  // the session's, for its kernels
  integrations::DeviceCombineBuffer device_combine_buffer;      // zero_copy of device calls
  // LL calls captured into a graph (one node): their step memory and steps, kept for the
  // graphs' launches while the Buffer lives.
  integrations::low_latency::CapturedLowLatency captured{bootstrap, *session,
                                                         options.enable_shrink};
  bool destroyed = false;
};

DispatchArgs DispatchArgs::routed(const TensorRef& x, const TensorRef& x_scales,
                                  const DispatchLayout& layout, const TensorRef& topk_idx,
                                  const TensorRef& topk_weights) {
  DispatchArgs args;
  args.x = x;
  args.x_scales = x_scales;
  args.num_tokens_per_rank = layout.num_tokens_per_rank;
  args.num_tokens_per_rdma_rank = layout.num_tokens_per_rdma_rank;  // undefined on one node
  args.is_token_in_rank = layout.is_token_in_rank;
  args.num_tokens_per_expert = layout.num_tokens_per_expert;
  args.topk_idx = topk_idx;
  args.topk_weights = topk_weights;
  return args;
}

Buffer::Buffer(control::Bootstrap& bootstrap, BufferOptions options)
    : impl_(std::make_unique<Impl>(bootstrap, options)) {}

Buffer::~Buffer() {
  if (impl_->destroyed) return;
  // Without destroy() there is no barrier: at least let this rank's last writes (a low-latency
  // call's rows, whose peers may still wait for them) leave before the proxy stops.
  try {
    impl_->stream.settle();
    impl_->session->quiet("buffer teardown");
  } catch (const Error& e) {
    log::warn("buffer: teardown: {}", e.what());
  }
}

int Buffer::rank() const {
  return impl_->session->rank();
}
int Buffer::group_size() const {
  return impl_->session->ranks();
}
int Buffer::metrics_port() const {
  return impl_->exporter ? impl_->exporter->port() : -1;
}
int Buffer::ranks_per_node() const {
  return impl_->ranks_per_node;
}
bool Buffer::hierarchical_internode() const {
  return impl_->session->layout().hierarchical();
}
integrations::RowBackend& Buffer::row_backend(bool on_device, std::string_view phase) {
  impl_->check_usable(phase);
  if (on_device) impl_->device(phase);  // refuses a Buffer without a device
  // An async call's work runs on the CommStream, with the same backend.
  impl_->stream.settle();
  if (on_device) return *impl_->device_backend;
  return impl_->backend;
}
int64_t Buffer::num_nvl_bytes() const {
  return impl_->options.num_nvl_bytes;
}
int64_t Buffer::num_rdma_bytes() const {
  return impl_->options.num_rdma_bytes;
}
bool Buffer::low_latency_mode() const {
  return impl_->options.low_latency_mode;
}
bool Buffer::explicitly_destroy() const {
  return impl_->options.explicitly_destroy;
}

BufferStats Buffer::stats() const {
  impl_->stream.settle();  // calls may still run in the background
  BufferStats stats = impl_->mode.stats();
  stats.calls = stats.dispatch_phases.calls + stats.combine_phases.calls;
  const proxy::Session& session = *impl_->session;
  stats.internode = session.layout().hierarchical() ? "hierarchical" : "per_rank";
  stats.setup_steps = impl_->setup_clock.steps();
  for (int r = 0; r < session.ranks(); ++r) {
    if (r == session.rank()) continue;
    const proxy::PeerChannel& to = session.channel(r);
    (to.path() == proxy::PeerPath::fabric ? stats.bytes_to_fabric : stats.bytes_to_node) +=
        to.bytes_sent();
  }
  stats.writes_from_device = session.writes_from_device();
  stats.chunks_from_device_memory = session.chunks_from_device_memory();
  stats.sends_to_device_arenas = session.sends_to_device_arenas();
  if (auto reorder = session.reorder_stats())
    stats.reordered_completions = reorder->remote_out_of_order + reorder->local_out_of_order;
  return stats;
}

namespace {

// The widest row a call may carry: FP8 scales and weights included, with bf16's bytes.
ep::RowFormat widest_row(int64_t hidden_bytes, int num_topk) {
  ep::RowFormat f;
  f.hidden_bytes = static_cast<uint32_t>(hidden_bytes);
  f.scale_cols = static_cast<uint32_t>((hidden_bytes + 127) / 128);
  f.topk = static_cast<uint32_t>(num_topk);
  f.weights = static_cast<uint32_t>(num_topk);
  f.src_index = 1;
  return f;
}

int64_t round_up_128(uint64_t bytes) {
  return static_cast<int64_t>((bytes + 127) / 128 * 128);
}

}  // namespace

int64_t Buffer::nvl_bytes_hint(int64_t max_tokens_per_rank, int64_t hidden_bytes, int num_topk,
                               int num_ranks) {
  require(max_tokens_per_rank >= 0 && hidden_bytes > 0 && num_topk >= 0 && num_ranks >= 1, kPhase,
          "size hint needs non-negative sizes");
  auto rows = static_cast<uint64_t>(max_tokens_per_rank) * static_cast<uint64_t>(num_ranks);
  return round_up_128(
      ep::RowAreas::bound(std::max<uint64_t>(rows, 1), widest_row(hidden_bytes, num_topk)));
}

int64_t Buffer::rdma_bytes_hint(int64_t max_tokens_per_rank, int64_t hidden_bytes, int num_topk,
                                int num_ranks, int ranks_per_node) {
  require(ranks_per_node >= 1, kPhase, "ranks_per_node must be >= 1");
  int remote = num_ranks - std::min(num_ranks, ranks_per_node);
  if (remote == 0) return 0;
  // Each remote destination gets at most every token, in its own staging block.
  auto f = widest_row(hidden_bytes, num_topk);
  uint64_t per_destination = ep::RowAreas::bound(static_cast<uint64_t>(max_tokens_per_rank), f);
  return round_up_128(per_destination * static_cast<uint64_t>(remote));
}

DispatchLayout Buffer::get_dispatch_layout(
    const TensorRef& topk_idx, int num_experts,
    std::shared_ptr<gpu_side::device::DeviceEvent> previous_event) {
  constexpr const char* kCall = "get_dispatch_layout";
  impl_->check_usable(kCall);
  auto shape = impl_->mode.shape_for(num_experts);
  const bool on_device = topk_idx.device == ep::Device::cuda;
  integrations::require_event_on_device(kCall, on_device, previous_event);
  if (on_device) {
    integrations::order_after(*impl_->device(kCall), previous_event, kCall);
    return impl_->device_backend->layout(topk_idx, shape);
  }
  ep::validate_topk_idx(topk_idx, shape, "get_dispatch_layout");
  return impl_->backend.layout(topk_idx, shape);
}

DispatchResult Buffer::dispatch(const DispatchArgs& args) {
  impl_->check_normal("dispatch");
  const bool on_device = integrations::tensors_on_device(
      "dispatch", {{"x", args.x},
                   {"x_scales", args.x_scales},
                   {"num_tokens_per_rank", args.num_tokens_per_rank},
                   {"num_tokens_per_rdma_rank", args.num_tokens_per_rdma_rank},
                   {"is_token_in_rank", args.is_token_in_rank},
                   {"num_tokens_per_expert", args.num_tokens_per_expert},
                   {"topk_idx", args.topk_idx},
                   {"topk_weights", args.topk_weights}});
  integrations::require_event_on_device("dispatch", on_device, args.previous_event);
  if (!on_device) return impl_->mode.dispatch(args);
  return integrations::dispatch_on_device(impl_->device("dispatch"), *impl_->device_backend,
                                          impl_->mode, args);
}

CombineResult Buffer::combine(const CombineArgs& args) {
  impl_->check_normal("combine");
  const bool on_device =
      integrations::tensors_on_device("combine", {{"x", args.x},
                                                  {"topk_weights", args.topk_weights},
                                                  {"bias0", args.bias0},
                                                  {"bias1", args.bias1}});
  integrations::require_event_on_device("combine", on_device, args.previous_event);
  if (!on_device) return impl_->mode.combine(args);
  return integrations::combine_on_device(impl_->device("combine"), *impl_->device_backend,
                                         impl_->mode, args);
}

int64_t Buffer::get_low_latency_rdma_size_hint(int num_max_dispatch_tokens_per_rank, int hidden,
                                               int num_ranks, int num_experts) {
  const integrations::low_latency::LlShape shape{
      .tokens = num_max_dispatch_tokens_per_rank, .hidden = hidden, .experts = num_experts};
  require(num_ranks >= 1, "get_low_latency_rdma_size_hint", "num_ranks must be >= 1; got {}",
          num_ranks);
  integrations::low_latency::check_shape(shape, num_ranks, "get_low_latency_rdma_size_hint");
  return integrations::low_latency::ll_size_hint(shape, num_ranks);
}

void Buffer::clean_low_latency_buffer(int num_max_dispatch_tokens_per_rank, int hidden,
                                      int num_experts) {
  impl_->check_low_latency("clean_low_latency_buffer");
  impl_->low_latency.clean(
      {.tokens = num_max_dispatch_tokens_per_rank, .hidden = hidden, .experts = num_experts});
}

LowLatencyDispatchResult Buffer::low_latency_dispatch(const LowLatencyDispatchArgs& args) {
  constexpr const char* kCall = "low_latency_dispatch";
  impl_->check_low_latency(kCall);
  const bool on_device = integrations::tensors_on_device(
      kCall, {{"x", args.x},
              {"topk_idx", args.topk_idx},
              {"cumulative_local_expert_recv_stats", args.cumulative_local_expert_recv_stats},
              {"dispatch_wait_recv_cost_stats", args.dispatch_wait_recv_cost_stats}});
  integrations::require_event_on_device(kCall, on_device, args.previous_event);
  if (!on_device) return impl_->low_latency.dispatch(args);
  const auto& device = impl_->device(kCall);
  if (device->capturing() || integrations::captured_point(args.previous_event))
    return impl_->captured.dispatch(device, args);
  return integrations::ll_dispatch_on_device(impl_->device(kCall), *impl_->device_backend,
                                             impl_->low_latency, args);
}

LowLatencyCombineResult Buffer::low_latency_combine(const LowLatencyCombineArgs& args) {
  constexpr const char* kCall = "low_latency_combine";
  impl_->check_low_latency(kCall);
  // With zero_copy, x is ignored (DeepEP callers often pass the combine buffer itself).
  const TensorRef x = args.zero_copy ? TensorRef{} : args.x;
  const bool on_device = integrations::tensors_on_device(
      kCall, {{"x", x},
              {"topk_idx", args.topk_idx},
              {"topk_weights", args.topk_weights},
              {"out", args.out},
              {"combine_wait_recv_cost_stats", args.combine_wait_recv_cost_stats}});
  integrations::require_event_on_device(kCall, on_device, args.previous_event);
  if (args.zero_copy && args.handle != nullptr) {
    const bool buffer_on_device = args.handle->device == ep::Device::cuda;
    require(buffer_on_device == on_device, kCall,
            "zero_copy: the handle came from a dispatch with {} tensors, so its combine buffer "
            "(get_next_low_latency_combine_buffer) is {} memory, but this call's tensors are in {} "
            "memory",
            buffer_on_device ? "device" : "host", buffer_on_device ? "device" : "host",
            on_device ? "device" : "host");
  }
  if (!on_device) return impl_->low_latency.combine(args);
  const auto& device = impl_->device(kCall);
  if (device->capturing() || integrations::captured_point(args.previous_event))
    return impl_->captured.combine(device, args, impl_->device_combine_buffer.current());
  require(args.handle == nullptr || args.handle->captured == nullptr, kCall,
          "the handle came from a captured dispatch: its combine must be captured too (in the "
          "same capture or another on the Buffer's device stream)");
  // With zero_copy the combine checks that the buffer has the handle's shape, as the host path
  // does (a caller who never asked for it gets an error, not a combine of zeros).
  return integrations::ll_combine_on_device(impl_->device(kCall), *impl_->device_backend,
                                            impl_->low_latency, args,
                                            impl_->device_combine_buffer.current());
}

void Buffer::low_latency_update_mask_buffer(int rank_to_mask, bool mask) {
  impl_->check_low_latency("low_latency_update_mask_buffer");
  impl_->low_latency.update_mask(rank_to_mask, mask);
}

void Buffer::low_latency_query_mask_buffer(const TensorRef& mask_status) {
  constexpr const char* kCall = "low_latency_query_mask_buffer";
  impl_->check_low_latency(kCall);
  if (mask_status.device != ep::Device::cuda) return impl_->low_latency.query_mask(mask_status);
  impl_->device(kCall);  // refuses a device tensor when the Buffer has no device
  impl_->low_latency.query_mask(mask_status, impl_->device_backend.get());
}

void Buffer::low_latency_clean_mask_buffer() {
  impl_->check_low_latency("low_latency_clean_mask_buffer");
  impl_->low_latency.clean_mask();
}

Tensor Buffer::get_next_low_latency_combine_buffer(const LowLatencyHandle& handle) {
  constexpr const char* kCall = "get_next_low_latency_combine_buffer";
  impl_->check_low_latency(kCall);
  if (handle.device != ep::Device::cuda) return impl_->low_latency.next_combine_buffer(handle);
  return impl_->device_combine_buffer.get(impl_->device(kCall),
                                          handle.captured != nullptr
                                              ? impl_->captured.combine_buffer_shape(handle)
                                              : impl_->low_latency.combine_buffer_shape(handle));
}

std::span<std::byte> Buffer::local_buffer(bool use_rdma_buffer) {
  constexpr const char* kLocalPhase = "get_local_buffer_tensor";
  require(!impl_->destroyed, kLocalPhase, "the Buffer was destroyed");
  if (!use_rdma_buffer) {
    require(impl_->options.num_nvl_bytes > 0, kLocalPhase, "the Buffer has no NVL bytes");
    return impl_->session->data_area();
  }
  const std::span<std::byte> staging = impl_->session->staging_data_area();
  require(!staging.empty(), kLocalPhase,
          "the Buffer has no RDMA buffer: rows are staged only for peers on other nodes (the "
          "group has one node, or num_rdma_bytes or num_nvl_bytes is 0)");
  return staging;
}

void Buffer::destroy() {
  if (impl_->destroyed) return;
  impl_->stream.settle();
  // Releases of the last low-latency calls must land before a peer may leave.
  impl_->session->quiet("destroy");
  impl_->bootstrap.barrier("buffer(destroy)");
  impl_->destroyed = true;
  impl_->exporter.reset();
  impl_->session->stop();
}

}  // namespace proxyep
