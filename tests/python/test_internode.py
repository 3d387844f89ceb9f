"""DeepEP's test_internode.py (its legacy normal-mode test across nodes) through `deep_ep` on CPU
tensors, step by step: node-grouped routing (top-k groups of experts by node), the layout with
`num_tokens_per_rdma_rank`, dispatch with `num_tokens_per_rdma_rank` and a `Config` of its RDMA
chunk sizes in every mode (BF16 and FP8, with and without top-k, async, previous events), the
checks on `handle[-4]` (rows received by source rank, prefix), `num_worst_tokens`, cached
dispatch, combine with the two biases, and the tuning sweep over NVL and RDMA chunk sizes (whose
outputs must not change with the sizes). Then DeepEP's pressure mode: the same seed again gives
the same hash of every output. Added here: the rows that crossed the fabric are exactly one per
(token, other node it reaches) (BufferStats.rows_to_fabric).

DeepEP runs it on nodes of 8 GPUs only (it asserts num_local_ranks == 8); here a node is
LOCAL_WORLD_SIZE ranks (2 nodes x 2 and 2 nodes x 1 in the suite). Its shapes (4096 x 7168, 256
experts) are cut to fit a CPU run; the benchmark half of its tuning loop prints no times here
(`proxyep bench ep` measures)."""

import pytest
import torch
import torch.distributed as dist

import deep_ep
from conftest import calc_diff, e4m3_decode, per_token_cast_to_fp8, ranks_per_node

T, H, K, E = 128, 256, 8, 32


