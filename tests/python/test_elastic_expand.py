"""deep_ep.ElasticBuffer's expanded layout (DeepEP V2's ``do_expand``; docs/plans/ELASTIC_BUFFER.md
section 3.1) on CPU tensors: one slot per (received token, local expert), expert e's slots from
the aligned end of expert e - 1's, in source order; worst-case sizes without CPU sync, zero
padding, FP8 scales, cached expanded dispatches, and the expanded combine (each token's slots
summed in lane order, then V2's combine), against a reference computed here from every rank's
inputs gathered over gloo. Run on 2 ranks and 2 nodes of 2 (the reorder shim across nodes)."""

import pytest
import torch

import deep_ep
from test_elastic import E, H, K, T, align, buffer, make_inputs, reference_for, world  # noqa: F401 (fixture)


class Expanded:
    """Where the reference's received pairs go: slot[i][k] for received row i, lane k."""

    def __init__(self, ref, alignment):
        _, R = world()
        local = E // R
        counts = torch.bincount(ref.topk_idx[ref.topk_idx >= 0], minlength=local).tolist()
        self.base, self.psum, end = [], [], 0
        for count in counts:
            self.base.append(align(end, alignment))
            end = self.base[-1] + count
            self.psum.append(end)
        self.slots = align(end, alignment)
        self.worst = align(R * T * min(K, local) + (alignment - 1) * local, alignment)
        next_slot = list(self.base)
        self.slot = torch.full((ref.num_recv, K), -1, dtype=torch.int32)
        for i, lanes in enumerate(ref.topk_idx.tolist()):
            for k, e in enumerate(lanes):
                if e >= 0:
                    self.slot[i, k] = next_slot[e]
                    next_slot[e] += 1
        self.taken = torch.zeros(self.worst, dtype=torch.bool)
        self.taken[self.slot[self.slot >= 0].long()] = True


def check_expanded(got, want_rows, exp, rows, zero_padding):
    """``got`` [rows, ...] holds want_rows[i] at each of row i's slots (and zeros elsewhere)."""
    assert got.shape[0] == rows
    for i in range(exp.slot.shape[0]):
        for slot in exp.slot[i][exp.slot[i] >= 0].tolist():
            assert torch.equal(got[slot], want_rows[i])
    if zero_padding:
        assert not got[~exp.taken[:rows]].view(torch.uint8).any()


CASES = [(fp8, alignment, sync, zero, asynchronous)
         for fp8, alignment, sync, zero, asynchronous in
         [(False, 1, True, False, False), (False, 128, True, True, False), (True, 16, True, True, True),
          (False, 8, False, True, False), (True, 1, False, False, True), (False, 128, False, True, True)]]


@pytest.mark.parametrize("fp8,expert_alignment,do_cpu_sync,do_zero_padding,asynchronous", CASES)
def test_expanded_dispatch(buffer, fp8, expert_alignment, do_cpu_sync, do_zero_padding, asynchronous):
    _, R = world()
    x, topk_idx, weights = make_inputs(70 + CASES.index((fp8, expert_alignment, do_cpu_sync,
                                                         do_zero_padding, asynchronous)))
    data = deep_ep.utils.math.per_token_cast_to_fp8(x) if fp8 else x
    ref = reference_for(data if fp8 else (x,), topk_idx, weights)
    exp = Expanded(ref, expert_alignment)
    rows = exp.slots if do_cpu_sync else exp.worst

    recv, recv_idx, recv_w, handle, event = buffer.dispatch(
        data, topk_idx=topk_idx, topk_weights=weights, num_experts=E, expert_alignment=expert_alignment,
        do_cpu_sync=do_cpu_sync, do_expand=True, do_zero_padding=do_zero_padding,
        async_with_compute_stream=asynchronous)
    assert (event.event is not None) == asynchronous
    if asynchronous:
        event.current_stream_wait()
    assert recv_idx is None and handle.do_expand
    recv_parts = recv if fp8 else (recv,)
    for got, want in zip(recv_parts, ref.rows):
        check_expanded(got.view(torch.uint8) if fp8 else got,
                       want.view(torch.uint8) if fp8 else want, exp, rows, do_zero_padding)
    want_w = torch.zeros(rows)
    valid = exp.slot >= 0
    want_w[exp.slot[valid].long()] = ref.weights[valid]
    assert recv_w.shape == (rows,)
    assert torch.equal(recv_w[exp.taken[:rows]], want_w[exp.taken[:rows]])
    if do_zero_padding:
        assert not recv_w[~exp.taken[:rows]].any()
    # The handle: slots in the metadata, V2's expanded psum, the slot count.
    n = ref.num_recv
    assert torch.equal(handle.recv_src_metadata[:n, 2:], exp.slot)
    assert torch.equal(handle.recv_src_metadata[:n, 0], ref.src_ids.int())
    assert handle.psum_num_recv_tokens_per_expert.tolist() == exp.psum
    assert handle.num_expanded_tokens == rows
    unaligned = handle.num_unaligned_recv_tokens_per_expert.tolist()
    assert [p - b for p, b in zip(exp.psum, exp.base)] == unaligned

    # Cached: the same rows in the same slots.
    cached, cached_idx, cached_w, same, _ = buffer.dispatch(data, handle=handle, do_expand=True,
                                                            do_zero_padding=do_zero_padding)
    assert same is handle and cached_idx is None and cached_w is None
    # With weights (the backward of an expanded combine's weights): one per slot, as fresh.
    _, _, cached_w, _, _ = buffer.dispatch(data, handle=handle, topk_weights=weights, do_expand=True,
                                           do_zero_padding=do_zero_padding)
    assert torch.equal(cached_w[exp.taken[:rows]], recv_w[exp.taken[:rows]])
    for got, want in zip(cached if fp8 else (cached,), recv_parts):
        taken = exp.taken[:rows]
        assert torch.equal(got[taken].view(torch.uint8), want[taken].view(torch.uint8))
        if do_zero_padding:
            assert not got[~taken].view(torch.uint8).any()


