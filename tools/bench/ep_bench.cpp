#include "tools/bench/ep_bench.hpp"
#include "tools/bench/fabric_bytes.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "gpu_side/device/open_device.hpp"
#include "gpu_side/device/tensor_transfer.hpp"
#include "integrations/buffer.hpp"
#include "tools/bench/ep_check.hpp"
#include "tools/bench/ep_floor.hpp"
#include "tools/bench/ep_phases.hpp"
#include "tools/bench/ep_stats.hpp"
#include "tools/bench/setup_report.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

using Clock = std::chrono::steady_clock;

// What one rank keeps from its run: timings and the last iteration's outputs, to check.
struct RankRun {
  EpRankTimings timings;
  std::optional<uint64_t> reordered;  // BufferStats::reordered_completions (fabric.reorder)
  // The writes each device path made (BufferStats: writes_from_device, sends_to_device_arenas,
  // chunks_from_device_memory): the proof a --device run took it, and which paths (GPUDirect).
  nlohmann::json device_paths;
  EpPhaseTally phases;  // of the timed calls
  DispatchResult fresh;
  DispatchResult cached;
  CombineResult combined;
  nlohmann::json memcpy_floor;   // time_memcpy_floor's figures; null with --no-floor
  CallFabricBytes fabric_bytes;  // one call's bytes to other nodes (fabric_bytes.hpp)
  std::string internode;         // BufferStats::internode: how the run crossed nodes
  StepClock::Steps setup;        // BufferStats::setup_steps: the Buffer's creation
};

// The bytes of this rank's dispatch output rows in the run's row format (FP8: with the scales).
size_t received_bytes(const DispatchResult& d) {
  return d.recv_x.bytes() + (d.recv_x_scales.defined() ? d.recv_x_scales.bytes() : 0);
}

BufferOptions buffer_options(const EpBenchOptions& options, const ep::EpShape& shape) {
  // Combine moves BF16 rows whatever dispatch sent, so the arenas are sized for BF16.
  int64_t hidden_bytes = int64_t{options.workload.hidden} * 2;
  BufferOptions buffer;
  buffer.num_nvl_bytes = Buffer::nvl_bytes_hint(options.workload.tokens, hidden_bytes,
                                                options.workload.topk, shape.num_ranks);
  if (shape.num_nodes() > 1)
    buffer.num_rdma_bytes =
        Buffer::rdma_bytes_hint(options.workload.tokens, hidden_bytes, options.workload.topk,
                                shape.num_ranks, shape.ranks_per_node);
  if (options.nvl_bytes > 0) buffer.num_nvl_bytes = options.nvl_bytes;
  if (options.rdma_bytes > 0 && shape.num_nodes() > 1) buffer.num_rdma_bytes = options.rdma_bytes;
  buffer.ranks_per_node = shape.ranks_per_node;
  return buffer;
}

constexpr auto kStageTimeout = std::chrono::seconds(60);

// A rank's inputs in `device`'s memory (none: as they are), staged before the timed loop.
ep::RankInputs staged_inputs(gpu_side::device::DeviceRuntime* device, const ep::RankInputs& in) {
  if (device == nullptr) return in;
  auto up = [&](const ep::Tensor& t) {
    return gpu_side::device::to_device(*device, t, "bench.ep(inputs)", kStageTimeout);
  };
  return {up(in.x), up(in.x_fp8), up(in.x_scales), up(in.topk_idx), up(in.topk_weights)};
}

// The combine input: each expert's output is its dispatch row (ep_check.hpp), made on the host
// and staged like the inputs for a device run.
ep::Tensor staged_expert_output(gpu_side::device::DeviceRuntime* device, const DispatchResult& d) {
  if (device == nullptr) return expert_output(d.recv_x, d.recv_x_scales);
  auto down = [&](const ep::Tensor& t) {
    return gpu_side::device::to_host(*device, t, "bench.ep(outputs)", kStageTimeout);
  };
  return gpu_side::device::to_device(*device, expert_output(down(d.recv_x), down(d.recv_x_scales)),
                                     "bench.ep(inputs)", kStageTimeout);
}

