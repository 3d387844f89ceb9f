"""The framework adapters (python/proxyep/adapters, docs/ADAPTERS.md), each driven with its
framework's sequence of calls (docs/DEEPEP_CONTRACT.md section 7):

* Megatron-LM (``proxyep.adapters.megatron``): the flex dispatcher's DeepEP manager: router top-k
  with capacity-dropped slots (-1) -> ``fused_dispatch`` (Megatron-core 0.17's
  ``async_finish=True, allocate_on_comm_stream=True``, and the synchronous form) -> multihot over
  the local experts -> permute -> experts -> unpermute with the probs -> ``fused_combine`` ->
  backward; ``set_deepep_num_sms``, ``get_buffer``'s caching.
* SGLang (``proxyep.adapters.sglang``): ``dispatch_a/dispatch_b/combine_a/combine_b`` in normal
  mode (async_finish), low-latency mode (hook and event) and auto mode switching extend <-> decode
  on one Buffer (ranks with different batch sizes resolve the same mode).
* vLLM (``proxyep.adapters.vllm``): high-throughput and low-latency prepare/finalize on a gloo CPU
  group with explicitly destroyed Buffers.

The experts are a per-expert scale s_e = 1 + e/8 (exact in bf16). Every rank regenerates every
rank's seeded batch, so it checks both what it received (rows, ids, weights, per-expert counts,
against all ranks' routing) and its combined output: out_t = sum_k p_tk s_{e_tk} x_t over the
slots not dropped, computed in float64. Bounds: the received rows exactly; the output per element
within 2^-7 (sum_k |p_tk s_tk x_t| + |out_t|) + 1e-6 (each rank's part or each expert output is
rounded to bf16 once, the sum once more: half an ulp, 2^-8 relative, each); gradients (Megatron)
within 2^-6 relative error in norm (three bf16 roundings on each path, as test_moe.py)."""

import pytest
import torch
import torch.distributed as dist

import deep_ep
from proxyep.adapters import megatron, sglang, vllm

H, K = 512, 4
FORWARD_REL = 2.0**-7
GRAD_REL = 2.0**-6


def num_experts():
    return 4 * dist.get_world_size()


def scales(E):
    return torch.tensor([1 + e / 8 for e in range(E)], dtype=torch.float32)


def batch(rank, seed, tokens):
    """(x bf16 [T, H], topk_idx int64 [T, K] with some -1, probs float32 [T, K] (0 at -1),
    upstream gradient G float32 [T, H]) of ``rank``, the same on every rank."""
    E = num_experts()
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    logits = torch.randn(tokens, E, generator=g)
    probs, idx = torch.topk(torch.softmax(logits, dim=-1), K, dim=-1)
    drop = torch.rand(tokens, K, generator=g) < 0.1  # capacity-dropped slots
    idx = torch.where(drop, torch.full_like(idx, -1), idx)
    probs = torch.where(drop, torch.zeros_like(probs), probs)
    x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
    return x, idx, probs.float(), torch.randn(tokens, H, generator=g)


def tokens_of(rank, seed, varied=True):
    return 24 + 8 * ((rank + seed) % 2) if varied else 24


def reference(x, idx, probs, E):
    """(out float64 [T, H], sum_k |p s x| float64 [T, H])."""
    s = scales(E).double()
    valid = idx >= 0
    coef = torch.where(valid, probs.double() * s[idx.clamp(min=0)], torch.zeros_like(probs.double()))
    xd = x.double()
    return xd * coef.sum(dim=1, keepdim=True), xd.abs() * coef.abs().sum(dim=1, keepdim=True)


def check_output(out, x, idx, probs, E):
    ref, magnitude = reference(x, idx, probs, E)
    bound = FORWARD_REL * (magnitude + ref.abs()) + 1e-6
    excess = (out.double() - ref).abs() - bound
    assert float(excess.max()) <= 0, f"combined output off by {float(excess.max())} over the bound"


