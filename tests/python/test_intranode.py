"""DeepEP's test_intranode.py invariants (docs/DEEPEP_CONTRACT.md 4.1) through `deep_ep` on CPU
tensors: layout against a torch recomputation; dispatch with and without top-k, BF16 and FP8 (with
column-major scales), previous_event and async_finish; received rows carry their source's value;
recv_topk_idx and the per-expert list; num_worst_tokens; cached dispatch; combine and its weights.
Run on 2 and 4 ranks, one node or two (the handle is then DeepEP's internode 10-tuple)."""

import pytest
import torch
import torch.distributed as dist

import deep_ep
from conftest import calc_diff, per_token_cast_to_fp8, ranks_per_node

T, H, K, E = 96, 256, 4, 16


def make_inputs(rank, R, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.full((T, H), float(rank), dtype=torch.bfloat16)
    x_rand = torch.randn(T, H, generator=g).to(torch.bfloat16)
    scores = torch.randn(T, E, generator=g).abs() + 1
    topk_idx = torch.topk(scores, K, dim=-1, largest=True, sorted=False).indices
    topk_idx[torch.randint(0, T, (5,), generator=g), torch.randint(0, K, (5,), generator=g)] = -1
    topk_weights = torch.full((T, K), float(rank), dtype=torch.float32)
    return x, x_rand, topk_idx, topk_weights


def torch_layout(topk_idx, R):
    per_expert = torch.zeros(E, dtype=torch.int32)
    for e in range(E):
        per_expert[e] = (topk_idx == e).sum()
    rank_idx = torch.where(topk_idx >= 0, topk_idx // (E // R), torch.full_like(topk_idx, -1))
    in_rank = torch.zeros(T, R, dtype=torch.bool)
    for r in range(R):
        in_rank[:, r] = (rank_idx == r).any(dim=1)
    return in_rank.sum(dim=0).to(torch.int32), per_expert, in_rank


@pytest.fixture(scope="module")
def buffer():
    R = dist.get_world_size()
    buf = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22,
                         explicitly_destroy=True)
    yield buf
    buf.destroy()


def test_layout_matches_torch(buffer):
    rank, R = dist.get_rank(), dist.get_world_size()
    _, _, topk_idx, _ = make_inputs(rank, R)
    per_rank, per_rdma_rank, per_expert, in_rank, event = buffer.get_dispatch_layout(topk_idx, E)
    ref_rank, ref_expert, ref_in_rank = torch_layout(topk_idx, R)
    assert torch.equal(per_rank, ref_rank)
    assert torch.equal(per_expert, ref_expert)
    assert torch.equal(in_rank, ref_in_rank)
    assert in_rank.dtype == torch.bool
    rpn = ranks_per_node()
    if R <= rpn:
        assert per_rdma_rank is None  # one node (LOCAL_WORLD_SIZE), as DeepEP within NVLink
    else:
        # Across nodes: tokens per node, each token once per node it reaches.
        by_node = ref_in_rank.view(-1, R // rpn, rpn).any(dim=2)
        assert torch.equal(per_rdma_rank, by_node.sum(dim=0).to(per_rdma_rank.dtype))
    assert event.event is None


@pytest.mark.parametrize("previous", [False, True])
@pytest.mark.parametrize("async_finish", [False, True])
@pytest.mark.parametrize("kind", ["rank", "rand", "fp8"])
@pytest.mark.parametrize("with_topk", [True, False])
def test_dispatch_combine(buffer, previous, async_finish, kind, with_topk):
    rank, R = dist.get_rank(), dist.get_world_size()
    x, x_rand, topk_idx, topk_weights = make_inputs(rank, R, seed=1)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    src = x_rand if kind == "rand" else x
    data = per_token_cast_to_fp8(src) if kind == "fp8" else src
    if kind == "fp8":  # column-major scales are accepted
        data = (data[0], data[1].T.contiguous().T)
    args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    if with_topk:
        args.update(topk_idx=topk_idx, topk_weights=x_rand.float()[:, :K].contiguous() if kind == "rand" else topk_weights)
    if previous:
        args["previous_event"] = buffer.capture()
    recv, recv_idx, recv_w, per_expert_list, handle, event = buffer.dispatch(
        data, async_finish=async_finish, **args)
    if async_finish:
        assert event.event is not None
        event.current_stream_wait()
    recv_x = recv[0] if kind == "fp8" else recv
    # Received row count and per-source blocks: rows from source i carry i (rank-valued x).
    gathered = [torch.zeros(R, dtype=torch.int32) for _ in range(R)]
    dist.all_gather(gathered, per_rank)
    expected_rows = int(sum(g[rank] for g in gathered))
    assert recv_x.shape[0] == expected_rows
    prefix = handle[0] if buffer.num_nodes == 1 else None
    received_prefix = torch.cumsum(torch.stack([g[rank] for g in gathered]), 0).int()
    if buffer.num_nodes == 1:
        assert torch.equal(prefix[:, rank], received_prefix)
    else:  # DeepEP's internode handle: recv_gbl_rank_prefix_sum at [-4], as its test reads it
        assert len(handle) == 10 and torch.equal(handle[-4], received_prefix)
    begin = 0
    for s in range(R):
        count = int(gathered[s][rank])
        block = recv_x[begin:begin + count]
        if kind == "rank":
            assert torch.all(block.float() == s)
        if kind == "fp8":
            scale = torch.tensor(max(s, 1e-4), dtype=torch.float32) * torch.tensor(1 / 448.0, dtype=torch.float32)
            assert torch.equal(recv[1][begin:begin + count], scale.expand(count, H // 128))
        begin += count
    if kind == "fp8":
        assert recv[1].shape == (expected_rows, H // 128)
    if with_topk:
        all_experts = per_expert.clone()
        dist.all_reduce(all_experts)
        local = E // R
        assert per_expert_list == all_experts[rank * local:(rank + 1) * local].tolist()
        assert ((recv_idx == -1) | ((recv_idx >= 0) & (recv_idx < local))).all()
        for e in range(local):
            assert int((recv_idx == e).sum()) == per_expert_list[e]
        if kind == "rank":
            begin = 0
            for s in range(R):
                count = int(gathered[s][rank])
                w = recv_w[begin:begin + count]
                assert torch.all((w == s) | (recv_idx[begin:begin + count] == -1))
                begin += count
    # Combine (BF16): each token comes back summed over the ranks it went to.
    combine_x = recv_x if kind != "fp8" else src.new_zeros(0)
    if kind == "fp8":
        # dequantise as DeepEP's test does: per 128 channels times the scale
        from conftest import e4m3_decode
        combine_x = (e4m3_decode(recv[0]).view(-1, H // 128, 128) * recv[1].unsqueeze(2)).view(-1, H).to(torch.bfloat16)
    cargs = dict(topk_weights=recv_w) if with_topk else {}
    combined, combined_w, event = buffer.combine(combine_x, handle, async_finish=async_finish, **cargs)
    if async_finish:
        event.current_stream_wait()
    dest = in_rank.sum(dim=1, keepdim=True).clamp(min=1)
    sent = in_rank.any(dim=1)
    assert calc_diff(combined[sent].float() / dest[sent], src[sent].float()) < (5e-4 if kind == "fp8" else 5e-6)
    if with_topk:
        # Dispatch zeroes the slots of other ranks' experts, so the sum over ranks is the original
        # weight of every selected expert.
        ref_w = (x_rand.float()[:, :K] if kind == "rand" else topk_weights)
        selected = topk_idx >= 0
        assert calc_diff(combined_w[selected], ref_w[selected]) < 1e-9


def test_cached_dispatch_reproduces(buffer):
    rank, R = dist.get_rank(), dist.get_world_size()
    x, x_rand, topk_idx, topk_weights = make_inputs(rank, R, seed=2)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    recv, _, _, _, handle, _ = buffer.dispatch(x_rand, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                               num_tokens_per_expert=per_expert, topk_idx=topk_idx,
                                               topk_weights=topk_weights)
    again = buffer.dispatch(x_rand, handle=handle)
    assert again[1:5] == (None, None, None, None)
    assert torch.equal(again[0], recv)


def test_num_worst_tokens(buffer):
    rank, R = dist.get_rank(), dist.get_world_size()
    x, x_rand, topk_idx, topk_weights = make_inputs(rank, R, seed=3)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                topk_idx=topk_idx, topk_weights=topk_weights)
    exact = buffer.dispatch(x_rand, **args)
    worst = buffer.dispatch(x_rand, num_worst_tokens=T * R, **args)
    n = exact[0].shape[0]
    assert worst[0].shape[0] == T * R
    assert torch.equal(worst[0][:n], exact[0])
    assert torch.equal(worst[1][:n], exact[1])
    assert torch.all(worst[1][n:] == -1)
    assert worst[3] == []


def test_async_combine_returns_before_peers_start(buffer):
    """async_finish overlaps: even ranks' combine returns before odd ranks start theirs (odd ranks
    enter a barrier first that even ranks enter after their call). A combine finished on the
    calling thread would wait for the odd ranks' records and fail at the deadline naming them."""
    rank, R = dist.get_rank(), dist.get_world_size()
    x, _, topk_idx, _ = make_inputs(rank, R, seed=3)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    recv, _, _, _, handle, _ = buffer.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                               num_tokens_per_expert=per_expert)
    if rank % 2 == 0:
        combined, _, event = buffer.combine(recv, handle, async_finish=True)
        assert event.event is not None
        dist.barrier()
        event.current_stream_wait()
    else:
        dist.barrier()
        combined, _, _ = buffer.combine(recv, handle)
    # Rank-valued rows: each token comes back as its value times the ranks it went to, exactly.
    dest = in_rank.sum(dim=1, keepdim=True).to(torch.float32)
    assert torch.equal(combined.float(), x.float() * dest)


def test_async_calls_finish_in_stream_order(buffer):
    """The next call first finishes an async call (stream order): its outputs are complete without
    waiting for its event, and the inputs the caller dropped were held until then."""
    rank, R = dist.get_rank(), dist.get_world_size()
    x, _, topk_idx, topk_weights = make_inputs(rank, R, seed=4)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    recv, _, _, _, handle, _ = buffer.dispatch(
        x.clone(), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx.clone(), topk_weights=topk_weights.clone(), async_finish=True)
    combined, _, event = buffer.combine(recv, handle, async_finish=True)
    del event  # never waited for: the next call finishes it
    buffer.get_dispatch_layout(topk_idx, E)
    dest = in_rank.sum(dim=1, keepdim=True).to(torch.float32)
    assert torch.equal(combined.float(), x.float() * dest)


def test_local_buffer_tensor_is_where_rows_land(buffer):
    """get_local_buffer_tensor: views (not copies) of the NVL buffer, in which what the peers
    send this rank lands: zeroed, then a dispatch too large to travel with the notify record
    (128 KiB) leaves every node peer's rank+1.5-valued top-k weights there. Their rank+1-valued
    rows go straight into recv_x (the landing region): the NVL buffer holds none of them; with
    hierarchical internode (no landing region yet) they land in the NVL buffer too."""
    rank, R = dist.get_rank(), dist.get_world_size()
    nvl = buffer.get_local_buffer_tensor(torch.bfloat16)
    assert nvl.dtype == torch.bfloat16 and nvl.numel() == (1 << 22) // 2
    window = buffer.get_local_buffer_tensor(torch.uint8, (2, 8), offset=64)
    window.fill_(7)
    assert torch.equal(buffer.get_local_buffer_tensor(torch.int32, (4,), offset=64),
                       torch.full((4,), 0x07070707, dtype=torch.int32))
    nvl.zero_()
    tokens, hidden = 512, 1024
    x = torch.full((tokens, hidden), float(rank + 1), dtype=torch.bfloat16)
    idx = torch.arange(tokens * K).view(tokens, K) % E  # every rank's experts
    weights = torch.full((tokens, K), rank + 1.5, dtype=torch.float32)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, E)
    recv, _, _, _, _, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=idx, topk_weights=weights)
    as_f32 = buffer.get_local_buffer_tensor(torch.float32)
    node_first = rank // buffer.ranks_per_node * buffer.ranks_per_node
    for peer in range(node_first, min(R, node_first + buffer.ranks_per_node)):
        if peer != rank:
            assert bool((as_f32 == peer + 1.5).any()), f"no weight of rank {peer} in the NVL buffer"
            in_place = buffer.stats().internode != "hierarchical"
            assert bool((nvl == float(peer + 1)).any()) != in_place, f"rank {peer}'s rows, in place: {in_place}"
            assert bool((recv == float(peer + 1)).all(dim=1).any()), f"no row of rank {peer}"
    if buffer.num_nodes > 1:
        staging = buffer.get_local_buffer_tensor(torch.bfloat16, use_rdma_buffer=True)
        assert bool((staging == float(rank + 1)).any()), "no staged row of this rank"
