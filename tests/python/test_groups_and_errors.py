"""Buffers over any torch.distributed group: a subgroup of a larger world, several Buffers on
different groups in one process, setup through the group's own collectives. Bad input from
Python is refused before anything is sent, with the Buffer still usable. Buffers that are
garbage-collected, with and without explicitly_destroy."""

import gc

import pytest
import torch
import torch.distributed as dist

import deep_ep
from conftest import calc_diff

T, H, K, E = 40, 256, 2, 8


def inputs(rank, seed=0):
    g = torch.Generator().manual_seed(seed * 7 + rank)
    idx = torch.topk(torch.randn(T, E, generator=g), K, dim=-1).indices
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    return x, idx, torch.rand(T, K, generator=g)


def round_trip(buffer, x, idx, weights):
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, E)
    recv, _, recv_w, _, handle, _ = buffer.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                                    num_tokens_per_expert=per_expert, topk_idx=idx,
                                                    topk_weights=weights)
    combined, _, _ = buffer.combine(recv, handle)
    dest = in_rank.sum(dim=1, keepdim=True)
    assert calc_diff(combined.float() / dest, x.float()) < 5e-6


def test_subgroups_and_several_buffers_in_one_process():
    rank, R = dist.get_rank(), dist.get_world_size()
    # Pairs {0,1}, {2,3}, ... (a world of 2 is one pair): every rank creates every group.
    pairs = [dist.new_group([r, r + 1]) for r in range(0, R - 1, 2)]
    mine = pairs[rank // 2] if rank // 2 < len(pairs) else None
    world = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=4 << 20, num_rdma_bytes=4 << 20)
    if mine is not None:
        pair = deep_ep.Buffer(mine, num_nvl_bytes=4 << 20, num_rdma_bytes=4 << 20)
        assert pair.group_size == 2 and pair.rank == rank % 2
    assert world.group_size == R and world.rank == rank
    x, idx, w = inputs(rank, 1)
    for _ in range(2):  # interleaved calls on both Buffers
        round_trip(world, x, idx, w)
        if mine is not None:
            round_trip(pair, x, idx, w)
    del world
    if mine is not None:
        del pair
    gc.collect()


def test_bad_input_raises_before_sending_and_the_buffer_stays_usable():
    rank, R = dist.get_rank(), dist.get_world_size()
    buffer = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=4 << 20, num_rdma_bytes=4 << 20)
    x, idx, w = inputs(rank, 2)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, E)
    args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                topk_idx=idx, topk_weights=w)
    with pytest.raises(deep_ep.ProxyEPError, match="x"):
        buffer.dispatch(x.float(), **args)  # combine and dispatch move BF16 (or FP8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        buffer.dispatch(x.tolist(), **args)
    with pytest.raises(deep_ep.ProxyEPError, match="topk_idx"):
        bad = idx.clone()
        bad[0, 0] = E
        buffer.get_dispatch_layout(bad, E)
    with pytest.raises(deep_ep.ProxyEPError):
        buffer.dispatch(x[:, :100], **args)  # a view with a row stride: refused, not misread
    with pytest.raises(TypeError, match="handle"):
        buffer.combine(x, handle=(1, 2, 3))
    with pytest.raises(deep_ep.ProxyEPError):
        deep_ep.Config(num_sms=20, num_max_nvl_chunked_send_tokens=300, num_max_nvl_chunked_recv_tokens=256)
    with pytest.raises(ValueError, match="offset"):
        buffer.get_local_buffer_tensor(torch.bfloat16, offset=3)
    with pytest.raises(ValueError, match="exceed"):
        buffer.get_local_buffer_tensor(torch.int32, (4 << 20,))
    if buffer.num_nodes == 1:
        with pytest.raises(deep_ep.ProxyEPError, match="no RDMA buffer"):
            buffer.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)
    round_trip(buffer, x, idx, w)  # every rank refused the same calls: still in step


def test_garbage_collected_buffers_free_their_resources():
    rank, R = dist.get_rank(), dist.get_world_size()
    x, idx, w = inputs(rank, 3)
    for explicitly in (False, True, False):
        buffer = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=4 << 20, num_rdma_bytes=4 << 20,
                                explicitly_destroy=explicitly)
        round_trip(buffer, x, idx, w)
        if explicitly:
            buffer.destroy()
            with pytest.raises(deep_ep.ProxyEPError, match="destroyed"):
                round_trip(buffer, x, idx, w)
        del buffer
        gc.collect()
    with pytest.raises(AssertionError, match="explicitly_destroy"):
        deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 20).destroy()


def test_module_surface():
    import deep_ep_cpp
    from deep_ep.utils import EventHandle, EventOverlap

    assert deep_ep.topk_idx_t is torch.int64
    assert deep_ep.is_sm90_compiled()
    assert deep_ep.Buffer.num_sms == 20
    assert deep_ep.get_low_latency_rdma_size_hint(128, 7168, 2, 64) > 0
    config = deep_ep.Buffer.get_dispatch_config(8)
    assert (config.num_sms, config.num_max_nvl_chunked_send_tokens) == (20, 6)
    with pytest.raises(deep_ep.ProxyEPError):
        deep_ep.Buffer.get_dispatch_config(3)
    assert isinstance(deep_ep.ProxyEPError("x"), RuntimeError)
    with EventOverlap(EventHandle()) as overlap:
        assert overlap.event is not None
    assert deep_ep_cpp.Config is deep_ep.Config
