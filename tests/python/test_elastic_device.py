"""deep_ep.ElasticBuffer with device tensors: the same V2 calls on an ElasticBuffer with a device
and on one without, with the same inputs, must give the same outputs and handle fields, bit for
bit (the host path is checked against DeepEP's invariants by test_elastic.py,
test_elastic_expand.py and test_deepep_v2_ep.py). The device is the host-simulated one
(PROXYEP_TEST_DEVICE unset or "simulated") or the GPU (PROXYEP_TEST_DEVICE=cuda,
scripts/gpu-check.sh). What this covers that the V1 device test does not: the handle's fields
computed from host copies of device tensors, V2's combine order and biases on the device, the
expanded layout's copies and fold on the device backend, cached dispatches with weights, the
worst-case padding and column-major scales made in the device's memory, and async calls."""

import pytest
import torch
import torch.distributed as dist

from conftest import elastic_buffer, per_token_cast_to_fp8
from test_device_tensors import KIND, OnDevice, device_counters, same
from test_elastic import E, H, K, T, make_inputs

FIELDS = ("psum_num_recv_tokens_per_scaleup_rank", "psum_num_recv_tokens_per_expert",
          "num_unaligned_recv_tokens_per_expert", "dst_buffer_slot_idx", "recv_src_metadata")


@pytest.fixture(scope="module")
def buffers():
    settings = dict(num_max_tokens_per_rank=T, hidden=H, num_topk=K)
    with elastic_buffer(device="host", **settings) as host, \
            elastic_buffer(device=KIND, **settings) as device:
        assert device._legacy.device is not None
        yield host, device


def on_host(t):
    """A handle field where the test can read it (fields are host tensors, CUDA ones on a GPU)."""
    return t.cpu() if t.is_cuda else t


def same_fields(handle_d, handle_h):
    for name in FIELDS:
        d, h = on_host(getattr(handle_d, name)), getattr(handle_h, name)
        assert torch.equal(d, h), name
    assert handle_d.num_recv_tokens == handle_h.num_recv_tokens
    assert handle_d.num_expanded_tokens == handle_h.num_expanded_tokens
    assert handle_d.num_recv_tokens_per_expert_list == handle_h.num_recv_tokens_per_expert_list


def rows_like(n, seed):
    """Expert outputs of n rows, the same on both Buffers (bf16 [n, H]): magnitudes 2^-10 to
    2^14 apart, so that float32 sums depend on the order of their terms (V2's order, biases
    first, must be the device's too)."""
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    scale = torch.exp2(torch.randint(-10, 15, (n, H), generator=g).float())
    return (torch.randn(n, H, generator=g) * scale).to(torch.bfloat16)


def lane_weights(n, seed):
    """f32 [n, K] returned weights, non-zero in every lane: a sum over ranks (V1) and the owner's
    lane (V2) differ."""
    g = torch.Generator().manual_seed(seed * 100 + 7 + dist.get_rank())
    return torch.rand(n, K, generator=g) + 1


def wait(event, asynchronous):
    if asynchronous:
        assert event.event is not None
        event.current_stream_wait()


def moved_on_device(device, before):
    moved = torch.tensor(device_counters(device) - before)
    dist.all_reduce(moved)
    return int(moved) > 0


# (fp8, async_with_compute_stream, do_cpu_sync, use_tma_aligned_col_major_sf)
FRESH = [(False, False, True, False), (True, True, True, True), (False, True, False, False),
         (True, False, False, True)]