def expected_received(seed, tokens_for=None):
    """What this rank receives in normal mode: every rank's tokens with an expert here, in source
    rank then token order: (x rows, local ids (-1 elsewhere), weights (0 elsewhere), per local
    expert counts)."""
    rank, R = dist.get_rank(), dist.get_world_size()
    E = num_experts()
    local = E // R
    lo = rank * local
    xs, ids, ws = [], [], []
    counts = torch.zeros(local, dtype=torch.int64)
    for r in range(R):
        x, idx, probs, _ = batch(r, seed, tokens_for(r) if tokens_for else tokens_of(r, seed))
        mine = (idx >= lo) & (idx < lo + local)
        rows = mine.any(dim=1)
        xs.append(x[rows])
        ids.append(torch.where(mine, idx - lo, torch.full_like(idx, -1))[rows])
        ws.append(torch.where(mine, probs, torch.zeros_like(probs))[rows])
        counts += torch.bincount((idx[mine] - lo).reshape(-1), minlength=local)
    return torch.cat(xs), torch.cat(ids), torch.cat(ws), counts


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


# ---- Megatron-LM ----


@pytest.mark.parametrize("async_finish", [True, False])
def test_megatron_flex_dispatcher_sequence(async_finish):
    rank, R = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    E = num_experts()
    local = E // R
    seed = 11 if async_finish else 12
    megatron.set_deepep_num_sms(24)
    try:
        assert deep_ep.Buffer.num_sms == 24
        x_bf16, idx, probs, G = batch(rank, seed, tokens_of(rank, seed))
        x = x_bf16.float().requires_grad_()
        token_probs = probs.clone().requires_grad_()
        expert_scale = torch.nn.Parameter(scales(E)[rank * local:(rank + 1) * local].clone())

        hidden = x.to(torch.bfloat16)
        recv_x, recv_idx, recv_probs, tokens_per_expert, handle = megatron.fused_dispatch(
            hidden, idx, token_probs, E, group, async_finish=async_finish,
            allocate_on_comm_stream=async_finish)
        # The token dispatcher: indices -> multihot routing map / probs over the local experts.
        valid = recv_idx >= 0
        routing_map = torch.zeros(recv_x.shape[0], local, dtype=torch.bool)
        routing_map[valid.nonzero(as_tuple=True)[0], recv_idx[valid]] = True
        multihot_probs = torch.zeros(recv_x.shape[0], local).index_put(
            (valid.nonzero(as_tuple=True)[0], recv_idx[valid]), recv_probs[valid])
        assert tokens_per_expert.dtype == torch.int64
        assert torch.equal(tokens_per_expert, routing_map.sum(dim=0))
        # permute -> experts (scale) -> unpermute weighted by the probs
        out_rows = torch.zeros(recv_x.shape[0], H)
        for e in range(local):
            rows = routing_map[:, e].nonzero(as_tuple=True)[0]
            y = recv_x[rows].float() * expert_scale[e]
            out_rows = out_rows.index_add(0, rows, y * multihot_probs[rows, e].unsqueeze(1))
        combined, second = megatron.fused_combine(out_rows.to(torch.bfloat16), group, handle,
                                                  async_finish=async_finish,
                                                  allocate_on_comm_stream=async_finish)
        assert second is None and combined.dtype == torch.bfloat16
        (combined.float() * G).sum().backward()

        exp_x, exp_ids, exp_w, exp_counts = expected_received(seed)
        assert torch.equal(recv_x, exp_x)
        assert torch.equal(recv_idx, exp_ids)
        assert torch.equal(recv_probs.detach(), exp_w)
        assert torch.equal(tokens_per_expert, exp_counts)
        check_output(combined, x_bf16, idx, probs, E)

        # Gradients: d/dx_t = sum_k p s G_t; d/dp_tk = s_k (x_t . G_t) (0 when dropped);
        # d/ds_e = sum over every rank's slots on e of p (x . G).
        s = scales(E).double()
        valid_own = idx >= 0
        coef = torch.where(valid_own, probs.double() * s[idx.clamp(min=0)], torch.zeros(idx.shape).double())
        assert rel_err(x.grad, G.double() * coef.sum(dim=1, keepdim=True)) <= GRAD_REL
        xg = (x_bf16.double() * G.double()).sum(dim=1, keepdim=True)
        expected_pgrad = torch.where(valid_own, s[idx.clamp(min=0)] * xg, torch.zeros(idx.shape).double())
        assert rel_err(token_probs.grad, expected_pgrad) <= GRAD_REL
        expected_sgrad = torch.zeros(local, dtype=torch.float64)
        for r in range(R):
            xr, idr, pr, Gr = batch(r, seed, tokens_of(r, seed))
            xgr = (xr.double() * Gr.double()).sum(dim=1)
            for e in range(local):
                hit = idr == rank * local + e
                expected_sgrad[e] += (pr.double() * hit * xgr.unsqueeze(1)).sum()
        assert rel_err(expert_scale.grad, expected_sgrad) <= GRAD_REL
    finally:
        megatron.set_deepep_num_sms(20)


