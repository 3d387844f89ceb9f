"""deep_ep.ElasticBuffer (DeepEP 2.1's V2 API; docs/plans/ELASTIC_BUFFER.md) on CPU tensors: the
module layout, construction, size hints, domain sizes, stand-ins, capture/barrier/stream/destroy,
every refusal leaving the Buffer usable, a V1 Buffer beside it, the non-expanded dispatch and
combine (fresh and cached, BF16 and FP8, with and without CPU sync, async, alignments 1 and 128)
with their EPHandle fields, and combine in V2's order (biases first, groups by last top-k lane,
weights from their owner) in hybrid and direct mode, against a reference computed here from every
rank's inputs gathered over gloo. Run on 2 ranks, 2 nodes of 2, and 2 nodes of 1."""

import os
import time

import pytest
import torch
import torch.distributed as dist

import deep_ep
from conftest import per_token_cast_to_fp8 as reference_cast_to_fp8
from conftest import elastic_buffer, ranks_per_node

T, H, K, E = 64, 256, 4, 16  # T: num_max_tokens_per_rank; a rank has T - rank tokens


def world():
    return dist.get_rank(), dist.get_world_size()


def align(x, a):
    return (x + a - 1) // a * a


# ---- inputs and the reference, independent of the Buffer ----

def make_inputs(seed):
    rank, _ = world()
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    n = T - rank
    x = torch.randn(n, H, generator=g).to(torch.bfloat16)
    scores = torch.rand(n, E, generator=g)
    topk_idx = torch.topk(scores, K, dim=1).indices
    topk_idx[torch.rand(n, K, generator=g) < 0.1] = -1  # some lanes select nothing
    topk_idx[0] = -1  # a token that goes nowhere
    weights = torch.rand(n, K, generator=g)
    return x, topk_idx, weights


def gather(t):
    """Every rank's ``t`` (rows may differ by rank), over gloo: padded to T rows, then cut."""
    _, R = world()
    count = torch.tensor([t.shape[0]])
    counts = [torch.zeros_like(count) for _ in range(R)]
    dist.all_gather(counts, count)
    as_f32 = t.dtype == torch.bfloat16  # exact in float32, which gloo moves
    send = t.float() if as_f32 else t
    padded = torch.zeros((T,) + tuple(send.shape[1:]), dtype=send.dtype)
    padded[:t.shape[0]] = send
    out = [torch.empty_like(padded) for _ in range(R)]
    dist.all_gather(out, padded)
    return [(o.to(torch.bfloat16) if as_f32 else o)[:int(c)] for o, c in zip(out, counts)]


class Reference:
    """What this rank receives: from each source rank in order, its tokens in order that select
    an expert of this rank; local expert ids (-1 elsewhere), weights zeroed elsewhere."""

    def __init__(self, rows_of_sources, topk_of_sources, weights_of_sources):
        rank, R = world()
        local = E // R
        rows, idx, weights, ids, self.per_source = [], [], [], [], []
        for s, (src_idx, src_w) in enumerate(zip(topk_of_sources, weights_of_sources)):
            owned = (src_idx >= rank * local) & (src_idx < (rank + 1) * local)
            chosen = owned.any(dim=1)
            rows.append([r[chosen] for r in rows_of_sources[s]])
            idx.append(torch.where(owned, src_idx - rank * local, torch.full_like(src_idx, -1))[chosen])
            weights.append(torch.where(owned, src_w, torch.zeros_like(src_w))[chosen])
            ids.append(s * T + torch.nonzero(chosen).flatten())
            self.per_source.append(int(chosen.sum()))
        self.rows = [torch.cat(parts) for parts in zip(*rows)]
        self.topk_idx = torch.cat(idx)
        self.weights = torch.cat(weights)
        self.src_ids = torch.cat(ids)
        self.num_recv = len(self.src_ids)
        flat = self.topk_idx[self.topk_idx >= 0]
        self.per_expert = torch.bincount(flat, minlength=local)


def reference_for(x_parts, topk_idx, weights):
    """The Reference of these inputs (``x_parts``: x, or FP8 data and scales)."""
    gathered = [gather(p.view(torch.uint8) if p.dtype not in (torch.bfloat16, torch.float32) else p)
                for p in x_parts]
    return Reference(list(zip(*gathered)), gather(topk_idx), gather(weights))


def combine_row(src_ids, rank):
    """bf16 [n, H] a rank returns for the rows of these source ids: small integers, so any
    order of summing them in float32 is exact and the combined value is known bit for bit."""
    channels = torch.arange(H)
    return ((src_ids.unsqueeze(1) * 3 + rank * 5 + channels) % 17 - 8).to(torch.bfloat16)


