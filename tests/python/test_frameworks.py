"""The call sequences of the frameworks that drive DeepEP (docs/DEEPEP_CONTRACT.md section 7),
replayed through `deep_ep`: Megatron-LM's fused dispatch/combine autograd functions (backward
through combine and cached dispatch, gradients checked), SGLang's normal <-> low-latency switching
on one Buffer with Config(**json), and vLLM's gloo CPU group with explicitly_destroy, async
dispatch and `event.event is not None`."""

import json

import pytest
import torch
import torch.distributed as dist

import deep_ep
from deep_ep.utils import EventHandle, EventOverlap
from conftest import calc_diff

T, H, K, E = 48, 512, 4, 8


def routing(rank, seed):
    g = torch.Generator().manual_seed(seed * 31 + rank)
    probs = torch.softmax(torch.randn(T, E, generator=g), dim=-1)
    weights, idx = torch.topk(probs, K, dim=-1)
    return idx, weights.float(), torch.randn(T, H, generator=g).to(torch.bfloat16)


# ---- Megatron-LM: fused_a2a.py's autograd functions, as its flex dispatcher calls them ----

_buffer = None


def get_buffer(group, hidden_bytes):
    global _buffer
    nvl, rdma = 0, 0
    size = group.size()
    for config in (deep_ep.Buffer.get_dispatch_config(size), deep_ep.Buffer.get_combine_config(size)):
        nvl = max(config.get_nvl_buffer_size_hint(hidden_bytes, size), nvl)
        rdma = max(config.get_rdma_buffer_size_hint(hidden_bytes, size), rdma)
    if _buffer is None or _buffer.group != group or _buffer.num_nvl_bytes < nvl or _buffer.num_rdma_bytes < rdma:
        _buffer = deep_ep.Buffer(group, nvl, rdma)
    return _buffer


class FusedDispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, token_indices, token_probs, num_experts, group, async_finish=False):
        previous_event = EventOverlap(EventHandle()) if async_finish else None
        buffer = get_buffer(group, x.shape[-1] * max(x.element_size(), 2))
        per_rank, per_rdma_rank, per_expert, in_rank, event = buffer.get_dispatch_layout(
            token_indices, num_experts, previous_event=previous_event, async_finish=async_finish,
            allocate_on_comm_stream=False)
        recv_x, recv_idx, recv_probs, per_expert_list, handle, after = buffer.dispatch(
            x, topk_idx=token_indices, topk_weights=token_probs, num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, previous_event=event, async_finish=async_finish,
            allocate_on_comm_stream=False)
        if async_finish:
            after.current_stream_wait()
        ctx.group, ctx.handle, ctx.async_finish = group, handle, async_finish
        return recv_x, recv_idx, recv_probs, torch.tensor(per_expert_list), handle

    @staticmethod
    def backward(ctx, grad_x, grad_idx, grad_probs, grad_tokens_per_expert, grad_handle):
        buffer = get_buffer(ctx.group, grad_x.shape[-1] * 2)
        grad, grad_probs_out, event = buffer.combine(
            grad_x.contiguous(), ctx.handle, topk_weights=grad_probs.float(), previous_event=None,
            async_finish=ctx.async_finish, allocate_on_comm_stream=False)
        if ctx.async_finish:
            event.current_stream_wait()
        return grad, None, grad_probs_out, None, None, None


class FusedCombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, handle, async_finish=False):
        buffer = get_buffer(group, x.shape[-1] * 2)
        combined, _, event = buffer.combine(x, handle=handle, async_finish=async_finish, previous_event=None,
                                            allocate_on_comm_stream=False)
        if async_finish:
            event.current_stream_wait()
        ctx.group, ctx.handle, ctx.async_finish = group, handle, async_finish
        return combined

    @staticmethod
    def backward(ctx, grad_output):
        buffer = get_buffer(ctx.group, grad_output.shape[-1] * 2)
        grad_x, _, _, _, _, event = buffer.dispatch(grad_output.contiguous(), handle=ctx.handle,
                                                    previous_event=None, async_finish=ctx.async_finish,
                                                    allocate_on_comm_stream=False)
        if ctx.async_finish:
            event.current_stream_wait()
        return grad_x, None, None, None


@pytest.mark.parametrize("async_finish", [False, True])
def test_megatron_fused_dispatch_and_combine_gradients(async_finish):
    deep_ep.Buffer.set_num_sms(24)
    try:
        assert deep_ep.Buffer.num_sms == 24
        megatron_round(async_finish)
    finally:
        deep_ep.Buffer.set_num_sms(20)


