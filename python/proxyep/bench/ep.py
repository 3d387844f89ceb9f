"""``python3 -m proxyep.bench ep``: normal-mode dispatch + combine through deep_ep.Buffer."""

import torch.distributed as dist

import deep_ep
import proxyep

from .harness import all_ranks_pass, calc_diff, placement, sum_over_ranks, time_paths
from .workloads import GlooRows, inputs


def body(args):
    rank, R = dist.get_rank(), dist.get_world_size()
    x, topk_idx, topk_weights = inputs(args, rank)
    per_node = args.ranks_per_node or R
    nvl = proxyep.nvl_bytes_hint(args.tokens, args.hidden * 2, args.topk, R)
    rdma = proxyep.rdma_bytes_hint(args.tokens, args.hidden * 2, args.topk, R, per_node) if per_node < R else 0
    buffer = deep_ep.Buffer(dist.group.WORLD, nvl, rdma, device=getattr(args, "device", "host"))
    put, get = placement(buffer)
    # Inputs on the Buffer's device before the timed loop (the gloo baseline keeps host copies).
    x_in, idx_in, weights_in = put(x), put(topk_idx), put(topk_weights)
    state = {}
    # The routing is the same every iteration: its layout is computed once, as the C++ bench does.
    per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx_in, args.experts)

    def dispatch():
        state["d"] = buffer.dispatch(x_in, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
                                     is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                                     topk_idx=idx_in, topk_weights=weights_in)

    def combine():
        state["c"] = buffer.combine(state["d"][0], state["d"][4])

    gloo = GlooRows(topk_idx, args.experts, R)

    def gloo_dispatch():
        state["gd"] = gloo.dispatch(x)

    def gloo_combine():
        state["gc"] = gloo.combine(state["gd"], args.tokens)

    # Both timed from the bootstrap barrier the C++ benches use (same release skew).
    result = time_paths(args, buffer.runtime.barrier, (dispatch, combine), (gloo_dispatch, gloo_combine))
    # Verified: each token comes back as x times the number of ranks it went to, on both paths.
    dest = get(state["d"][4][4 if buffer.num_nodes == 1 else 0]).sum(dim=1, keepdim=True).clamp(min=1)
    diffs = [calc_diff(get(state["c"][0]).float() / dest, x.float())]
    if "gc" in state:
        diffs.append(calc_diff(state["gc"].float() / dest, x.float()))
    result["verified"] = all_ranks_pass(diffs, 1e-5)
    buffer_bytes = {"num_nvl_bytes": nvl, "num_rdma_bytes": rdma}
    if buffer.device is not None:  # proof that the device path ran: what it used, over all ranks
        result["device"] = buffer.device.kind
        stats = buffer.stats()
        result["device_writes"] = sum_over_ranks(stats.sends_to_device_arenas + stats.writes_from_device)
        result["verified"] = result["verified"] and result["device_writes"] > 0
    result.update(buffer_bytes)
    return result