def expected_combined(topk_idx):
    """bf16 [N, H]: each token's rows from the ranks it reached, summed."""
    rank, R = world()
    ids = rank * T + torch.arange(topk_idx.shape[0])
    out = torch.zeros(topk_idx.shape[0], H, dtype=torch.float32)
    for r in range(R):
        reached = ((topk_idx >= 0) & (topk_idx // (E // R) == r)).any(dim=1)
        out += torch.where(reached.unsqueeze(1), combine_row(ids, r).float(), torch.zeros(()))
    return out.to(torch.bfloat16)


# ---- fixtures ----

@pytest.fixture(scope="module")
def buffer():
    with elastic_buffer(num_max_tokens_per_rank=T, hidden=H, num_topk=K) as buf:
        yield buf


def round_trip(buf, seed=9):
    """A fresh dispatch and a combine, checked: the Buffer works."""
    rank, _ = world()
    x, topk_idx, weights = make_inputs(seed)
    recv_x, _, recv_w, handle, _ = buf.dispatch(x, topk_idx=topk_idx, topk_weights=weights, num_experts=E)
    ref = reference_for((x,), topk_idx, weights)
    assert torch.equal(recv_x, ref.rows[0])
    combined, _, _ = buf.combine(combine_row(ref.src_ids, rank), handle, topk_weights=recv_w)
    assert torch.equal(combined, expected_combined(topk_idx))


# ---- layout, construction, sizes, domains ----

def test_module_layout():
    import deep_ep.buffer
    import deep_ep.buffers.elastic
    import deep_ep.buffers.legacy
    import deep_ep.utils.envs
    import deep_ep.utils.event
    import deep_ep.utils.math
    import deep_ep_cpp
    from deep_ep.utils import EventHandle, EventOverlap, cuda_available

    assert deep_ep.ElasticBuffer is deep_ep.buffers.elastic.ElasticBuffer
    assert deep_ep.EPHandle is deep_ep.buffers.elastic.EPHandle
    assert deep_ep.Buffer is deep_ep.buffers.legacy.Buffer is deep_ep.buffer.Buffer is deep_ep_cpp.Buffer
    assert EventHandle is deep_ep.EventHandle and EventOverlap is deep_ep.EventOverlap
    assert deep_ep.utils.event.EventOverlap is EventOverlap and callable(cuda_available)
    assert deep_ep.get_physical_domain_size is deep_ep.utils.envs.get_physical_domain_size
    assert deep_ep.get_logical_domain_size is deep_ep.utils.envs.get_logical_domain_size
    assert deep_ep.topk_idx_t is torch.int64
    # Code checks it to pick the V2 API.
    assert deep_ep.__version__ == "2.1.0"


def test_math_helpers():
    from deep_ep.utils.math import align as dm_align
    from deep_ep.utils.math import ceil_div, per_token_cast_back, per_token_cast_to_fp8

    assert (dm_align(129, 128), dm_align(128, 128), ceil_div(129, 128), ceil_div(0, 4)) == (256, 128, 2, 0)
    x = (torch.randn(7, 384) * 5).to(torch.bfloat16)
    data, scales = per_token_cast_to_fp8(x)
    ref_data, ref_scales = reference_cast_to_fp8(x)
    assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8))
    # amax / 448 here (DeepEP's utils), amax * (1 / 448) in conftest (DeepEP's kernel): last bit.
    assert torch.allclose(scales, ref_scales, rtol=1e-6, atol=0)
    back = per_token_cast_back(data, scales).float()
    assert ((back - x.float()).abs() <= x.float().abs() / 8 + 1e-3).all()  # e4m3: 3 mantissa bits
    # Packed UE8M0 scales: a byte per 128 channels, 2^(byte - 127).
    packed = torch.tensor([[127, 128, 126, 129]], dtype=torch.uint8).view(torch.int32)
    ones = torch.full((1, 512), 0x38, dtype=torch.uint8)  # e4m3 1.0
    assert per_token_cast_back(ones, packed)[0, ::128].tolist() == [1.0, 2.0, 0.5, 4.0]


def test_domain_sizes(buffer):
    rank, R = world()
    rpn = ranks_per_node()
    nodes = R // rpn
    group = dist.group.WORLD
    assert deep_ep.get_physical_domain_size(group) == (nodes, rpn)
    hybrid = (nodes, rpn) if nodes > 1 else (1, R)
    assert deep_ep.get_logical_domain_size(group) == hybrid
    assert deep_ep.get_logical_domain_size(group, allow_hybrid_mode=False) == (1, R)
    assert buffer.get_physical_domain_size() == (buffer.num_rdma_ranks, buffer.num_nvlink_ranks) == (nodes, rpn)
    assert buffer.get_logical_domain_size() == (buffer.num_scaleout_ranks, buffer.num_scaleup_ranks) == hybrid
    assert buffer.scaleout_rank_idx == rank // hybrid[1]
    assert buffer.scaleup_rank_idx == rank % hybrid[1]
    assert (buffer.rank_idx, buffer.num_ranks, buffer.group) == (rank, R, group)