def megatron_round(async_finish):
    rank, R = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    idx, probs, x = routing(rank, seed=1)
    x = x.float().requires_grad_()
    probs = probs.requires_grad_()
    x_bf16 = x.to(torch.bfloat16)
    recv_x, recv_idx, recv_probs, tokens_per_expert, handle = FusedDispatch.apply(
        x_bf16, idx, probs, E, group, async_finish)
    # Experts: each received row scaled by the sum of the probabilities of this rank's experts
    # (slots of other ranks' experts, -1 in recv_idx, take no part, as in Megatron's permute).
    scale = (recv_probs * (recv_idx >= 0)).sum(dim=1, keepdim=True)
    expert_out = (recv_x.float() * scale).to(torch.bfloat16)
    out = FusedCombine.apply(expert_out, group, handle, async_finish)
    # Dense reference: every rank the token went to adds x times the probs of its experts there,
    # so the sum over ranks is x * (sum of all top-k probs).
    reference = x.detach() * probs.detach().sum(dim=1, keepdim=True)
    assert calc_diff(out.float(), reference) < 1e-4
    assert tokens_per_expert.sum() == (recv_idx >= 0).sum()
    loss = (out.float() * torch.arange(H, dtype=torch.float32)).sum()
    loss.backward()
    w = torch.arange(H, dtype=torch.float32)
    # d loss / d x = sum(probs) * w per token; d loss / d prob_k = x . w
    assert calc_diff(x.grad, probs.detach().sum(dim=1, keepdim=True) * w) < 1e-4
    expected_probs_grad = (x.detach().to(torch.bfloat16).float() * w).sum(dim=1, keepdim=True).expand(-1, K)
    assert calc_diff(probs.grad, expected_probs_grad) < 1e-4


# ---- SGLang: one Buffer, normal for prefill and low-latency for decode ----

