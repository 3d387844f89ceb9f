"""Reference dispatch and combine for DeepEP V2's ElasticBuffer (docs/plans/ELASTIC_BUFFER.md,
sections 1.5 and 2), on CPU tensors over the default gloo group. Written from the plan, not from
the runtime: every rank's inputs travel by ``all_to_all_single`` and the expected outputs are
computed here, so a Buffer bug cannot hide in a shared helper.

- ``dispatch``: what a rank receives in the non-expanded layout, sorted by global source id
  (``src_rank * num_max_tokens_per_rank + src_token``), as DeepEP's reference returns it.
- ``pre_combine_data``: a deterministic ``[n, K, H]`` BF16 pattern per (global source id, lane),
  so a rank can make the rows it returns for tokens it received and the sender can predict them;
  its sums depend on their order (a reduce order bug shows).
- ``ordered_accumulate``: a float32 sum over lanes in lane order, rounded to BF16 once.
- ``combine``: V2's reduce (section 2): biases first, then one partial per group in the order of
  the group's last top-k lane; ``order="ascending"`` gives ProxyEP V1's order instead (groups by
  ascending rank or node, biases last by rank), which the adapted test names when a combine
  matches it (a V1-order regression).
"""

import math

import torch
import torch.distributed as dist


def _exchange(tensors, send_counts, recv_counts):
    """Each tensor's rows to the ranks, ``send_counts[r]`` rows to rank r (in order), in one gloo
    ``all_to_all_single`` (few collectives: 4 ranks share 2 cores): a row's bytes of every tensor
    side by side, split again on arrival, so any dtype (BF16, FP8 codes) arrives bit for bit."""
    received = sum(recv_counts)
    flat = [t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous().view(torch.uint8) for t in tensors]
    widths = [f.shape[1] for f in flat]
    out = torch.empty((received, sum(widths)), dtype=torch.uint8)
    dist.all_to_all_single(out, torch.cat(flat, dim=1), recv_counts, send_counts)
    result, at = [], 0
    for t, width in zip(tensors, widths):
        part = out[:, at:at + width].contiguous().view(t.dtype)
        result.append(part.view((received,) + tuple(t.shape[1:])))
        at += width
    return result


def dispatch(x, topk_idx, topk_weights, num_max_tokens_per_rank, num_experts):
    """Non-expanded dispatch of this rank's ``x`` (BF16 ``[N, H]`` or ``(fp8, scales)``) by
    ``topk_idx`` ``[N, K]`` (-1: no expert). Returns ``(recv_x, recv_topk_idx, recv_topk_weights,
    recv_src_ids, num_recv_per_rank)``: rows from each source rank in rank order, a source's tokens
    in token order (a token once per destination rank); local expert ids with -1 for experts on
    other ranks; the sender's weights unmasked (the test masks them); i64 global source ids; the
    per-source row counts as a list."""
    rank, num_ranks = dist.get_rank(), dist.get_world_size()
    local = num_experts // num_ranks
    parts = list(x) if isinstance(x, tuple) else [x]
    dest = torch.where(topk_idx >= 0, topk_idx // local, torch.full_like(topk_idx, -1))
    chosen = [torch.nonzero((dest == r).any(dim=1)).flatten() for r in range(num_ranks)]
    send_counts = [len(c) for c in chosen]
    counts = torch.tensor(send_counts, dtype=torch.int64)
    recv_counts_t = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts_t, counts)
    recv_counts = recv_counts_t.tolist()
    order = torch.cat(chosen)
    src_ids = order + rank * num_max_tokens_per_rank

    *recv_parts, recv_idx, recv_weights, recv_src_ids = _exchange(
        [p[order] for p in parts] + [topk_idx[order], topk_weights[order], src_ids],
        send_counts, recv_counts)
    mine = (recv_idx >= rank * local) & (recv_idx < (rank + 1) * local)
    recv_idx = torch.where(mine, recv_idx - rank * local, torch.full_like(recv_idx, -1))
    recv_x = tuple(recv_parts) if isinstance(x, tuple) else recv_parts[0]
    return recv_x, recv_idx, recv_weights, recv_src_ids, recv_counts