def test_megatron_buffer_helper():
    group = dist.group.WORLD
    megatron.reset_buffer()
    x = torch.zeros(4, H, dtype=torch.bfloat16)
    assert megatron.get_hidden_bytes(x) == H * 2
    assert megatron.get_hidden_bytes(x.float()) == H * 4
    first = megatron.get_buffer(group, megatron.get_hidden_bytes(x))
    assert megatron.get_buffer(group, megatron.get_hidden_bytes(x)) is first
    size = dist.get_world_size()
    hint = max(deep_ep.Buffer.get_dispatch_config(size).get_nvl_buffer_size_hint(H * 2, size),
               deep_ep.Buffer.get_combine_config(size).get_nvl_buffer_size_hint(H * 2, size))
    assert first.num_nvl_bytes == hint
    # Larger rows: a larger Buffer (collective), then cached again.
    bigger = megatron.get_buffer(group, H * 8)
    assert bigger is not first and bigger.num_nvl_bytes >= first.num_nvl_bytes
    assert megatron.get_buffer(group, H * 2) is bigger
    assert megatron.hybrid_ep_dispatch is None and megatron.hybrid_ep_combine is None
    with pytest.raises(TypeError, match="bf16"):
        megatron.fused_dispatch(x.float(), torch.zeros(4, K, dtype=torch.int64), torch.ones(4, K),
                                num_experts(), group)
    megatron.reset_buffer()


# ---- SGLang ----


def sglang_dispatcher(mode, **kwargs):
    R = dist.get_world_size()
    E = num_experts()
    return sglang.DeepEPDispatcher(dist.group.WORLD, router_topk=K, num_experts=E, num_local_experts=E // R,
                                   hidden_size=H, params_dtype=torch.bfloat16, deepep_mode=mode,
                                   num_max_dispatch_tokens_per_rank=32, **kwargs)


