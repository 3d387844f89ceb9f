"""``python3 -m proxyep.bench ll``: low-latency dispatch + combine through deep_ep.Buffer."""

import torch
import torch.distributed as dist

import deep_ep
from proxyep.fp8 import dequantise

from .harness import all_ranks_pass, calc_diff, time_paths
from .workloads import GlooMessages, ll_inputs


def _dequantised(recv, fp8):
    return recv if not fp8 else dequantise(*recv).to(torch.bfloat16)


def body(args):
    rank, R = dist.get_rank(), dist.get_world_size()
    x, topk_idx, topk_weights = ll_inputs(args, rank)
    fp8 = not args.bf16
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(args.tokens, args.hidden, R, args.experts)
    buffer = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True,
                            num_qps_per_rank=args.experts // R)
    state = {}

    def dispatch():
        state["d"] = buffer.low_latency_dispatch(x, topk_idx, args.tokens, args.experts, use_fp8=fp8)

    dispatch()
    expert_out = _dequantised(state["d"][0], fp8)  # untimed, as the C++ bench

    def combine():
        state["c"] = buffer.low_latency_combine(expert_out, topk_idx, topk_weights, state["d"][2])

    gloo = GlooMessages(topk_idx, args.experts, R)

    def gloo_dispatch():
        state["gd"] = gloo.dispatch(x)

    def gloo_combine():
        state["gc"] = gloo.combine(state["gd"], topk_weights)

    # Both timed from the bootstrap barrier the C++ benches use (same release skew).
    result = time_paths(args, buffer.runtime.barrier, (dispatch, combine), (gloo_dispatch, gloo_combine))
    dispatch()
    combine()
    reference = x.float() * (topk_weights * (topk_idx >= 0)).sum(dim=1, keepdim=True)
    diffs = [calc_diff(state["c"][0].float(), reference)]
    if "gc" in state:
        diffs.append(calc_diff(state["gc"].float(), reference))
    result["verified"] = all_ranks_pass(diffs, (9e-4 if fp8 else 1e-5))
    result["num_rdma_bytes"] = hint
    return result