def _mix(key):
    """A 32-bit integer hash of i64 ``key`` (multiply, xor-shift, twice): every output bit depends
    on every input bit, unlike a bare multiply, whose low bits see only the key's low bits."""
    h = key * 2654435761 % (1 << 32)
    h = h ^ (h >> 15)
    h = h * 2246822519 % (1 << 32)
    return h ^ (h >> 13)


def pre_combine_data(src_ids, num_topk, hidden):
    """BF16 ``[n, K, H]``: the value a rank's expert k produces for the token of each global source
    id, a pure function of (id, k, channel), built so that the order of a reduction shows in the
    bits. Half the values are +-B, B a power of two in 2^24..2^27 that depends on (id, channel)
    only, so that lanes cancel; the others are small, mantissa in [-1, 1) times 2^(-6..6). A small
    value added to an uncancelled B is rounded off in float32, and the result is small once the
    Bs cancel, so which partial comes first changes the BF16 result (DeepEP's sines are of one
    size: their float32 sums round the same in any order and would hide a wrong order)."""
    lanes = torch.arange(num_topk).view(1, -1, 1)
    channels = torch.arange(hidden).view(1, 1, -1)
    ids = src_ids.long().view(-1, 1, 1)
    h = _mix((ids * num_topk + lanes) * hidden + channels)
    small = ((h % (1 << 16)).float() / (1 << 15) - 1.0) * torch.pow(2.0, ((h >> 16) % 13).float() - 6)
    big = torch.pow(2.0, 24 + (_mix(ids * hidden + channels + (1 << 40)) % 4).float())
    sign = torch.where((h >> 25) % 2 == 1, 1.0, -1.0)
    return torch.where((h >> 24) % 2 == 1, sign * big, small).to(torch.bfloat16)


def ordered_accumulate(data, initial=None):
    """``[n, K, H]`` -> BF16 ``[n, H]``: float32 ``initial`` (or 0), then each lane in lane order
    added in float32, rounded to BF16 once at the end."""
    acc = torch.zeros((data.shape[0], data.shape[2]), dtype=torch.float32) if initial is None \
        else initial.float().clone()
    for k in range(data.shape[1]):
        acc += data[:, k].float()
    return acc.to(torch.bfloat16)


def _group_partials(values, group, order):
    """One level of reduction. ``values`` ``[n, K, H]`` BF16 (a lane holds its contribution or
    zero), ``group`` ``[n, K]`` (-1: none). Returns ``[n, K, H]`` BF16 holding each group's
    partial, ``bf16(0 + its lanes' values)``, at one lane of the group and zero elsewhere; the
    partials are later summed in lane order, so the lane chosen decides the order of the groups.
    ``order="last_lane"`` (V2): the group's members in lane order, the partial at its last lane.
    ``order="ascending"`` (ProxyEP V1's by_rank / by_node): the token's distinct groups in
    ascending order, their partials at lanes 0, 1, ... (``_regroup`` says which group each lane
    now holds)."""
    n, num_topk, hidden = values.shape
    out = torch.zeros_like(values)
    valid = group >= 0
    if order == "last_lane":
        for k in range(num_topk):
            same = (group == group[:, k:k + 1]) & valid
            later = same[:, k + 1:].any(dim=1)
            acc = torch.zeros((n, hidden), dtype=torch.float32)
            for j in range(k + 1):
                acc += torch.where(same[:, j:j + 1], values[:, j].float(), torch.zeros(()))
            keep = (valid[:, k] & ~later).view(n, 1)
            out[:, k] = torch.where(keep, acc.to(torch.bfloat16), torch.zeros((), dtype=torch.bfloat16))
        return out
    assert order == "ascending", order
    # The token's distinct groups, ascending, each summed in lane order, placed at slots 0, 1, ...
    big = int(group.max()) + 1 if group.numel() else 1
    keyed = torch.where(valid, group, torch.full_like(group, big))
    ranked = keyed.sort(dim=1).values
    for slot in range(num_topk):
        g = ranked[:, slot:slot + 1]
        first = torch.ones(n, dtype=torch.bool) if slot == 0 else ranked[:, slot] != ranked[:, slot - 1]
        acc = torch.zeros((n, hidden), dtype=torch.float32)
        for j in range(num_topk):
            member = (group[:, j:j + 1] == g) & valid[:, j:j + 1]
            acc += torch.where(member, values[:, j].float(), torch.zeros(()))
        keep = (first & (ranked[:, slot] < big)).view(n, 1)
        out[:, slot] = torch.where(keep, acc.to(torch.bfloat16), torch.zeros((), dtype=torch.bfloat16))
    return out