def test_sglang_normal_and_low_latency_switching():
    rank, R = dist.get_rank(), dist.get_world_size()
    config_json = json.dumps({
        "normal_dispatch": {"num_sms": 24, "num_max_nvl_chunked_send_tokens": 16,
                            "num_max_nvl_chunked_recv_tokens": 256, "num_max_rdma_chunked_send_tokens": 6,
                            "num_max_rdma_chunked_recv_tokens": 128},
        "normal_combine": {"num_sms": 24, "num_max_nvl_chunked_send_tokens": 6,
                           "num_max_nvl_chunked_recv_tokens": 256, "num_max_rdma_chunked_send_tokens": 6,
                           "num_max_rdma_chunked_recv_tokens": 128}})
    parsed = json.loads(config_json)
    dispatch_config = deep_ep.Config(**parsed["normal_dispatch"])
    combine_config = deep_ep.Config(**parsed["normal_combine"])
    assert dispatch_config.num_max_nvl_chunked_send_tokens == 16
    num_sms = deep_ep.Buffer.num_sms
    assert num_sms == 20
    hidden_bytes = H * 2
    nvl = max(dispatch_config.get_nvl_buffer_size_hint(hidden_bytes, R),
              combine_config.get_nvl_buffer_size_hint(hidden_bytes, R))
    rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)
    buffer = deep_ep.Buffer(dist.group.WORLD, nvl, rdma, low_latency_mode=True,
                            num_qps_per_rank=max(num_sms, E // R), allow_mnnvl=True)
    assert buffer.low_latency_mode and buffer.group_size == R
    idx, weights, x = routing(rank, seed=2)
    for phase in ("extend", "decode", "extend", "decode"):
        if phase == "extend":
            previous = deep_ep.Buffer.capture()
            per_rank, per_rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(
                idx, E, previous_event=previous, async_finish=True, allocate_on_comm_stream=True)
            recv_x, recv_idx, recv_w, per_expert_list, handle, event = buffer.dispatch(
                x, topk_idx=idx, topk_weights=weights, num_tokens_per_rank=per_rank,
                num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                previous_event=event, async_finish=True, allocate_on_comm_stream=True, expert_alignment=128,
                config=dispatch_config)
            event.current_stream_wait()
            assert all(n % 128 == 0 for n in per_expert_list)
            combined, _, event = buffer.combine(recv_x, handle, async_finish=True, previous_event=event,
                                                allocate_on_comm_stream=True, config=combine_config)
            event.current_stream_wait()
            dest = in_rank.sum(dim=1, keepdim=True)
            assert calc_diff(combined.float() / dest, x.float()) < 5e-6
        else:
            buffer.clean_low_latency_buffer(T, H, E)
            recv, count, handle, event, hook = buffer.low_latency_dispatch(
                x, idx, T, E, use_fp8=False, async_finish=False, return_recv_hook=True)
            hook()
            combined, event, hook = buffer.low_latency_combine(
                x=recv, topk_idx=idx, topk_weights=weights, handle=handle, async_finish=False,
                return_recv_hook=True)
            hook()
            reference = x.float() * weights.sum(dim=1, keepdim=True)
            assert calc_diff(combined.float(), reference) < 1e-5


# ---- vLLM: a gloo CPU group, explicitly destroyed Buffers, async HT dispatch, LL with out= ----

def test_vllm_high_throughput_and_low_latency_on_a_cpu_group():
    rank, R = dist.get_rank(), dist.get_world_size()
    cpu_group = dist.new_group(list(range(R)), backend="gloo")
    deep_ep.Buffer.set_num_sms(20)
    ht = deep_ep.Buffer(group=cpu_group, num_nvl_bytes=8 << 20, num_rdma_bytes=0, low_latency_mode=False,
                        num_qps_per_rank=1, explicitly_destroy=True)
    idx, weights, x = routing(rank, seed=3)
    config = deep_ep.Buffer.get_dispatch_config(R) if R in (2, 4, 8, 16, 24, 32, 64, 128, 144, 160) else None
    per_rank, per_rdma, per_expert, in_rank, _ = ht.get_dispatch_layout(
        topk_idx=idx, num_experts=E, previous_event=None, async_finish=False, allocate_on_comm_stream=False)
    recv_x, recv_idx, recv_w, per_expert_list, handle, event = ht.dispatch(
        x=x, handle=None, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=weights,
        expert_alignment=1, config=config, previous_event=None, async_finish=True, allocate_on_comm_stream=False)
    assert event.event is not None
    event.current_stream_wait()
    # finalize: apply the top-k weights of this rank's experts, then combine without weights
    local = E // R
    scale = torch.where(recv_idx >= 0, recv_w, torch.zeros_like(recv_w)).sum(dim=1, keepdim=True)
    expert_out = (recv_x.float() * scale).to(torch.bfloat16)
    combined, _, event = ht.combine(x=expert_out, handle=handle, topk_weights=None, config=None,
                                    previous_event=None, async_finish=True, allocate_on_comm_stream=False)
    event.current_stream_wait()
    assert calc_diff(combined.float(), x.float() * weights.sum(dim=1, keepdim=True)) < 1e-4
    assert local * R == E
    ht.destroy()
    with pytest.raises(deep_ep.ProxyEPError, match="destroyed"):
        ht.get_dispatch_layout(idx, E)

    ll = deep_ep.Buffer(group=cpu_group, num_nvl_bytes=0,
                        num_rdma_bytes=deep_ep.Buffer.get_low_latency_rdma_size_hint(
                            num_max_dispatch_tokens_per_rank=T, hidden=H, num_ranks=R, num_experts=E),
                        low_latency_mode=True, num_qps_per_rank=E // R, allow_nvlink_for_low_latency_mode=True,
                        allow_mnnvl=False, explicitly_destroy=True)
    recv, count, handle, event, hook = ll.low_latency_dispatch(
        x, idx, T, E, use_fp8=True, round_scale=False, use_ue8m0=False, async_finish=False,
        return_recv_hook=True)
    hook()
    data, scales = recv
    values = e4m3_values(data, scales)
    output = torch.empty(T, H, dtype=torch.bfloat16)
    combined, event, hook = ll.low_latency_combine(values.to(torch.bfloat16), idx, weights, handle,
                                                   async_finish=False, zero_copy=False, return_recv_hook=True,
                                                   out=output)
    hook()
    assert combined is output
    assert calc_diff(output.float(), x.float() * weights.sum(dim=1, keepdim=True)) < 9e-4
    ll.destroy()
    dist.destroy_process_group(cpu_group)


def e4m3_values(data, scales):
    from conftest import e4m3_decode
    local, rows, hidden = data.shape
    return (e4m3_decode(data).view(local, rows, hidden // 128, 128) * scales.unsqueeze(-1)).view(local, rows, hidden)