def sglang_round(dispatcher, seed, tokens_for=None):
    """One dispatch -> experts -> combine through the two-phase calls; returns the mode used.
    ``tokens_for(rank)``: every rank's batch size (default tokens_of)."""
    rank, R = dist.get_rank(), dist.get_world_size()
    E = num_experts()
    local = E // R
    s_local = scales(E)[rank * local:(rank + 1) * local]
    tokens_for = tokens_for or (lambda r: tokens_of(r, seed))
    T = tokens_for(rank)
    x, idx, probs, _ = batch(rank, seed, T)
    dispatcher.dispatch_a(x, sglang.TopKOutput(probs, idx))
    out = dispatcher.dispatch_b()
    if isinstance(out, sglang.DeepEPNormalDispatchOutput):
        exp_x, exp_ids, exp_w, exp_counts = expected_received(seed, tokens_for)
        assert torch.equal(out.hidden_states, exp_x) and torch.equal(out.topk_ids, exp_ids)
        assert torch.equal(out.topk_weights, exp_w)
        assert out.num_recv_tokens_per_expert == exp_counts.tolist()
        valid = out.topk_ids >= 0
        coef = torch.where(valid, out.topk_weights * s_local[out.topk_ids.clamp(min=0)],
                           torch.zeros_like(out.topk_weights))
        y = (out.hidden_states.float() * coef.sum(dim=1, keepdim=True)).to(torch.bfloat16)
        combine_input = sglang.DeepEPNormalCombineInput(y, out.topk_ids, out.topk_weights)
    else:
        assert isinstance(out, sglang.DeepEPLLDispatchOutput)
        assert out.hidden_states.shape == (local, R * 32, H) and out.hidden_states_scale is None
        _, _, _, exp_counts = expected_received(seed, tokens_for)
        assert out.masked_m.tolist() == exp_counts.tolist()
        y = torch.zeros_like(out.hidden_states)
        for e in range(local):
            m = int(out.masked_m[e])
            y[e, :m] = (out.hidden_states[e, :m].float() * s_local[e]).to(torch.bfloat16)
        combine_input = sglang.DeepEPLLCombineInput(y, out.topk_ids, out.topk_weights)
    dispatcher.combine_a(combine_input)
    combined = dispatcher.combine_b()
    assert combined.shape == (T, H)
    check_output(combined, x, idx, probs, E)
    return dispatcher.resolved_mode


@pytest.fixture
def fresh_sglang_buffer():
    sglang.DeepEPBuffer.reset()
    sglang.DeepEPConfig.set_instance(None)
    yield
    sglang.DeepEPBuffer.reset()


def test_sglang_normal_mode(fresh_sglang_buffer):
    sglang.DeepEPConfig.set_instance({
        "normal_dispatch": {"num_sms": 24, "num_max_nvl_chunked_send_tokens": 16,
                            "num_max_nvl_chunked_recv_tokens": 256, "num_max_rdma_chunked_send_tokens": 6,
                            "num_max_rdma_chunked_recv_tokens": 128},
        "normal_combine": {"num_sms": 24, "num_max_nvl_chunked_send_tokens": 6,
                           "num_max_nvl_chunked_recv_tokens": 256, "num_max_rdma_chunked_send_tokens": 6,
                           "num_max_rdma_chunked_recv_tokens": 128}})
    dispatcher = sglang_dispatcher("normal", async_finish=True)
    for seed in (21, 22):
        assert sglang_round(dispatcher, seed) == sglang.DeepEPMode.NORMAL
    assert not sglang.DeepEPBuffer._buffer.low_latency_mode
    with pytest.raises(AssertionError, match="out of order"):
        dispatcher.combine_b()


@pytest.mark.parametrize("return_recv_hook", [True, False])
def test_sglang_low_latency_mode(fresh_sglang_buffer, return_recv_hook):
    dispatcher = sglang_dispatcher("low_latency", return_recv_hook=return_recv_hook)
    for seed in (31, 32):
        assert sglang_round(dispatcher, seed) == sglang.DeepEPMode.LOW_LATENCY
    buffer = sglang.DeepEPBuffer._buffer
    assert buffer.low_latency_mode
    assert buffer.num_rdma_bytes == deep_ep.Buffer.get_low_latency_rdma_size_hint(
        32, H, dist.get_world_size(), num_experts())


def test_sglang_auto_mode_switches_extend_and_decode(fresh_sglang_buffer):
    dispatcher = sglang_dispatcher("auto")
    # Extend: one rank has more tokens than num_max_dispatch_tokens_per_rank (40 > 32), so every
    # rank resolves normal mode, the small one included.
    modes = []
    for step, seed in enumerate((41, 42, 43, 44)):
        if step % 2 == 0:
            tokens_for = lambda r: 40 if r == 0 else 8  # noqa: E731
        else:
            tokens_for = lambda r: 16 + r  # noqa: E731
        modes.append(sglang_round(dispatcher, seed, tokens_for))
    N, LL = sglang.DeepEPMode.NORMAL, sglang.DeepEPMode.LOW_LATENCY
    assert modes == [N, LL, N, LL]
    # SGLang's global flag wins over the batch sizes.
    dispatcher.set_is_extend_in_batch(True)
    assert sglang_round(dispatcher, 45, lambda r: 8) == N
    dispatcher.set_is_extend_in_batch(False)
    assert sglang_round(dispatcher, 46, lambda r: 8) == LL