// After the timed loop: the outputs it checks, copied to the host.
void outputs_to_host(gpu_side::device::DeviceRuntime* device, RankRun& run) {
  if (device == nullptr) return;
  auto down = [&](ep::Tensor& t) {
    t = gpu_side::device::to_host(*device, t, "bench.ep(outputs)", kStageTimeout);
  };
  for (DispatchResult* d : {&run.fresh, &run.cached}) {
    down(d->recv_x);
    down(d->recv_x_scales);
    down(d->recv_topk_idx);
    down(d->recv_topk_weights);
    down(d->handle.recv_src_idx);
  }
  down(run.combined.combined_x);
}

RankRun run_iterations(control::Bootstrap& bootstrap, Buffer& buffer, const ep::RankInputs& raw,
                       const EpBenchOptions& options, gpu_side::device::DeviceRuntime* device) {
  const auto& cli = options.workload;
  const ep::RankInputs in = staged_inputs(device, raw);
  DispatchLayout layout = buffer.get_dispatch_layout(in.topk_idx, cli.experts);
  const DispatchArgs fresh = DispatchArgs::routed(cli.fp8 ? in.x_fp8.ref() : in.x.ref(),
                                                  cli.fp8 ? in.x_scales.ref() : TensorRef{}, layout,
                                                  in.topk_idx.ref(), in.topk_weights.ref());

  // The combine input ("expert output"): the routing is the same every iteration, so the rows
  // received by this first, untimed dispatch stay valid for all of them. It and an untimed
  // combine also give one call's fabric bytes (the same in every iteration).
  RankRun run;
  const uint64_t start_bytes = buffer.stats().bytes_to_fabric;
  DispatchResult first = buffer.dispatch(fresh);
  const uint64_t dispatched_bytes = buffer.stats().bytes_to_fabric;
  ep::Tensor expert_out = staged_expert_output(device, first);
  {
    CombineArgs combine_args;
    combine_args.x = expert_out;
    combine_args.handle = &first.handle;
    (void)buffer.combine(combine_args);
  }
  run.fabric_bytes = {dispatched_bytes - start_bytes,
                      buffer.stats().bytes_to_fabric - dispatched_bytes};

  for (int i = 0; i < cli.warmup + cli.iters; ++i) {
    // Phase snapshots around the timed windows, never inside them (stats() reads every channel).
    const BufferStats before = buffer.stats();
    bootstrap.barrier("bench.ep(iteration)");
    auto t0 = Clock::now();
    DispatchResult d = buffer.dispatch(fresh);
    auto t1 = Clock::now();
    CombineArgs combine_args;
    combine_args.x = expert_out;
    combine_args.handle = &d.handle;
    CombineResult c = buffer.combine(combine_args);
    auto t2 = Clock::now();
    const BufferStats between = buffer.stats();
    bootstrap.barrier("bench.ep(cached)");
    DispatchArgs cached_args;
    cached_args.x = fresh.x;
    cached_args.x_scales = fresh.x_scales;
    cached_args.handle = &d.handle;
    auto t3 = Clock::now();
    DispatchResult cached = buffer.dispatch(cached_args);
    auto t4 = Clock::now();
    const BufferStats after = buffer.stats();
    // Kept until the next iteration's calls are done, in the warm-up too: the timed loop then
    // starts with the outputs' memory in the steady state it keeps (two sets alive during a
    // call), not faulting in a second set in its second iteration.
    run.fresh = std::move(d);
    run.cached = std::move(cached);
    run.combined = std::move(c);
    if (i < cli.warmup) continue;
    add_phase_delta(run.phases.dispatch, before.dispatch_phases, between.dispatch_phases);
    add_phase_delta(run.phases.combine, before.combine_phases, between.combine_phases);
    add_phase_delta(run.phases.cached_dispatch, between.dispatch_phases, after.dispatch_phases);
    run.timings.dispatch.push_back(seconds_between(t0, t1));
    run.timings.combine.push_back(seconds_between(t1, t2));
    run.timings.total.push_back(seconds_between(t0, t2));
    run.timings.cached_dispatch.push_back(seconds_between(t3, t4));
  }
  outputs_to_host(device, run);
  return run;
}