def fp8_back(x_fp8, scales):
    """(e4m3, per-128-channel scales) -> BF16, as DeepEP's per_token_cast_back."""
    n, h = x_fp8.shape
    values = e4m3_decode(x_fp8).view(n, h // 128, 128) * scales.float().view(n, h // 128, 1)
    return values.view(n, h).to(torch.bfloat16)


def unique_per_row(idx, slots):
    """Each row's distinct non-negative values, descending, padded with -1 (the row keeps its width)."""
    out = torch.full_like(idx, -1)
    for t in range(idx.size(0)):
        values = sorted({int(v) for v in idx[t].tolist() if v >= 0}, reverse=True)[: idx.size(1)]
        out[t, : len(values)] = torch.tensor(values, dtype=idx.dtype)
    return out


def hash_tensor(t):
    """The sum of the tensor's bytes read as integers of its element size (DeepEP's hash)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return int(t.contiguous().view(as_int).long().sum())


class Workload:
    """test_main's inputs and the expected layout, for this rank and seed."""

    def __init__(self, seed):
        rank, R = dist.get_rank(), dist.get_world_size()
        self.rank, self.R = rank, R
        self.local = ranks_per_node()
        self.nodes = R // self.local
        torch.manual_seed(rank + seed)
        self.x = torch.ones((T, H), dtype=torch.bfloat16) * rank
        self.x_pure_rand = torch.randn((T, H), dtype=torch.bfloat16)
        x_e4m3 = per_token_cast_to_fp8(self.x)
        self.x_e4m3 = (x_e4m3[0], x_e4m3[1].T.contiguous().T)  # column-major scales, as DeepEP
        self.x_pure_rand_e4m3 = per_token_cast_to_fp8(self.x_pure_rand)
        scores = torch.randn((T, E), dtype=torch.float32).abs() + 1
        # Experts grouped by node: each token picks its top groups (nodes), then its top-k there.
        topk_groups = min(self.nodes, 4)
        group_scores = scores.view(T, self.nodes, -1).amax(dim=-1)
        group_idx = torch.topk(group_scores, k=topk_groups, dim=-1, sorted=False).indices
        mask = torch.zeros((T, self.nodes), dtype=torch.bool).scatter_(1, group_idx, True)
        masked = (scores.view(T, self.nodes, -1) * mask.unsqueeze(-1)).view(T, E)
        self.topk_idx = torch.topk(masked, K, dim=-1, largest=True, sorted=False)[1].to(deep_ep.topk_idx_t)
        self.topk_weights = torch.ones((T, K), dtype=torch.float32) * rank
        self.topk_weights_pure_rand = torch.randn((T, K), dtype=torch.float32)

        rank_idx = self.topk_idx // (E // R)
        rank_idx.masked_fill_(self.topk_idx == -1, -1)
        rank_idx = unique_per_row(rank_idx, R)
        node_idx = rank_idx // self.local
        node_idx.masked_fill_(rank_idx == -1, -1)
        node_idx = unique_per_row(node_idx, self.nodes)
        self.node_idx = node_idx

        self.per_expert = torch.zeros((E,), dtype=torch.int)
        for i in range(E):
            self.per_expert[i] = (self.topk_idx == i).sum()
        self.gbl_per_expert = self.per_expert.clone()
        dist.all_reduce(self.gbl_per_expert)

        self.per_rank = torch.empty((R,), dtype=torch.int)
        self.per_rdma_rank = torch.empty((self.nodes,), dtype=torch.int)
        token_idx_in_rank = torch.full((R, T), -1, dtype=torch.long)
        for i in range(R):
            self.per_rank[i] = (rank_idx == i).sum()
            selected = (rank_idx == i).max(dim=-1)[0]
            token_idx_in_rank[i][selected] = torch.arange(int(selected.sum()), dtype=torch.long)
        for i in range(self.nodes):
            self.per_rdma_rank[i] = (node_idx == i).sum()
        self.is_token_in_rank = token_idx_in_rank.T.contiguous() >= 0
        self.gbl_per_rank = self.per_rank.clone()
        dist.all_reduce(self.gbl_per_rank)

    def inputs(self):
        """DeepEP's four inputs, each with whether it is random."""
        return [("rand", self.x_pure_rand, True), ("rank", self.x, False),
                ("rand_fp8", self.x_pure_rand_e4m3, True), ("rank_fp8", self.x_e4m3, False)]

    def rows_to_other_nodes(self):
        own = self.rank // self.local
        return int(((self.node_idx >= 0) & (self.node_idx != own)).sum())

    def fabric_chunks(self, rows_per_chunk):
        """Hierarchical: the chunks of at most rows_per_chunk rows this rank sends other nodes."""
        own = self.rank // self.local
        return sum(-(-int(self.per_rdma_rank[n]) // rows_per_chunk) for n in range(self.nodes) if n != own)


@pytest.fixture(scope="module")
def buffer():
    if ranks_per_node() >= dist.get_world_size():
        pytest.skip("the internode test needs a group that spans nodes")
    buf = deep_ep.Buffer(dist.group.WORLD, int(1 << 24), int(1 << 24), explicitly_destroy=True)
    yield buf
    buf.destroy()


def test_setup_steps(buffer):
    """The Buffer's creation is timed step by step, the fabric's steps included (group spans nodes)."""
    steps = buffer.stats().setup_steps
    names = [step.name for step in steps]
    assert names[0] == "landing region" and names[-1] == "modes", names
    assert {"options agreed", "fabric addresses", "memory registered", "ready barrier"} <= set(names)
    assert all(0 <= step.seconds < 600 and step.cpu_seconds >= 0 for step in steps), steps


def deepep_config(nvl_chunk=8, rdma_chunk=16):
    """DeepEP's test config: 24 SMs, NVL buffer 512 tokens, RDMA buffer 128 tokens."""
    return deep_ep.Config(24, nvl_chunk, 512, rdma_chunk, 128)


def check_data(check_x, recv_gbl_rank_prefix_sum):
    """Every row is constant and equals its source rank; rows are grouped by source rank."""
    assert torch.allclose(check_x.amin(dim=1), check_x.amax(dim=1))
    start = 0
    for i in range(recv_gbl_rank_prefix_sum.numel()):
        end = int(recv_gbl_rank_prefix_sum[i])
        assert int((check_x[start:end, :].int() - i).sum()) == 0, f"rows from rank {i}"
        start = end


def as_bf16(recv):
    return fp8_back(*recv) if isinstance(recv, tuple) else recv


def hash_output(recv):
    return sum(hash_tensor(t) for t in recv) if isinstance(recv, tuple) else hash_tensor(recv)


def test_layout_with_rdma_ranks(buffer):
    w = Workload(seed=0)
    per_rank, per_rdma_rank, per_expert, in_rank, _ = buffer.get_dispatch_layout(w.topk_idx, E)
    assert torch.equal(per_rank, w.per_rank)
    assert per_rdma_rank is not None, "num_tokens_per_rdma_rank across nodes"
    assert torch.equal(per_rdma_rank.to(torch.int), w.per_rdma_rank)
    assert torch.equal(per_expert, w.per_expert)
    assert torch.equal(in_rank, w.is_token_in_rank)


def run_case(buffer, w, name, current_x, is_rand, with_topk, async_mode, previous_mode):
    """One pass of DeepEP's inner loop; returns the hash of what it received and combined."""
    rank = w.rank
    config = deepep_config()
    value = 0
    args = dict(x=current_x, num_tokens_per_rank=w.per_rank, num_tokens_per_rdma_rank=w.per_rdma_rank,
                is_token_in_rank=w.is_token_in_rank, num_tokens_per_expert=w.per_expert, config=config,
                async_finish=async_mode)
    if with_topk:
        args.update(topk_idx=w.topk_idx, topk_weights=w.topk_weights_pure_rand if is_rand else w.topk_weights)
    if previous_mode:
        args.update(previous_event=buffer.capture())
    before, chunks_before = buffer.stats().rows_to_fabric, buffer.stats().chunks_to_fabric
    recv_x, recv_topk_idx, recv_topk_weights, per_expert_list, handle, event = buffer.dispatch(**args)
    if async_mode:
        event.current_stream_wait()
    # One fabric row per (token, other node it reaches), never one per rank.
    assert buffer.stats().rows_to_fabric - before == w.rows_to_other_nodes()
    # In chunks of the Config's num_max_rdma_chunked_send_tokens rows, as DeepEP's RDMA sends.
    if buffer.stats().internode == "hierarchical":
        chunks = buffer.stats().chunks_to_fabric - chunks_before
        assert chunks == w.fabric_chunks(config.num_max_rdma_chunked_send_tokens), chunks
    value += hash_output(recv_x)
    recv_x = as_bf16(recv_x)

    recv_gbl_rank_prefix_sum = handle[-4]
    assert int(w.gbl_per_rank[rank]) == recv_x.size(0)
    assert w.gbl_per_expert.view(w.R, -1)[rank].tolist() == per_expert_list
    if not is_rand:
        check_data(recv_x, recv_gbl_rank_prefix_sum)
    recv_topk_weights_clone = None
    if with_topk:
        local_experts = E // w.R
        assert int((recv_topk_idx.eq(-1) | ((recv_topk_idx >= 0) & (recv_topk_idx < local_experts))).sum()) \
            == recv_topk_idx.numel()
        for i, count in enumerate(per_expert_list):
            assert int(recv_topk_idx.eq(i).sum()) == count
        recv_topk_weights_clone = recv_topk_weights.clone()
        if not is_rand:
            fill = recv_topk_weights.amax(dim=1, keepdim=True).expand_as(recv_topk_weights)
            recv_topk_weights[recv_topk_idx.eq(-1)] = fill[recv_topk_idx.eq(-1)]
            check_data(recv_topk_weights, recv_gbl_rank_prefix_sum)

    if with_topk:  # num_worst_tokens: the same rows first, then padding
        worst = T * w.R
        worst_x, worst_idx, worst_weights, empty_list, _, event = buffer.dispatch(**args, num_worst_tokens=worst)
        if async_mode:
            event.current_stream_wait()
        worst_x = as_bf16(worst_x)
        assert len(empty_list) == 0
        assert worst == worst_x.size(0) == worst_idx.size(0) == worst_weights.size(0)
        assert torch.equal(recv_x, worst_x[: recv_x.size(0)])
        assert torch.equal(recv_topk_idx, worst_idx[: recv_x.size(0)])
        assert torch.equal(recv_topk_weights_clone, worst_weights[: recv_x.size(0)])
        assert bool(torch.all(worst_idx[recv_x.size(0):] == -1))
    else:  # cached dispatch through the handle (no top-k)
        cached_args = dict(x=current_x, handle=handle, config=config, async_finish=async_mode)
        if previous_mode:
            cached_args.update(previous_event=buffer.capture())
        cached_x, _, _, _, _, event = buffer.dispatch(**cached_args)
        if async_mode:
            event.current_stream_wait()
        assert torch.equal(as_bf16(cached_x), recv_x)

    # Combine with DeepEP's two biases.
    bias_0 = torch.ones((T, H), dtype=torch.bfloat16)
    bias_1 = torch.randn((T, H), dtype=torch.bfloat16)
    combine_args = dict(x=recv_x, bias=(bias_0, bias_1), handle=handle, config=config, async_finish=async_mode)
    if with_topk:
        combine_args.update(topk_weights=recv_topk_weights)
    if previous_mode:
        combine_args.update(previous_event=buffer.capture())
    combined_x, combined_topk_weights, event = buffer.combine(**combine_args)
    if async_mode:
        event.current_stream_wait()
    count = w.is_token_in_rank.sum(dim=1).unsqueeze(1)
    check_x = (combined_x.float() - bias_0.float() - bias_1.float()) / count
    ref_x = w.x_pure_rand if is_rand else w.x
    # DeepEP's line reads `assert calc_diff(...) < 5e-4 if <FP8 random> else 5e-6`, which Python
    # parses as asserting the constant 5e-6 for every other input; this checks what it means.
    # Bounds: one BF16 rounding of the biased sum (up to 3 bits of 8 lost against the bias).
    bound = 5e-4 if name == "rand_fp8" else 5e-5
    assert calc_diff(check_x, ref_x) < bound, (name, calc_diff(check_x, ref_x))
    if with_topk:
        check_w = combined_topk_weights if is_rand else combined_topk_weights / count
        ref_w = w.topk_weights_pure_rand if is_rand else w.topk_weights
        assert calc_diff(check_w, ref_w) < 1e-9
    value += hash_tensor(recv_x)
    return value, handle


@pytest.mark.parametrize("previous_mode", [False, True])
@pytest.mark.parametrize("async_mode", [False, True])
def test_dispatch_combine(buffer, previous_mode, async_mode):
    w = Workload(seed=0)
    for name, current_x, is_rand in w.inputs():
        for with_topk in (False, True):
            run_case(buffer, w, name, current_x, is_rand, with_topk, async_mode, previous_mode)


def test_tuning_sweep_keeps_outputs(buffer):
    """DeepEP's tuning loop: dispatch through the handle with NVL chunks 4..44 and RDMA chunks
    4..32 (a sample here), combine with NVL chunks 1..7 and RDMA chunks 12..32; every config must
    give the same rows and sums (chunk sizes change how rows travel, never what arrives)."""
    w = Workload(seed=0)
    recv_x, _, _, _, handle, _ = buffer.dispatch(
        x=w.x_pure_rand, num_tokens_per_rank=w.per_rank, num_tokens_per_rdma_rank=w.per_rdma_rank,
        is_token_in_rank=w.is_token_in_rank, num_tokens_per_expert=w.per_expert, config=deepep_config())
    fp8_x = buffer.dispatch(x=w.x_e4m3, handle=handle, config=deepep_config())[0]
    combined = buffer.combine(x=recv_x, handle=handle, config=deepep_config())[0]
    for nvl_chunk, rdma_chunk in [(4, 4), (20, 12), (44, 32)]:
        config = deepep_config(nvl_chunk, rdma_chunk)
        assert torch.equal(buffer.dispatch(x=w.x_pure_rand, handle=handle, config=config)[0], recv_x)
        again = buffer.dispatch(x=w.x_e4m3, handle=handle, config=config)[0]
        assert all(torch.equal(a, b) for a, b in zip(again, fp8_x))
    for nvl_chunk, rdma_chunk in [(1, 12), (4, 20), (7, 32)]:
        config = deepep_config(nvl_chunk, rdma_chunk)
        assert torch.equal(buffer.combine(x=recv_x, handle=handle, config=config)[0], combined)


def test_pressure_mode_repeats_bit_for_bit(buffer):
    """DeepEP's pressure mode: the same seed again gives the same hash of every output."""

    def one_pass():
        w = Workload(seed=7)
        value = 0
        for name, current_x, is_rand in w.inputs():
            for with_topk in (False, True):
                value += run_case(buffer, w, name, current_x, is_rand, with_topk, False, False)[0]
        return value

    assert one_pass() == one_pass()