# ---- vLLM ----


def test_vllm_high_throughput_and_low_latency_prepare_finalize():
    rank, R = dist.get_rank(), dist.get_world_size()
    E = num_experts()
    local = E // R
    s_local = scales(E)[rank * local:(rank + 1) * local]
    cpu_group = dist.new_group(list(range(R)), backend="gloo")
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    expert_map[rank * local:(rank + 1) * local] = torch.arange(local, dtype=torch.int32)

    ht = vllm.make_ht_buffer(cpu_group, buffer_size_mb=8, num_sms=20)
    pf = vllm.DeepEPHTPrepareAndFinalize(ht, num_dispatchers=R, dp_size=R, rank_expert_offset=rank * local)
    assert pf.topk_indices_dtype() == torch.int64 and pf.max_num_tokens_per_rank() is None
    for seed, reduced in ((51, False), (52, True)):
        x, idx, probs, _ = batch(rank, seed, tokens_of(rank, seed))
        expert_x, scale, meta, ids, weights = pf.prepare(x, probs, idx, E, expert_map, False)
        exp_x, exp_ids, exp_w, exp_counts = expected_received(seed)
        assert scale is None and torch.equal(expert_x, exp_x) and torch.equal(weights, exp_w)
        assert meta.expert_num_tokens.tolist() == exp_counts.tolist() == meta.expert_num_tokens_cpu
        local_ids = expert_map[ids].long()  # global ids (with vLLM's placeholder) through the map
        assert torch.equal(local_ids, exp_ids)
        # Standard-format experts: one output per (row, slot), zero for other ranks' experts.
        per_slot = torch.where((local_ids >= 0).unsqueeze(-1),
                               expert_x.float().unsqueeze(1) * s_local[local_ids.clamp(min=0)].unsqueeze(-1),
                               torch.zeros(1))
        if reduced:  # experts that weight and reduce themselves
            fused = (per_slot * weights.unsqueeze(-1)).sum(dim=1).to(torch.bfloat16)
        else:
            fused = per_slot.to(torch.bfloat16)
        output = torch.empty(x.shape[0], H, dtype=torch.bfloat16)
        pf.finalize(output, fused, weights, ids, False)
        check_output(output, x, idx, probs, E)
    with pytest.raises(NotImplementedError):
        pf.prepare(x, probs, idx, E, expert_map, True)
    ht.destroy()

    T = 32
    ll = vllm.make_ll_buffer(cpu_group, T, H, R, E)
    pf = vllm.DeepEPLLPrepareAndFinalize(ll, max_tokens_per_rank=T, num_dispatchers=R)
    for seed in (61, 62):
        x, idx, probs, _ = batch(rank, seed, tokens_of(rank, seed))
        expert_x, scale, meta, ids, weights = pf.prepare(x, probs, idx, E, expert_map, False)
        assert ids is None and weights is None and scale is None
        assert expert_x.shape == (local, R * T, H)
        _, _, _, exp_counts = expected_received(seed)
        assert meta.expert_num_tokens.tolist() == exp_counts.tolist()
        fused = torch.zeros_like(expert_x)
        for e in range(local):
            m = int(meta.expert_num_tokens[e])
            fused[e, :m] = (expert_x[e, :m].float() * s_local[e]).to(torch.bfloat16)
        output = torch.empty(x.shape[0], H, dtype=torch.bfloat16)
        pf.finalize(output, fused, probs, idx, False)
        check_output(output, x, idx, probs, E)
    ll.destroy()
    dist.destroy_process_group(cpu_group)