def test_construction_from_settings_and_bytes(buffer):
    hint = deep_ep.ElasticBuffer.get_buffer_size_hint(dist.group.WORLD, T, H, K)
    assert buffer.num_bytes == hint and hint % (2 << 20) == 0 and hint > 0
    assert deep_ep.ElasticBuffer.get_buffer_size_hint(dist.group.WORLD, 64 * T, H, K) > hint
    assert deep_ep.ElasticBuffer.get_buffer_size_hint(
        dist.group.WORLD, 64 * T, H, K, use_fp8_dispatch=True) < deep_ep.ElasticBuffer.get_buffer_size_hint(
        dist.group.WORLD, 64 * T, H, K)
    # num_topk=0 assumes DeepEP's 32.
    assert deep_ep.ElasticBuffer.get_buffer_size_hint(dist.group.WORLD, 64 * T, H) == \
        deep_ep.ElasticBuffer.get_buffer_size_hint(dist.group.WORLD, 64 * T, H, 32)
    assert (buffer.num_max_tokens_per_rank, buffer.num_allocated_qps) == (T, 129)
    assert (buffer.allow_hybrid_mode, buffer.allow_multiple_reduction, buffer.deterministic) == (True, True, False)
    assert buffer.runtime is not None and buffer.nccl_comm_handle is None
    assert (buffer.sl_idx, buffer.num_cpu_timeout_secs, buffer.num_gpu_timeout_secs) == (3, 300, 100)

    other = deep_ep.ElasticBuffer(dist.group.WORLD, num_bytes=3 << 20, allow_hybrid_mode=False,
                                  deterministic=True, explicitly_destroy=True)
    try:
        assert other.num_bytes == 4 << 20  # rounded up to DeepEP's 2 MiB alignment
        assert other.num_allocated_qps == 17
        assert other.get_logical_domain_size() == (1, dist.get_world_size())
        assert other.num_max_tokens_per_rank == 0
        with pytest.raises(ValueError, match="num_max_tokens_per_rank must be given"):
            x, topk_idx, _ = make_inputs(1)
            other.dispatch(x, topk_idx=topk_idx, num_experts=E)
        x, topk_idx, weights = make_inputs(1)
        recv_x, _, _, handle, _ = other.dispatch(x, topk_idx=topk_idx, num_experts=E, num_max_tokens_per_rank=T)
        assert torch.equal(recv_x, reference_for((x,), topk_idx, weights).rows[0])
        assert handle.psum_num_recv_tokens_per_scaleup_rank.shape == (dist.get_world_size(),)
        # DeepEP's direct mode is our per_rank internode, whatever ep.internode says.
        assert other.runtime.stats().internode == "per_rank"
    finally:
        other.destroy()
    # Hybrid mode (the default) is hierarchical internode where there are several nodes of
    # several ranks (2 nodes x 2 here), per_rank elsewhere.
    R, rpn = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    assert buffer.runtime.stats().internode == ("hierarchical" if 1 < rpn < R else "per_rank")
    with pytest.raises(deep_ep.ProxyEPError, match="destroyed"):
        other.dispatch(x, topk_idx=topk_idx, num_experts=E)
    with pytest.raises(deep_ep.ProxyEPError, match="destroyed"):
        other.barrier()
    other.destroy()  # a second destroy is harmless


def test_static_size_hints():
    mib2 = 2 << 20
    # Entries padded to 32 bytes, each part aligned to 2 MiB.
    assert deep_ep.ElasticBuffer.get_engram_storage_size_hint(100000, 7000, 512) == (
        align(align(7000 * 2, 32) * 512, mib2), align(align(7000 * 2, 32) * 100000, mib2))
    assert deep_ep.ElasticBuffer.get_engram_storage_size_hint(10, 100, 4, dtype=torch.float32)[1] == mib2
    assert deep_ep.ElasticBuffer.get_pp_buffer_size_hint(1000, 3) == mib2
    assert deep_ep.ElasticBuffer.get_pp_buffer_size_hint(1 << 20, 2) == align((1 << 20) * 8, mib2)
    R = dist.get_world_size()
    assert deep_ep.ElasticBuffer.get_agrs_num_max_session_bytes(dist.group.WORLD, (3, 5), torch.bfloat16) == \
        align(R * 15 * 2, 32)
    assert deep_ep.ElasticBuffer.get_agrs_num_max_session_bytes(
        dist.group.WORLD, [(3, 5), (2,)], torch.float32) == align(R * 60, 32) + align(R * 8, 32)
    assert deep_ep.ElasticBuffer.get_agrs_buffer_size_hint(dist.group.WORLD, 1) == mib2


def test_stand_ins(buffer):
    num_sms = buffer.get_theoretical_num_sms(E, K)
    assert num_sms == deep_ep.Buffer.num_sms == 20
    assert buffer.get_theoretical_num_sms(E, K) == num_sms  # cached
    buffer.prefer_overlap_with_compute = False
    try:
        assert buffer.get_theoretical_num_sms(2 * E, K) == 64
    finally:
        buffer.prefer_overlap_with_compute = True
    assert buffer.get_theoretical_num_qps(20) == min(20 * 16 + 1, 129)  # hybrid: capped
    assert buffer.get_theoretical_num_qps(2) == 33
    buffer.allow_hybrid_mode = False
    try:
        assert buffer.get_theoretical_num_qps(20) == 9  # direct: at most 8 + 1
        assert buffer.get_theoretical_num_qps(4) == 4
    finally:
        buffer.allow_hybrid_mode = True
    with pytest.raises(AssertionError):
        buffer.get_theoretical_num_sms(E, K, num_scaleout_topk=1)


