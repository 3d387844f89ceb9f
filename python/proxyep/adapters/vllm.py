"""vLLM-shaped DeepEP prepare/finalize on ProxyEP (vLLM's
``fused_moe/deepep_ht_prepare_finalize.py``, ``deepep_ll_prepare_finalize.py`` and the Buffer
arguments of ``device_communicators/all2all.py``; docs/DEEPEP_CONTRACT.md 7.3, docs/ADAPTERS.md).

* :func:`make_ht_buffer` / :func:`make_ll_buffer`: the Buffers vLLM's ``DeepEPHTAll2AllManager``
  / ``DeepEPLLAll2AllManager`` build on the (gloo) CPU group, ``explicitly_destroy=True`` (call
  ``destroy()`` collectively at shutdown).
* :class:`DeepEPHTPrepareAndFinalize` (``--all2all-backend deepep_high_throughput``, normal
  mode): ``prepare(a1, topk_weights, topk_ids, num_experts, expert_map,
  apply_router_weight_on_input, quant_config=None)`` -> ``(expert_x, expert_x_scale,
  expert_tokens_meta, expert_topk_ids, expert_topk_weights)``: layout + dispatch (async_finish
  then wait, as vLLM outside DBO), the received local ids turned back into global ids (vLLM's
  placeholder for -1: ``num_experts - 1`` on the rank whose experts start at 0, else 0, which the
  ``expert_map`` maps to -1); ``finalize(output, fused_expert_output, topk_weights, topk_ids,
  apply_router_weight_on_input, weight_and_reduce_impl=None)``: a ``[rows, topk, H]`` expert
  output is weighted by ``topk_weights`` and summed over the top-k here (vLLM's
  ``TopKWeightAndReduceContiguous``), a ``[rows, H]`` one is taken as already reduced; then
  ``combine(topk_weights=None)`` and ``output.copy_``.
* :class:`DeepEPLLPrepareAndFinalize` (``deepep_low_latency``): ``prepare`` ->
  ``low_latency_dispatch(a1, topk_ids, max_tokens_per_rank, num_experts, use_fp8=...,
  async_finish=False, return_recv_hook=True)`` then ``hook()`` -> ``(expert_x [E_local,
  R*T, H] (or the FP8 pair's data), scales, meta(expert_num_tokens=recv_count), None, None)``;
  ``finalize`` -> ``low_latency_combine(fused_expert_output, topk_ids, topk_weights, handle,
  async_finish=False, zero_copy=False, return_recv_hook=True, out=output)`` then ``hook()``.

Not covered: quantisation configs (FP8 / block scales in HT prepare; LL's FP8 is ``use_fp8``),
``apply_router_weight_on_input`` (refused), DBO micro-batching and the async
``prepare_async`` / ``finalize_async`` receivers, vLLM's hidden padding (HT: to 512 bytes; LL: up
to a supported hidden size: pass a supported hidden), ``deepep_v2`` (ElasticBuffer). Tested with CPU tensors only.
"""

import os
from dataclasses import dataclass
from typing import Optional

import deep_ep
import torch

_CONFIG_RANKS = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)


@dataclass
class ExpertTokensMetadata:
    """vLLM's ``mk.ExpertTokensMetadata``: tokens per local expert (tensor, and as a list)."""

    expert_num_tokens: torch.Tensor
    expert_num_tokens_cpu: Optional[list] = None


def _internode(group):
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return local is not None and int(local) < group.size()


def make_ht_buffer(cpu_group, buffer_size_mb=64, num_sms=None, internode=None):
    """vLLM's high-throughput Buffer: ``num_nvl_bytes = buffer_size_mb MiB``, as many RDMA bytes
    when the group spans nodes (vLLM: ``VLLM_DEEPEP_BUFFER_SIZE_MB``, default 1024; smaller here by
    default because the CPU backend allocates it), ``num_qps_per_rank = num_sms // 2`` across
    nodes else 1; ``set_num_sms(num_sms)`` when given."""
    if internode is None:
        internode = _internode(cpu_group)
    if num_sms is not None:
        deep_ep.Buffer.set_num_sms(num_sms)
    size = buffer_size_mb << 20
    return deep_ep.Buffer(group=cpu_group, num_nvl_bytes=size, num_rdma_bytes=size if internode else 0,
                          low_latency_mode=False,
                          num_qps_per_rank=(deep_ep.Buffer.num_sms // 2) if internode else 1,
                          explicitly_destroy=True)


def make_ll_buffer(cpu_group, max_num_tokens_per_dp_rank, token_hidden_size, num_ep_ranks, num_global_experts,
                   num_nvl_bytes=1 << 20):
    """vLLM's low-latency Buffer: ``num_rdma_bytes`` from ``get_low_latency_rdma_size_hint``,
    ``low_latency_mode=True``, ``num_qps_per_rank`` = local experts, NVLink allowed."""
    rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank=max_num_tokens_per_dp_rank, hidden=token_hidden_size,
        num_ranks=num_ep_ranks, num_experts=num_global_experts)
    return deep_ep.Buffer(group=cpu_group, num_nvl_bytes=num_nvl_bytes, num_rdma_bytes=rdma, low_latency_mode=True,
                          num_qps_per_rank=num_global_experts // num_ep_ranks,
                          allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, explicitly_destroy=True)


def _refuse_unsupported(apply_router_weight_on_input, quant_config):
    if apply_router_weight_on_input:
        raise NotImplementedError("apply_router_weight_on_input is not supported by the ProxyEP vLLM adapter")
    if quant_config is not None and getattr(quant_config, "quant_dtype", None) is not None:
        raise NotImplementedError("quantised prepare (quant_config with a quant_dtype) is not supported")