// This rank's outputs against the reference: "" when all match, else the first difference.
std::string check_rank(const RankRun& run, const EpReference& reference) {
  const auto& want = reference.dispatch();
  const auto& d = run.fresh;
  std::string diff =
      compare_dispatch({d.recv_x, d.recv_x_scales, d.recv_topk_idx, d.recv_topk_weights,
                        d.handle.recv_src_idx, &d.num_recv_tokens_per_expert},
                       want);
  if (!diff.empty()) return "dispatch: " + diff;
  DispatchOutputs cached;  // cached mode returns x (and scales) only
  cached.recv_x = run.cached.recv_x;
  cached.recv_x_scales = run.cached.recv_x_scales;
  diff = compare_dispatch(cached, want);
  if (!diff.empty()) return "cached dispatch: " + diff;
  // A hierarchical combine sums each node's rows first (gpu_side/ep/reference.hpp: by_node).
  const auto order =
      run.internode == "hierarchical" ? ep::CombineOrder::by_node : ep::CombineOrder::by_rank;
  diff = compare_tensor(run.combined.combined_x, reference.combine(order).combined_x, "combined_x");
  return diff.empty() ? "" : "combine: " + diff;
}

nlohmann::json rank_report(const RankRun& run, const std::string& diff) {
  nlohmann::json report = {{"dispatch", run.timings.dispatch},
                           {"cached_dispatch", run.timings.cached_dispatch},
                           {"combine", run.timings.combine},
                           {"total", run.timings.total},
                           {"diff", diff},
                           {"phases", phases_json(run.phases)}};
  if (run.reordered) report["reordered_completions"] = *run.reordered;
  report["device_paths"] = run.device_paths;
  if (!run.memcpy_floor.is_null()) report["memcpy_floor"] = run.memcpy_floor;
  report["fabric_bytes"] = to_json(run.fabric_bytes);
  report["internode"] = run.internode;
  report["setup"] = setup_steps_json(run.setup);
  return report;
}

// Rank 0: every rank's report -> the figures.
nlohmann::json summarize(const RankReports& reports, const EpReference& reference,
                         const ep::EpShape& shape) {
  const auto& traffic = reference.traffic();
  bool multi_node = shape.num_nodes() > 1;
  auto rdma = [&](const std::vector<double>& bytes) {
    return multi_node ? bytes : std::vector<double>{};
  };
  nlohmann::json out = {
      {"dispatch", phase_json(slowest_rank(reports, "dispatch"), traffic.dispatch_bytes,
                              rdma(traffic.rdma_dispatch_bytes))},
      {"cached_dispatch", phase_json(slowest_rank(reports, "cached_dispatch"),
                                     traffic.dispatch_bytes, rdma(traffic.rdma_dispatch_bytes))},
      {"combine", phase_json(slowest_rank(reports, "combine"), traffic.combine_bytes,
                             rdma(traffic.rdma_combine_bytes))},
      {"total", phase_json(slowest_rank(reports, "total"), {})}};
  std::vector<nlohmann::json> phases;
  for (const auto& report : reports)
    phases.push_back(report.value("phases", nlohmann::json()));
  out["phases"] = mean_phases(phases);
  if (multi_node)
    out["fabric"] = fabric_bytes_json(
        reports, shape.ranks_per_node, "one row per (token, other node it reaches)",
        traffic.fabric_dispatch_bytes, traffic.fabric_combine_bytes,
        out["dispatch"]["us"]["p50"].get<double>(), out["combine"]["us"]["p50"].get<double>());
  auto floor = memcpy_floor_json(reports, out["total"]["us"]["p50"].get<double>());
  if (!floor.is_null()) out["memcpy_floor"] = std::move(floor);
  out["setup"] = setup_summary(reports);
  add_verdict(out, reports);
  return out;
}

}  // namespace

RankReports gather_reports(control::Bootstrap& bootstrap, const nlohmann::json& mine,
                           const std::string& label) {
  auto text = mine.dump();
  auto all = bootstrap.allgather(
      std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), label);
  RankReports reports;
  if (bootstrap.rank() != 0) return reports;
  for (const auto& bytes : all)
    reports.push_back(nlohmann::json::parse(bytes));
  return reports;
}