def _regroup(group, order):
    """The group of each lane after ``_group_partials`` placed the partials: for V2 the lanes
    keep their groups (the partial sits at one of them, zeros at the others); for the ascending
    order lane s holds the token's s-th smallest group, -1 past its last."""
    if order == "last_lane":
        return group
    big = int(group.max()) + 1 if group.numel() else 1
    ranked = torch.where(group >= 0, group, torch.full_like(group, big)).sort(dim=1).values
    first = torch.ones_like(ranked, dtype=torch.bool)
    first[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    return torch.where(first & (ranked < big), ranked, torch.full_like(ranked, -1))


def combine(y, topk_idx, num_scaleout_ranks, num_scaleup_ranks, num_experts, bias,
            reduce_in_rank, reduce_in_scaleup, order="last_lane"):
    """BF16 ``[N, H]``: this rank's tokens combined from ``y`` ``[N, K, H]`` (lane k's expert
    output, zero for -1 lanes), section 2's recipe. ``reduce_in_rank``: each rank's lanes are
    first reduced to a BF16 partial (non-expanded layout, or expanded with multiple reduction);
    ``reduce_in_scaleup``: then each scale-up domain's rank partials to a BF16 node partial (hybrid
    mode across nodes). The float32 accumulator starts at ``b0 + b1`` (a missing bias is 0) and
    adds the remaining partials in lane order. ``order`` as in ``_group_partials``; with
    ``"ascending"`` and no scale-up stage the biases come last, one by one (V1's by_rank order,
    which ``test_deepep_v2_ep`` names when a combine matches it rather than V2's)."""
    assert reduce_in_rank or not reduce_in_scaleup
    num_ranks = num_scaleout_ranks * num_scaleup_ranks
    local = num_experts // num_ranks
    values = y.clone()
    values[topk_idx < 0] = 0
    none = torch.full_like(topk_idx, -1)
    group = torch.where(topk_idx >= 0, topk_idx // local, none)
    if reduce_in_rank:
        values = _group_partials(values, group, order)
        group = _regroup(group, order)
    if reduce_in_scaleup:
        node = torch.where(group >= 0, group // num_scaleup_ranks, none)
        values = _group_partials(values, node, order)
        group = _regroup(node, order)
    if isinstance(bias, tuple):
        initial = bias[0].float() + bias[1].float()
    else:
        initial = bias.float() if bias is not None else None
    if order == "ascending" and not reduce_in_scaleup and bias is not None:
        # V1's by_rank (gpu_side/ep/row_rules.hpp): 0 + the ranks' rows ascending + b0 + b1.
        acc = torch.zeros_like(values[:, 0], dtype=torch.float32)
        for k in range(values.shape[1]):
            acc += values[:, k].float()
        for b in (bias if isinstance(bias, tuple) else (bias,)):
            acc += b.float()
        return acc.to(torch.bfloat16)
    return ordered_accumulate(values, initial)
