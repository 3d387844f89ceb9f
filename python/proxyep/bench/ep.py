"""``python3 -m proxyep.bench ep``: normal-mode dispatch + combine through deep_ep.Buffer.

``--api v2`` also times DeepEP V2's ``deep_ep.ElasticBuffer`` on the same shape and reports
``v2_over_v1``. V2 has no separate layout call (its dispatch computes the layout from
``topk_idx`` each time), so V2 is compared with V1 calls that compute the layout inside the timed
dispatch too (``v1_with_layout``); the plain V1 timing (``proxyep``) computes it once outside
the loop, as the C++ bench does."""

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

    extra = {}
    if getattr(args, "api", "v1") == "v2":
        extra["v1_with_layout"] = _v1_with_layout(args, buffer, x_in, idx_in, weights_in, state)
        extra["v2"] = _v2(args, x_in, idx_in, weights_in, state)
    # All timed from the bootstrap barrier the C++ benches use (same release skew).
    result = time_paths(args, buffer.runtime.barrier, (dispatch, combine), (gloo_dispatch, gloo_combine), extra)
    # Verified: each token comes back as x times the number of ranks it went to, on both paths.
    dest = get(state["d"][4][4 if buffer.num_nodes == 1 else 0]).sum(dim=1, keepdim=True).clamp(min=1)
    diffs = [calc_diff(get(state["c"][0]).float() / dest, x.float())]
    if "gc" in state:
        diffs.append(calc_diff(state["gc"].float() / dest, x.float()))
    if extra:  # V2's combine returns the same sums
        diffs.append(calc_diff(get(state["v2_c"][0]).float() / dest, x.float()))
        result["v2_over_v1"] = {k: result["v2"][k]["us"]["p50"] / result["v1_with_layout"][k]["us"]["p50"]
                                for k in ("dispatch", "combine", "total")}
        # Both APIs ride the same transport: the bytes they put on the fabric per call show it.
        result["fabric_bytes"] = {
            "v1_with_layout": _fabric_bytes(buffer.runtime.stats, *extra["v1_with_layout"]),
            "v2": _fabric_bytes(state["elastic"].runtime.stats, *extra["v2"])}
    result["verified"] = all_ranks_pass(diffs, 1e-5)
    buffer_bytes = {"num_nvl_bytes": nvl, "num_rdma_bytes": rdma}
    if buffer.device is not None:  # proof that the device path ran: what it used, over all ranks
        result["device"] = buffer.device.kind
        stats = buffer.stats()
        result["device_writes"] = sum_over_ranks(stats.sends_to_device_arenas + stats.writes_from_device)
        result["verified"] = result["verified"] and result["device_writes"] > 0
    result.update(buffer_bytes)
    return result


def _fabric_bytes(stats, dispatch, combine):
    """Bytes one (untimed) dispatch and one combine put on the fabric, over all ranks."""
    before = stats().bytes_to_fabric
    dispatch()
    between = stats().bytes_to_fabric
    combine()
    after = stats().bytes_to_fabric
    return {"dispatch": sum_over_ranks(between - before), "combine": sum_over_ranks(after - between)}


def _v1_with_layout(args, buffer, x_in, idx_in, weights_in, state):
    """V1's (dispatch, combine) with the layout computed inside the timed dispatch, as V2's is."""

    def dispatch():
        per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx_in, args.experts)
        state["v1l_d"] = buffer.dispatch(x_in, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
                                         is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                                         topk_idx=idx_in, topk_weights=weights_in)

    def combine():
        buffer.combine(state["v1l_d"][0], state["v1l_d"][4])

    return dispatch, combine


def _v2(args, x_in, idx_in, weights_in, state):
    """(dispatch, combine) through a deep_ep.ElasticBuffer of the same shape (kept in `state`)."""
    R = dist.get_world_size()
    elastic = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=args.tokens, hidden=args.hidden,
                                    num_topk=args.topk, ranks_per_node=args.ranks_per_node or R,
                                    device=getattr(args, "device", "host"))
    state["elastic"] = elastic

    def dispatch():
        recv_x, _, _, handle, _ = elastic.dispatch(x_in, topk_idx=idx_in, topk_weights=weights_in,
                                                   num_experts=args.experts)
        state["v2_d"] = (recv_x, handle)

    def combine():
        state["v2_c"] = elastic.combine(*state["v2_d"])

    return dispatch, combine