class DeepEPHTPrepareAndFinalize:
    """High-throughput (normal mode) prepare/finalize. ``num_dispatchers``: the EP size;
    ``rank_expert_offset``: the global id of this rank's first expert."""

    def __init__(self, buffer, num_dispatchers, dp_size, rank_expert_offset, async_finish=True):
        self.buffer = buffer
        self.num_dispatchers_ = num_dispatchers
        self.dp_size = dp_size
        self.rank_expert_offset = rank_expert_offset
        self.async_finish = async_finish
        self.handle = None

    def num_dispatchers(self):
        return self.num_dispatchers_

    def max_num_tokens_per_rank(self):
        return None

    def topk_indices_dtype(self):
        return torch.int64

    def _config(self, table):
        return table(self.dp_size) if self.dp_size in _CONFIG_RANKS else None

    def prepare(self, a1, topk_weights, topk_ids, num_experts, expert_map, apply_router_weight_on_input,
                quant_config=None):
        _refuse_unsupported(apply_router_weight_on_input, quant_config)
        topk_ids = topk_ids.to(torch.int64)
        per_rank, per_rdma_rank, per_expert, in_rank, _ = self.buffer.get_dispatch_layout(
            topk_idx=topk_ids, num_experts=num_experts, previous_event=None, async_finish=False,
            allocate_on_comm_stream=False)
        expert_x, expert_topk_ids, expert_topk_weights, per_expert_list, self.handle, event = self.buffer.dispatch(
            x=a1, handle=None, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma_rank,
            is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=topk_ids,
            topk_weights=topk_weights.float(), expert_alignment=1,
            config=self._config(deep_ep.Buffer.get_dispatch_config), previous_event=None,
            async_finish=self.async_finish, allocate_on_comm_stream=False)
        if self.async_finish:
            event.current_stream_wait()
        meta = ExpertTokensMetadata(torch.tensor(per_expert_list, dtype=torch.int32), list(per_expert_list))
        # Local ids back to global ones; -1 (another rank's expert) to a placeholder that the
        # expert_map maps to -1 (vLLM's convention).
        expert_topk_ids = torch.where(expert_topk_ids == -1,
                                      torch.full_like(expert_topk_ids,
                                                      num_experts - 1 if self.rank_expert_offset == 0 else 0),
                                      expert_topk_ids + self.rank_expert_offset)
        return expert_x, None, meta, expert_topk_ids, expert_topk_weights

    def finalize(self, output, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input,
                 weight_and_reduce_impl=None):
        assert self.handle is not None, "finalize without prepare"
        _refuse_unsupported(apply_router_weight_on_input, None)
        if fused_expert_output.dim() == 3:  # [rows, topk, H]: weight and reduce here
            weighted = fused_expert_output.float() * topk_weights.float().unsqueeze(-1)
            fused_expert_output = weighted.sum(dim=1).to(output.dtype)
        combined, _, event = self.buffer.combine(
            x=fused_expert_output.contiguous(), handle=self.handle, topk_weights=None,
            config=self._config(deep_ep.Buffer.get_combine_config), previous_event=None,
            async_finish=self.async_finish, allocate_on_comm_stream=False)
        if self.async_finish:
            event.current_stream_wait()
        self.handle = None
        output.copy_(combined)


class DeepEPLLPrepareAndFinalize:
    """Low-latency prepare/finalize (batched activation format ``[E_local, R*T, H]``)."""

    def __init__(self, buffer, max_tokens_per_rank, num_dispatchers, use_fp8_dispatch=False):
        self.buffer = buffer
        self.max_tokens_per_rank = max_tokens_per_rank
        self.num_dispatchers_ = num_dispatchers
        self.use_fp8_dispatch = use_fp8_dispatch
        self.handle = None

    def num_dispatchers(self):
        return self.num_dispatchers_

    def max_num_tokens_per_rank(self):
        return self.max_tokens_per_rank

    def topk_indices_dtype(self):
        return torch.int64

    def prepare(self, a1, topk_weights, topk_ids, num_experts, expert_map, apply_router_weight_on_input,
                quant_config=None):
        _refuse_unsupported(apply_router_weight_on_input, quant_config)
        if a1.shape[0] > self.max_tokens_per_rank:
            raise ValueError(f"{a1.shape[0]} tokens: at most max_tokens_per_rank={self.max_tokens_per_rank}")
        expert_x, expert_num_tokens, self.handle, _, hook = self.buffer.low_latency_dispatch(
            a1, topk_ids.to(torch.int64), self.max_tokens_per_rank, num_experts, use_fp8=self.use_fp8_dispatch,
            async_finish=False, return_recv_hook=True)
        hook()
        scale = None
        if isinstance(expert_x, tuple):
            expert_x, scale = expert_x
        return expert_x, scale, ExpertTokensMetadata(expert_num_tokens), None, None

    def finalize(self, output, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input,
                 weight_and_reduce_impl=None):
        assert self.handle is not None, "finalize without prepare"
        _refuse_unsupported(apply_router_weight_on_input, None)
        _, _, hook = self.buffer.low_latency_combine(
            fused_expert_output, topk_ids.to(torch.int64), topk_weights.float(), self.handle, async_finish=False,
            zero_copy=False, return_recv_hook=True, out=output)
        hook()
        self.handle = None


__all__ = [
    "DeepEPHTPrepareAndFinalize",
    "DeepEPLLPrepareAndFinalize",
    "ExpertTokensMetadata",
    "make_ht_buffer",
    "make_ll_buffer",
]