@pytest.mark.parametrize("fp8,asynchronous,do_cpu_sync,col_major", FRESH)
def test_dispatch_combine_and_cached_dispatch(buffers, fp8, asynchronous, do_cpu_sync, col_major):
    host, device = buffers
    to = OnDevice(device._legacy)
    seed = 300 + FRESH.index((fp8, asynchronous, do_cpu_sync, col_major))
    x, topk_idx, weights = make_inputs(seed)
    data = per_token_cast_to_fp8(x) if fp8 else x
    local = E // dist.get_world_size()
    stats_h = torch.arange(local, dtype=torch.int32)
    stats_d = to(stats_h.clone())
    before = device_counters(device._legacy)
    common = dict(num_experts=E, do_cpu_sync=do_cpu_sync, use_tma_aligned_col_major_sf=col_major)
    recv_h, idx_h, w_h, handle_h, _ = host.dispatch(
        data, topk_idx=topk_idx, topk_weights=weights,
        cumulative_local_expert_recv_stats=stats_h, **common)
    recv_d, idx_d, w_d, handle_d, event = device.dispatch(
        to(data), topk_idx=to(topk_idx), topk_weights=to(weights),
        cumulative_local_expert_recv_stats=stats_d, async_with_compute_stream=asynchronous, **common)
    wait(event, asynchronous)
    if fp8 and col_major:
        assert recv_d[1].stride()[0] == 1 and recv_h[1].stride() == recv_d[1].stride()
    same(recv_d, recv_h, to)
    same(idx_d, idx_h, to)
    same(w_d, w_h, to)
    same(stats_d, stats_h, to)
    same_fields(handle_d, handle_h)

    # V2's combine with both biases and 2-D weights: its order and biases on the device.
    y = rows_like(handle_h.num_recv_tokens, seed)
    b0, b1 = rows_like(x.shape[0], seed + 1), rows_like(x.shape[0], seed + 2)
    w = lane_weights(handle_h.num_recv_tokens, seed)
    out_h = host.combine(y, handle_h, topk_weights=w, bias=(b0, b1))
    out_d = device.combine(to(y), handle_d, topk_weights=to(w), bias=(to(b0), to(b1)),
                           async_with_compute_stream=asynchronous)
    wait(out_d[2], asynchronous)
    same(out_d[0], out_h[0], to)
    same(out_d[1], out_h[1], to)

    # Cached, with the weights again (a handle without CPU sync: padded to the worst case).
    again_h = host.dispatch(data, handle=handle_h, topk_weights=weights,
                            use_tma_aligned_col_major_sf=col_major)
    again_d = device.dispatch(to(data), handle=handle_d, topk_weights=to(weights),
                              use_tma_aligned_col_major_sf=col_major)
    assert again_d[3] is handle_d
    for d, h in zip(again_d[:3], again_h[:3]):
        same(d, h, to)
    assert moved_on_device(device._legacy, before), "the device path did not run"


def taken_slots(handle):
    """bool [slots]: the slots a received (token, expert) pair takes (the rest are gaps)."""
    meta = on_host(handle.recv_src_metadata)
    slots = meta[:, 2:]
    taken = torch.zeros(handle.num_expanded_tokens, dtype=torch.bool)
    taken[slots[slots >= 0].long()] = True
    return taken


def same_slots(device_out, host_out, to, taken, zero_padding):
    """Expanded outputs equal in every taken slot, and everywhere with zero padding (the gaps
    are uninitialised otherwise)."""
    d = to.host(device_out)
    assert d.shape == host_out.shape and d.dtype == host_out.dtype
    if zero_padding:
        assert torch.equal(d.view(torch.uint8), host_out.view(torch.uint8))
    else:
        assert torch.equal(d[taken].view(torch.uint8), host_out[taken].view(torch.uint8))


# (fp8, expert_alignment, do_cpu_sync, do_zero_padding, async_with_compute_stream)
EXPANDED = [(False, 1, True, False, False), (True, 16, True, True, True),
            (False, 8, False, True, False), (False, 128, False, False, True)]