def slot_value(src_ids, rank, lane):
    """bf16 [n, H] a rank returns in the slot of lane ``lane`` of these tokens: sums of them
    depend on the order of adding (not small integers)."""
    channels = torch.arange(H, dtype=torch.float64)
    phase = src_ids.double().unsqueeze(1) * 7.31 + rank * 41.7 + lane * 13.3 + channels * 0.53
    return (torch.sin(phase) * 500.0).to(torch.bfloat16)


def lane_weight(src_ids, lane):
    return src_ids.float() * 0.25 + lane


@pytest.mark.parametrize("num_biases", [0, 2])
def test_expanded_combine(buffer, num_biases):
    """Each rank returns one row per slot and a weight per slot: combine folds a token's slots
    (float32, lanes in order, rounded to bf16), then reduces as V2 does (biases first, groups by
    last lane; a node's partial its ranks' folded rows summed and rounded); weights come back as
    each lane's owner returned them."""
    rank, R = world()
    local = E // R
    x, topk_idx, weights = make_inputs(90 + num_biases)
    ref = reference_for((x,), topk_idx, weights)
    exp = Expanded(ref, 4)
    _, _, _, handle, _ = buffer.dispatch(x, topk_idx=topk_idx, topk_weights=weights, num_experts=E,
                                         expert_alignment=4, do_expand=True)
    y = torch.zeros(exp.slots, H, dtype=torch.bfloat16)
    w = torch.zeros(exp.slots)
    for i in range(ref.num_recv):
        for k in range(K):
            slot = int(exp.slot[i, k])
            if slot >= 0:
                y[slot] = slot_value(ref.src_ids[i:i + 1], rank, k)[0]
                w[slot] = lane_weight(ref.src_ids[i:i + 1], k)[0]
    g = torch.Generator().manual_seed(5 + rank)
    biases = [(torch.randn(x.shape[0], H, generator=g) * 100).to(torch.bfloat16) for _ in range(num_biases)]
    combined, combined_w, _ = buffer.combine(y, handle, topk_weights=w, bias=tuple(biases) or None)

    by_node = buffer.get_logical_domain_size()[0] > 1
    rpn = buffer.num_scaleup_ranks
    ids = rank * T + torch.arange(x.shape[0])
    for t, lanes in enumerate(topk_idx.tolist()):
        acc = torch.zeros(H)
        for b in biases:
            acc = acc + b[t].float()
        group_of = (lambda r: r // rpn) if by_node else (lambda r: r)
        last = {}
        for k, e in enumerate(lanes):
            if e >= 0:
                last[group_of(e // local)] = k
        for group in sorted(last, key=last.get):
            partial = torch.zeros(H)
            for r in sorted({e // local for e in lanes if e >= 0 and group_of(e // local) == group}):
                folded = torch.zeros(H)
                for k, e in enumerate(lanes):
                    if e >= 0 and e // local == r:
                        folded = folded + slot_value(ids[t:t + 1], r, k)[0].float()
                partial = partial + folded.to(torch.bfloat16).float()
            if by_node:
                partial = partial.to(torch.bfloat16).float()
            acc = acc + partial
        assert torch.equal(combined[t], acc.to(torch.bfloat16)), f"token {t}"
        want_w = torch.tensor([lane_weight(ids[t:t + 1], k)[0] if e >= 0 else 0.0
                               for k, e in enumerate(lanes)])
        assert torch.equal(combined_w[t], want_w)


def test_expanded_refusals_leave_buffer_usable(buffer):
    rank, _ = world()
    x, topk_idx, weights = make_inputs(99)
    recv, _, recv_w, handle, _ = buffer.dispatch(x, topk_idx=topk_idx, topk_weights=weights,
                                                 num_experts=E, do_expand=True)
    with pytest.raises(ValueError, match="1-D"):
        buffer.combine(recv, handle, topk_weights=torch.zeros(recv.shape[0], K))
    bad = handle.recv_src_metadata.clone()
    bad[0, 2:] = recv.shape[0]  # a slot past the expanded rows
    good, handle.recv_src_metadata = handle.recv_src_metadata, bad
    with pytest.raises(deep_ep.ProxyEPError, match="a slot in"):
        buffer.combine(recv, handle, topk_weights=recv_w)
    with pytest.raises(deep_ep.ProxyEPError, match="a slot in"):
        buffer.dispatch(x, handle=handle, do_expand=True)
    handle.recv_src_metadata = good
    combined, _, _ = buffer.combine(torch.zeros_like(recv), handle, topk_weights=recv_w)
    assert not combined.any()