nlohmann::json run_normal_mode(control::Bootstrap& bootstrap, const EpBenchOptions& options,
                               const ep::EpShape& shape, const ep::RankInputs& inputs,
                               const std::function<EpReference()>& make_reference) {
  int rank = bootstrap.rank();
  RankRun run;
  BufferOptions sizes = buffer_options(options, shape);
  sizes.device =
      gpu_side::device::open_device(options.device, bootstrap.env().local_rank, "bench.ep");
  {
    Buffer buffer(bootstrap, sizes);
    run = run_iterations(bootstrap, buffer, inputs, options, sizes.device.get());
    const BufferStats stats = buffer.stats();
    run.reordered = stats.reordered_completions;
    run.internode = stats.internode;
    run.setup = stats.setup_steps;
    run.device_paths = {{"writes_from_device", stats.writes_from_device},
                        {"sends_to_device_arenas", stats.sends_to_device_arenas},
                        {"chunks_from_device_memory", stats.chunks_from_device_memory}};
    log::info("bench: normal-mode timed loop done");
    // The Buffer goes before the reference is built: its arenas are the largest allocation.
  }
  // The floor after the Buffer: its proxy threads no longer compete for the cores, and its arenas
  // are freed before the two copies of the received rows are allocated (at the default arena
  // size, the preflight's arena and reference shares cover them: never alive together).
  if (options.floor) {
    run.memcpy_floor = time_memcpy_floor(bootstrap, received_bytes(run.fresh),
                                         options.workload.warmup, options.workload.iters);
    log::info("bench: memcpy floor timed");
  }
  EpReference reference = make_reference();
  std::string diff = check_rank(run, reference);
  log::info("bench: normal-mode outputs checked against the reference");
  if (!diff.empty()) log::error("bench: normal-mode output differs from the reference: {}", diff);

  auto reports = gather_reports(bootstrap, rank_report(run, diff), "bench.ep(results)");
  if (rank != 0) return {};
  // Summed over the ranks: the device's stream handing writes to the proxies (the device route),
  // payloads into device arenas (CUDA IPC; other nodes' with FI_HMEM), chunks written straight
  // from device staging (FI_HMEM).
  nlohmann::json device_paths = {
      {"writes_from_device", 0}, {"sends_to_device_arenas", 0}, {"chunks_from_device_memory", 0}};
  for (const auto& report : reports)
    for (auto& [name, total] : device_paths.items())
      total = total.get<uint64_t>() + report["device_paths"].value(name, uint64_t{0});
  // The writes the device path made (the proof a --device run took it; check_bench_ep.sh).
  const uint64_t device_writes = device_paths["writes_from_device"].get<uint64_t>() +
                                 device_paths["sends_to_device_arenas"].get<uint64_t>();
  return {{"device", options.device},
          {"internode", reports.front().value("internode", std::string("per_rank"))},
          {"device_writes", device_writes},
          {"device_paths", device_paths},
          {"num_nvl_bytes", sizes.num_nvl_bytes},
          {"num_rdma_bytes", sizes.num_rdma_bytes},
          {"traffic", reference.traffic().to_json(shape.num_nodes())},
          {"proxyep", summarize(reports, reference, shape)}};
}

nlohmann::json run_ep_bench(control::Bootstrap& bootstrap, const EpBenchOptions& options) {
  const auto& env = bootstrap.env();
  ep::EpShape shape{env.world_size, env.local_world_size, options.workload.experts};
  validate(options.workload, shape);
  auto workload = to_workload(options.workload, shape);
  ep::RankInputs inputs = ep::make_rank_inputs(workload, bootstrap.rank());
  auto run_as = [&](const std::string& internode) {
    if (!internode.empty()) params::ep_internode.set(internode, config::Source::command_line);
    return run_normal_mode(bootstrap, options, shape, inputs,
                           [&] { return EpReference(workload, bootstrap.rank()); });
  };
  const bool both = options.internode == "both" && shape.num_nodes() > 1;
  nlohmann::json per_rank;
  if (both) per_rank = run_as("per_rank");
  auto normal = run_as(both                          ? "hierarchical"
                       : options.internode == "both" ? ""
                                                     : options.internode);
  if (bootstrap.rank() != 0) return {};
  nlohmann::json out = {{"benchmark", "ep"},
                        {"ranks", shape.num_ranks},
                        {"ranks_per_node", shape.ranks_per_node},
                        {"nodes", shape.num_nodes()},
                        {"workload", to_json(options.workload)}};
  out.update(normal);
  if (both) out["per_rank"] = per_rank["proxyep"];
  return out;
}

}  // namespace proxyep::tools