def test_capture_barrier_stream(buffer):
    event = buffer.capture()
    assert isinstance(event, deep_ep.EventHandle) and event.is_complete()
    buffer.barrier()
    buffer.barrier(use_comm_stream=False, with_cpu_sync=True, sequential=False)
    assert buffer.get_comm_stream() is None  # CPU tensors: no streams


def test_event_overlap_hook():
    calls = []
    event = deep_ep.EventOverlap(deep_ep.EventHandle())
    event.register_hook_after_wait(lambda: calls.append(1))
    with pytest.raises(AssertionError, match="already registered"):
        event.register_hook_after_wait(lambda: calls.append(2))
    event.current_stream_wait()
    event.current_stream_wait()  # the hook runs once
    assert calls == [1]
    with event(release_handle=True):
        pass
    assert event.event is None  # released on exit
    with deep_ep.EventOverlap(deep_ep.EventHandle()) as kept:
        pass
    assert kept.event is not None


# ---- refusals: each before anything is sent, the Buffer usable after ----

def test_refused_features(buffer):
    refused = {
        "engram_write": (torch.zeros(1, H),), "engram_fetch": (torch.zeros(1, 1, dtype=torch.int32),),
        "pp_set_config": (1024, 2), "pp_send": (torch.zeros(4), 0), "pp_recv": (torch.zeros(4), 0),
        "create_agrs_session": (), "destroy_agrs_session": (), "agrs_set_config": (1024, 2),
        "agrs_get_inplace_tensor": ((2, 2), torch.float32), "all_gather": (torch.zeros(4),),
        "agrs_new_session": (),
    }
    for name, args in refused.items():
        with pytest.raises(deep_ep.ProxyEPError, match=name):
            getattr(buffer, name)(*args)
    with buffer.agrs_new_session(enabled=False):
        pass
    with pytest.raises(deep_ep.ProxyEPError, match="num_cpu_bytes"):
        deep_ep.ElasticBuffer(dist.group.WORLD, num_bytes=4 << 20, num_cpu_bytes=2 << 20)
    with pytest.raises(ValueError, match="sl_idx"):
        deep_ep.ElasticBuffer(dist.group.WORLD, num_bytes=4 << 20, sl_idx=16)
    round_trip(buffer)


def dispatch_refusals(buffer, x, topk_idx, weights, handle):
    """(call, arguments, exception, message) of every dispatch refusal."""
    base = dict(topk_idx=topk_idx, num_experts=E)
    too_many = torch.zeros(T + 1, H, dtype=torch.bfloat16)
    too_many_idx = torch.zeros(T + 1, K, dtype=torch.int64)
    return [
        (dict(x=x, handle=handle, do_expand=True), ValueError, "do_expand=True differs"),
        (dict(x=x, do_zero_padding=True, **base), ValueError, "do_zero_padding needs do_expand"),
        (dict(x=too_many, topk_idx=too_many_idx, num_experts=E), ValueError, "more than num_max_tokens_per_rank"),
        (dict(x=x, previous_event=buffer.capture(), **base), ValueError, "allocate_on_comm_stream"),
        (dict(x=x, num_qps=1000, **base), ValueError, "num_allocated_qps"),
        (dict(x=x, topk_idx=topk_idx), ValueError, "num_experts"),
        (dict(x=x, handle=handle, topk_idx=topk_idx), ValueError, "takes no topk_idx"),
        (dict(x=x, handle=handle, cumulative_local_expert_recv_stats=torch.zeros(E // dist.get_world_size(),
                                                                                  dtype=torch.int32)),
         ValueError, "cumulative_local_expert_recv_stats"),
        (dict(x=x, handle=handle, do_cpu_sync=True), ValueError, "do_cpu_sync=True"),
        (dict(x=x, handle=handle, num_experts=2 * E), ValueError, "differs from the handle"),
        (dict(x=x, handle=object()), TypeError, "EPHandle"),
        (dict(x=x, cumulative_local_expert_recv_stats=torch.zeros(3, dtype=torch.int64), **base),
         ValueError, "int32"),
    ]