@pytest.mark.parametrize("fp8,alignment,do_cpu_sync,zero_padding,asynchronous", EXPANDED)
def test_expanded_layout(buffers, fp8, alignment, do_cpu_sync, zero_padding, asynchronous):
    host, device = buffers
    to = OnDevice(device._legacy)
    seed = 400 + EXPANDED.index((fp8, alignment, do_cpu_sync, zero_padding, asynchronous))
    x, topk_idx, weights = make_inputs(seed)
    data = per_token_cast_to_fp8(x) if fp8 else x
    common = dict(num_experts=E, expert_alignment=alignment, do_cpu_sync=do_cpu_sync,
                  do_expand=True, do_zero_padding=zero_padding)
    recv_h, _, w_h, handle_h, _ = host.dispatch(data, topk_idx=topk_idx, topk_weights=weights,
                                                **common)
    recv_d, idx_d, w_d, handle_d, event = device.dispatch(
        to(data), topk_idx=to(topk_idx), topk_weights=to(weights),
        async_with_compute_stream=asynchronous, **common)
    wait(event, asynchronous)
    assert idx_d is None
    same_fields(handle_d, handle_h)
    taken = taken_slots(handle_h)
    for d, h in zip(recv_d if fp8 else (recv_d,), recv_h if fp8 else (recv_h,)):
        same_slots(d, h, to, taken, zero_padding)
    same_slots(w_d, w_h, to, taken, zero_padding)

    # The expanded combine: each token's slots folded on the device, then V2's combine.
    y = rows_like(handle_h.num_expanded_tokens, seed)
    y[~taken] = 0  # the gaps' values are the caller's; keep both sides alike
    w = torch.where(taken, w_h, torch.zeros_like(w_h))
    out_h = host.combine(y, handle_h, topk_weights=w)
    out_d = device.combine(to(y), handle_d, topk_weights=to(w),
                           async_with_compute_stream=asynchronous)
    wait(out_d[2], asynchronous)
    same(out_d[0], out_h[0], to)
    same(out_d[1], out_h[1], to)

    # Cached: the same slots by the handle's recv_src_metadata.
    again_h = host.dispatch(data, handle=handle_h, topk_weights=weights, do_expand=True,
                            do_zero_padding=zero_padding)
    again_d = device.dispatch(to(data), handle=handle_d, topk_weights=to(weights), do_expand=True,
                              do_zero_padding=zero_padding)
    for d, h in zip(again_d[0] if fp8 else (again_d[0],), again_h[0] if fp8 else (again_h[0],)):
        same_slots(d, h, to, taken, zero_padding)
    same_slots(again_d[2], again_h[2], to, taken, zero_padding)


@pytest.fixture(scope="module")
def single_reduction_buffers():
    """allow_multiple_reduction=False: the expanded layout's slots each go home alone."""
    settings = dict(num_max_tokens_per_rank=T, hidden=H, num_topk=K, allow_multiple_reduction=False)
    with elastic_buffer(device="host", **settings) as host, \
            elastic_buffer(device=KIND, **settings) as device:
        yield host, device


def test_expanded_combine_without_multiple_reduction(single_reduction_buffers):
    """The per-slot combine (integrations/elastic/slot_combine.hpp) on the device: the slots'
    gather and the home's reduce by the device backend, biases first, equal to the host's."""
    host, device = single_reduction_buffers
    to = OnDevice(device._legacy)
    seed = 500
    x, topk_idx, weights = make_inputs(seed)
    common = dict(num_experts=E, expert_alignment=4, do_expand=True)
    _, _, w_h, handle_h, _ = host.dispatch(x, topk_idx=topk_idx, topk_weights=weights, **common)
    _, _, w_d, handle_d, _ = device.dispatch(to(x), topk_idx=to(topk_idx), topk_weights=to(weights),
                                             **common)
    same_fields(handle_d, handle_h)
    taken = taken_slots(handle_h)
    y = rows_like(handle_h.num_expanded_tokens, seed)
    y[~taken] = 0
    b0, b1 = rows_like(x.shape[0], seed + 1), rows_like(x.shape[0], seed + 2)
    out_h = host.combine(y, handle_h, topk_weights=w_h, bias=(b0, b1))
    out_d = device.combine(to(y), handle_d, topk_weights=w_d, bias=(to(b0), to(b1)))
    same(out_d[0], out_h[0], to)
    same(out_d[1], out_h[1], to)