def test_refused_arguments_leave_buffer_usable(buffer):
    rank, _ = world()
    x, topk_idx, weights = make_inputs(3)
    recv_x, _, recv_w, handle, _ = buffer.dispatch(x, topk_idx=topk_idx, topk_weights=weights, num_experts=E)
    for kwargs, error, message in dispatch_refusals(buffer, x, topk_idx, weights, handle):
        with pytest.raises(error, match=message):
            buffer.dispatch(**kwargs)
    ref = reference_for((x,), topk_idx, weights)
    y = combine_row(ref.src_ids, rank)
    combine_refusals = [
        (dict(bias=(y, y, y)), ValueError, "at most two"),
        (dict(topk_weights=torch.zeros(recv_x.shape[0])), ValueError, "2-D"),
        (dict(previous_event=buffer.capture()), ValueError, "allocate_on_comm_stream"),
        (dict(num_qps=1000), ValueError, "num_allocated_qps"),
    ]
    for kwargs, error, message in combine_refusals:
        with pytest.raises(error, match=message):
            buffer.combine(y, handle, **kwargs)
    with pytest.raises(TypeError, match="EPHandle"):
        buffer.combine(y, object())
    buffer.allow_multiple_reduction = False
    try:
        if buffer._reduces_by_node:
            with pytest.raises(deep_ep.ProxyEPError, match="reduces inside each node"):
                buffer.combine(y, handle)
    finally:
        buffer.allow_multiple_reduction = True
    # The handle still combines, and the Buffer still dispatches.
    combined, _, _ = buffer.combine(y, handle, topk_weights=recv_w)
    assert torch.equal(combined, expected_combined(topk_idx))
    round_trip(buffer)


def test_v1_and_v2_side_by_side(buffer):
    v1 = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22, explicitly_destroy=True)
    try:
        x, topk_idx, weights = make_inputs(4)
        per_rank, per_rdma_rank, per_expert, in_rank, _ = v1.get_dispatch_layout(topk_idx, E)
        v1_x, v1_idx, v1_w, v1_list, v1_handle, _ = v1.dispatch(
            x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=weights)
        v2_x, v2_idx, v2_w, handle, _ = buffer.dispatch(x, topk_idx=topk_idx, topk_weights=weights, num_experts=E)
        assert torch.equal(v1_x, v2_x) and torch.equal(v1_idx, v2_idx) and torch.equal(v1_w, v2_w)
        assert v1_list == handle.num_recv_tokens_per_expert_list
        v1_combined, _, _ = v1.combine(v1_x, v1_handle)
        v2_combined, _, _ = buffer.combine(v2_x, handle)
        assert torch.equal(v1_combined, v2_combined)
    finally:
        v1.destroy()


# ---- dispatch and combine against the reference ----

def check_handle(handle, ref, topk_idx, rows, expert_alignment, do_cpu_sync):
    rank, R = world()
    local = E // R
    scaleup = deep_ep.get_logical_domain_size(dist.group.WORLD)[1]
    n = ref.num_recv
    per_peer = [sum(ref.per_source[p::scaleup]) for p in range(scaleup)]
    assert handle.psum_num_recv_tokens_per_scaleup_rank.tolist() == torch.tensor(per_peer).cumsum(0).tolist()
    assert handle.psum_num_recv_tokens_per_scaleup_rank.dtype == torch.int32
    assert torch.equal(handle.num_unaligned_recv_tokens_per_expert, ref.per_expert.int())
    aligned = [align(int(c), expert_alignment) for c in ref.per_expert]
    assert handle.psum_num_recv_tokens_per_expert.tolist() == torch.tensor(aligned).cumsum(0).tolist()
    assert handle.num_recv_tokens_per_expert_list == (aligned if do_cpu_sync else [])
    assert handle.num_recv_tokens == rows
    if do_cpu_sync:
        assert handle.num_expanded_tokens == sum(aligned)
    else:  # DeepEP's worst case
        worst = R * T * min(K, local) + (expert_alignment - 1) * local
        assert handle.num_expanded_tokens == align(worst, expert_alignment)
    metadata = handle.recv_src_metadata
    assert metadata.shape == (rows, K + 2) and metadata.dtype == torch.int32
    assert torch.equal(metadata[:n, 0].sort().values, ref.src_ids.int())
    assert torch.equal(metadata[:n, 0], ref.src_ids.int())  # and in that order already
    first_lane = (ref.topk_idx >= 0).int().argmax(dim=1)
    assert torch.equal(metadata[:n, 1], (ref.src_ids // T * K + first_lane).int())
    assert (metadata[:n, 2:] == -1).all() and (metadata[n:] == -1).all()
    assert (handle.do_expand, handle.num_experts, handle.expert_alignment) == (False, E, expert_alignment)
    assert handle.num_max_tokens_per_rank == T
    # Send slots: one per (token, destination rank), in lane order; -1 lanes and repeats -1.
    slots = handle.dst_buffer_slot_idx
    assert slots.shape == topk_idx.shape and slots.dtype == torch.int32
    dest = torch.where(topk_idx >= 0, topk_idx // local, torch.full_like(topk_idx, -1))
    for t in range(topk_idx.shape[0]):
        seen = set()
        for k in range(K):
            r = int(dest[t, k])
            assert (int(slots[t, k]) >= 0) == (r >= 0 and r not in seen), (t, k)
            seen.add(r)
    for r in range(R):  # each rank's slots number its tokens 0, 1, ... in token order
        heads = slots[(dest == r) & (slots >= 0)]
        assert heads.tolist() == list(range(len(heads)))
    assert handle.token_metadata_at_forward is None and handle.channel_linked_list is None


def as_bytes(t):
    """Bytes of ``t`` for bitwise comparison (column-major scales made contiguous first)."""
    return t.contiguous().view(torch.uint8)


CASES = [(fp8, alignment, sync, asynchronous)
         for fp8 in (False, True) for alignment in (1, 128) for sync in (True, False)
         for asynchronous in (False, True)]


@pytest.mark.parametrize("fp8,expert_alignment,do_cpu_sync,asynchronous", CASES)
def test_dispatch_combine(buffer, fp8, expert_alignment, do_cpu_sync, asynchronous):
    rank, R = world()
    x, topk_idx, weights = make_inputs(10 + CASES.index((fp8, expert_alignment, do_cpu_sync, asynchronous)))
    data = deep_ep.utils.math.per_token_cast_to_fp8(x) if fp8 else x
    ref = reference_for(data if fp8 else (x,), topk_idx, weights)
    do_handle_copy = expert_alignment == 1
    col_major = fp8 and not do_cpu_sync
    n, rows = ref.num_recv, (ref.num_recv if do_cpu_sync else R * T)

    def launch(call, **kwargs):
        out = call(async_with_compute_stream=asynchronous, **kwargs)
        if asynchronous:
            assert out[-1].event is not None
            out[-1].current_stream_wait()
        else:
            assert out[-1].event is None
        return out

    recv, recv_idx, recv_w, handle, _ = launch(
        buffer.dispatch, x=data, topk_idx=topk_idx, topk_weights=weights, num_experts=E,
        expert_alignment=expert_alignment, do_cpu_sync=do_cpu_sync, do_handle_copy=do_handle_copy,
        use_tma_aligned_col_major_sf=col_major)
    recv_parts = recv if fp8 else (recv,)
    for got, want in zip(recv_parts, ref.rows):
        assert got.shape == (rows,) + tuple(want.shape[1:])
        assert torch.equal(as_bytes(got[:n]), as_bytes(want))
        assert not got[n:].any()  # worst-case rows past the received ones are zero
    if col_major:
        assert recv[1].stride() == (1, align(rows, 4))
    assert recv_idx.shape == (rows, K) and torch.equal(recv_idx[:n], ref.topk_idx) and (recv_idx[n:] == -1).all()
    assert recv_w.shape == (rows, K) and torch.equal(recv_w[:n], ref.weights)
    assert (handle.topk_idx.data_ptr() == topk_idx.data_ptr()) == (not do_handle_copy)
    assert torch.equal(handle.topk_idx, topk_idx)
    check_handle(handle, ref, topk_idx, rows, expert_alignment, do_cpu_sync)

    cached, cached_idx, cached_w, cached_handle, _ = launch(
        buffer.dispatch, x=data, handle=handle, use_tma_aligned_col_major_sf=col_major)
    assert cached_handle is handle and cached_w is None
    for got, want in zip(cached if fp8 else (cached,), recv_parts):
        assert torch.equal(as_bytes(got), as_bytes(want))
    if col_major:
        assert cached[1].stride() == (1, align(rows, 4))
    assert torch.equal(cached_idx, recv_idx)
    # Weights travel with a cached dispatch too (the handle's top-k again), masked as fresh ones.
    with_w = launch(buffer.dispatch, x=data, handle=handle, topk_weights=weights * 2)
    assert torch.equal(with_w[2], recv_w * 2)

    y = torch.zeros(rows, H, dtype=torch.bfloat16)
    y[:n] = combine_row(ref.src_ids, rank)
    expected = expected_combined(topk_idx)
    combined, combined_w, _ = launch(buffer.combine, x=y, handle=handle, topk_weights=recv_w)
    assert torch.equal(combined, expected)
    # Each lane's weight comes back from the rank owning its expert; -1 lanes give 0.
    assert torch.equal(combined_w, torch.where(topk_idx >= 0, weights, torch.zeros(())))
    combined, combined_w, _ = launch(buffer.combine, x=y, handle=handle)
    assert torch.equal(combined, expected) and combined_w is None


def noisy_row(src_ids, rank):
    """bf16 [n, H] a rank returns for these source ids, the same on every rank: +-2^24, -2^23 and
    small values by (source id, rank, channel), so that float32 sums of three or more terms keep
    or lose the small ones by the order of adding them (2^24 + 1 is 2^24), and a wrong order
    changes whole units, not a last bit the bf16 rounding hides."""
    channels = torch.arange(H)
    big = 2.0 ** 24
    values = torch.tensor([big, -big, 1.0, 0.75, -big / 2, 3.0, -1.5])
    pick = (src_ids.unsqueeze(1) * 5 + rank * 3 + channels) % values.numel()
    return values[pick].to(torch.bfloat16)


def returned_weights(src_ids, rank):
    """f32 [n, K] a rank returns: non-zero in every lane, so a sum over ranks and a selection of
    the owner's lane differ."""
    return src_ids.float().unsqueeze(1) * 0.5 + rank * 100.0 + torch.arange(K).float()


def v2_expected(topk_idx, biases, groups_of_rank):
    """DeepEP V2's combine of this rank's tokens (docs/plans/ELASTIC_BUFFER.md, section 2): in
    float32, the biases, then each group's partial in the order of the group's last top-k lane;
    a group is a rank, or a node whose partial is its ranks' rows summed in the order of each
    rank's last lane too, rounded to bf16. Weights: lane k as the group owning its expert
    returned it. Returns (combined bf16 [N, H], weights f32 [N, K])."""
    rank, R = world()
    local = E // R
    ids = rank * T + torch.arange(topk_idx.shape[0])
    rows = [noisy_row(ids, r).float() for r in range(R)]
    weights = [returned_weights(ids, r) for r in range(R)]
    out = torch.empty(topk_idx.shape[0], H, dtype=torch.bfloat16)
    out_w = torch.zeros(topk_idx.shape[0], K)
    for t, lanes in enumerate(topk_idx.tolist()):
        acc = torch.zeros(H)
        for b in biases:
            acc = acc + b[t].float()
        last, last_of_rank = {}, {}
        for k, e in enumerate(lanes):
            if e >= 0:
                last[groups_of_rank(e // local)] = k
                last_of_rank[e // local] = k
        reached = sorted(last_of_rank, key=last_of_rank.get)
        group_w = {}
        for g in sorted(last, key=last.get):
            members = [r for r in reached if groups_of_rank(r) == g]
            partial, partial_w = torch.zeros(H), torch.zeros(K)
            for r in members:
                partial, partial_w = partial + rows[r][t], partial_w + weights[r][t]
            if len(members) > 1 or groups_of_rank(members[0]) != members[0]:
                partial = partial.to(torch.bfloat16).float()  # a node's partial travels as bf16
            acc = acc + partial
            group_w[g] = partial_w
        out[t] = acc.to(torch.bfloat16)
        for k, e in enumerate(lanes):
            if e >= 0:
                out_w[t, k] = group_w[groups_of_rank(e // local)][k]
    return out, out_w


@pytest.fixture(scope="module")
def single_reduction_buffer():
    """allow_multiple_reduction=False: a token's rows reduced once, at home (no node stage),
    whatever the hybrid mode."""
    with elastic_buffer(num_max_tokens_per_rank=T, hidden=H, num_topk=K,
                        allow_multiple_reduction=False) as buf:
        yield buf


@pytest.fixture(scope="module")
def direct_buffer():
    """An ElasticBuffer in DeepEP's direct mode (no hybrid): every rank is a group of the reduce,
    so 4 ranks give tokens 3 and 4 groups, whose order matters."""
    with elastic_buffer(num_max_tokens_per_rank=T, hidden=H, num_topk=K,
                        allow_hybrid_mode=False) as buf:
        yield buf


@pytest.mark.parametrize("num_biases", [0, 1, 2])
@pytest.mark.parametrize("mode", ["hybrid", "direct", "single_reduction"])
def test_combine_in_v2_order(buffer, direct_buffer, single_reduction_buffer, mode, num_biases):
    """Bit for bit DeepEP V2's combine: biases first, then the groups by each token's last lane,
    and each weight lane selected from its owner."""
    rank, R = world()
    buf = {"hybrid": buffer, "direct": direct_buffer, "single_reduction": single_reduction_buffer}[mode]
    by_node = buf._reduces_by_node
    if mode == "single_reduction":
        assert not by_node and buf.runtime.stats().internode == "per_rank"
    rpn = buf.num_scaleup_ranks

    def groups_of_rank(r):
        return r // rpn if by_node else r

    x, topk_idx, weights = make_inputs(50 + num_biases)
    g = torch.Generator().manual_seed(77 + rank)
    biases = [(torch.randn(x.shape[0], H, generator=g) * 300).to(torch.bfloat16) for _ in range(num_biases)]
    _, _, recv_w, handle, _ = buf.dispatch(x, topk_idx=topk_idx, topk_weights=weights, num_experts=E)
    ref = reference_for((x,), topk_idx, weights)
    y = noisy_row(ref.src_ids, rank)
    w = returned_weights(ref.src_ids, rank)
    bias = None if not biases else (biases[0] if num_biases == 1 else tuple(biases))
    combined, combined_w, _ = buf.combine(y, handle, topk_weights=w, bias=bias)
    expected, expected_w = v2_expected(topk_idx, biases, groups_of_rank)
    assert torch.equal(combined, expected)
    assert torch.equal(combined_w, expected_w)


def test_bad_order_tables_refused(buffer):
    """The native combine checks V2's tables before anything is sent (a wrong entry would read
    another block or add one twice); the Buffer stays usable."""
    from proxyep import _proxyep, view
    rank, _ = world()
    x, topk_idx, weights = make_inputs(60)
    _, _, _, handle, _ = buffer.dispatch(x, topk_idx=topk_idx, topk_weights=weights, num_experts=E)
    y = combine_row(reference_for((x,), topk_idx, weights).src_ids, rank)
    order, owner = handle._combine_tables()
    out_of_range = order.clone()
    out_of_range[:, 0] = order.shape[1]
    twice = order.clone()
    twice[:, 1] = torch.where(order[:, 0] >= 0, order[:, 0], order[:, 1])
    bad_owner = owner.clone()
    bad_owner[:, 0] = -2
    w = torch.zeros(y.shape[0], K)
    cases = [(dict(order=out_of_range), "out of range"), (dict(order=twice), "twice"),
             (dict(order=order[:1]), "order must"),
             (dict(order=order, weight_owner=bad_owner), "weight_owner entry"),
             (dict(weight_owner=owner), "with an order only")]
    for tables, message in cases:
        views = {k: view(v.contiguous(), k) for k, v in tables.items()}
        with pytest.raises(deep_ep.ProxyEPError, match=message):
            buffer.runtime.combine(_proxyep.CombineArgs(x=view(y, "x"), handle=handle._native,
                                                        topk_weights=view(w, "topk_weights"), **views))
    round_trip(buffer)


def test_previous_events(buffer):
    rank, _ = world()
    x, topk_idx, weights = make_inputs(40)
    before = buffer.capture()
    recv_x, _, recv_w, handle, event = buffer.dispatch(
        x, topk_idx=topk_idx, topk_weights=weights, num_experts=E, previous_event=buffer.capture(),
        previous_event_before_epilogue=before, allocate_on_comm_stream=True, async_with_compute_stream=True)
    with event:
        pass
    ref = reference_for((x,), topk_idx, weights)
    assert torch.equal(recv_x, ref.rows[0])
    # An EventOverlap is taken as well (V1's kind of event).
    combined, _, event = buffer.combine(
        combine_row(ref.src_ids, rank), handle, topk_weights=recv_w,
        previous_event=deep_ep.EventOverlap(buffer.capture()), allocate_on_comm_stream=True)
    assert torch.equal(combined, expected_combined(topk_idx))


def test_async_handle_complete_when_read_before_wait(buffer):
    """An async dispatch's row-dependent handle fields are complete when read, even before the
    event's wait (reading waits for the call)."""
    x, topk_idx, weights = make_inputs(41)
    ref = reference_for((x,), topk_idx, weights)
    _, _, _, handle, event = buffer.dispatch(x, topk_idx=topk_idx, num_experts=E, async_with_compute_stream=True)
    assert torch.equal(handle.recv_src_metadata[:, 0], ref.src_ids.int())
    assert torch.equal(handle.num_unaligned_recv_tokens_per_expert, ref.per_expert.int())
    event.current_stream_wait()  # waiting afterwards is harmless
    handle.recv_src_metadata = handle.recv_src_metadata[:1]  # writable, as DeepEP's test needs
    assert handle.recv_src_metadata.shape[0] == 1


def test_cumulative_stats(buffer):
    x, topk_idx, weights = make_inputs(42)
    ref = reference_for((x,), topk_idx, weights)
    stats = torch.zeros(E // dist.get_world_size(), dtype=torch.int32)
    buffer.dispatch(x, topk_idx=topk_idx, num_experts=E, cumulative_local_expert_recv_stats=stats)
    _, _, _, _, event = buffer.dispatch(x, topk_idx=topk_idx, num_experts=E, expert_alignment=128,
                                        do_cpu_sync=False, async_with_compute_stream=True,
                                        cumulative_local_expert_recv_stats=stats)
    event.current_stream_wait()
    assert torch.equal(stats, 2 * ref.per_expert.int())  # unaligned counts, added


def test_env_overrides_service_level():
    os.environ["EP_OVERRIDE_RDMA_SL"] = "5"
    try:
        buf = deep_ep.ElasticBuffer(dist.group.WORLD, num_bytes=2 << 20, sl_idx=99, explicitly_destroy=True)
    finally:
        del os.environ["EP_OVERRIDE_RDMA_SL"]
    try:
        assert buf.sl_idx == 5
    finally:
        buf.destroy()


def test_cpu_timeout_bounds_this_buffer_waits():
    """num_cpu_timeout_secs is this Buffer's host wait deadline, not ep.timeout_ms (20 s in these
    tests): rank 0 dispatches alone and fails within about a second, naming the phase; rank 1
    waits for it without calling."""
    buf = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=T, hidden=H, num_topk=K,
                                num_cpu_timeout_secs=1)
    x, topk_idx, _ = make_inputs(3)
    failed_after = None
    if dist.get_rank() == 0:
        start = time.monotonic()
        with pytest.raises(deep_ep.ProxyEPError, match="dispatch"):
            buf.dispatch(x, topk_idx=topk_idx, num_experts=E)
        failed_after = time.monotonic() - start
    dist.barrier()
    del buf
    if failed_after is not None:
        assert failed_after < 10, f"the call gave up after {failed_after:.1f} s, not about 1 s"
