"""The token exchange of an expert-parallel MoE layer as autograd functions over a
``deep_ep.Buffer``, the way Megatron-LM's flex dispatcher drives DeepEP (fused_a2a.py,
docs/DEEPEP_CONTRACT.md 7.1):

* :class:`DispatchFunction`: forward = layout + dispatch of the (bf16) tokens with their top-k
  indices and float32 weights; backward = combine of the gradient of ``recv_x`` with the gradient
  of ``recv_topk_weights`` passed as combine's ``topk_weights``, whose combined weights are the
  gradient of ``topk_weights``.
* :class:`CombineFunction`: forward = combine with the dispatch's handle; backward = cached
  dispatch (``handle=...``) of the gradient.

What the runtime accepts (deep_ep/buffers/legacy.py and the native checks): dispatch ``x`` is bf16 (or
the FP8 tuple, not used here), ``topk_weights`` float32; combine ``x`` is bf16 and
``topk_weights`` float32 with one row per received token. Combine is an *unweighted* sum over the
ranks a token went to (float32 accumulation in rank order, rounded once to bf16; DEEPEP_CONTRACT
section 9 item 4): the expert side applies the top-k weights. Dispatch zeroes the weights of the
slots whose expert lives on another rank (their ``recv_topk_idx`` is -1), so combining the weight
gradients (zero at those slots, since those slots take no part in the expert computation) gives
each slot the gradient from the one rank that owns its expert: exactly the gradient of
``topk_weights``.

Synchronous calls only (``async_finish=False``): on the CPU there is no stream to overlap with.
"""

import torch


class DispatchFunction(torch.autograd.Function):
    """``recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert, handle =
    DispatchFunction.apply(x, topk_idx, topk_weights, buffer, num_experts)``.

    ``x``: bf16 [tokens, hidden]; ``topk_idx``: int64 [tokens, k] (global expert ids, -1 =
    dropped); ``topk_weights``: float32 [tokens, k]. ``recv_topk_idx`` holds local expert ids
    (-1 for other ranks' experts) and is not differentiable; ``num_recv_tokens_per_expert`` is an
    int64 tensor (Megatron's ``torch.tensor(list)``); ``handle`` is the dispatch handle (not a
    tensor) for :class:`CombineFunction`."""

    @staticmethod
    def forward(ctx, x, topk_idx, topk_weights, buffer, num_experts):
        if x.dtype != torch.bfloat16:
            raise TypeError(f"dispatch moves bf16 tokens; x is {x.dtype}")
        topk_idx = topk_idx.contiguous()
        topk_weights = topk_weights.float().contiguous()
        per_rank, per_rdma_rank, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
        recv_x, recv_idx, recv_w, per_expert_list, handle, _ = buffer.dispatch(
            x.contiguous(), topk_idx=topk_idx, topk_weights=topk_weights,
            num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma_rank,
            is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        ctx.buffer, ctx.handle = buffer, handle
        ctx.num_recv, ctx.topk = recv_x.shape[0], topk_idx.shape[1]
        counts = torch.tensor(per_expert_list, dtype=torch.int64)
        ctx.mark_non_differentiable(recv_idx, counts)
        return recv_x, recv_idx, recv_w, counts, handle

    @staticmethod
    def backward(ctx, grad_recv_x, grad_recv_idx, grad_recv_w, grad_counts, grad_handle):
        n = ctx.num_recv
        if grad_recv_x is None:
            raise RuntimeError("DispatchFunction.backward: recv_x has no gradient")
        hidden = grad_recv_x.shape[1]
        if grad_recv_w is None:  # recv_topk_weights took no part in the loss
            grad_recv_w = torch.zeros(n, ctx.topk, dtype=torch.float32)
        grad_x, grad_w, _ = ctx.buffer.combine(
            grad_recv_x.to(torch.bfloat16).contiguous().view(n, hidden), ctx.handle,
            topk_weights=grad_recv_w.float().contiguous())
        return grad_x, None, grad_w, None, None


class CombineFunction(torch.autograd.Function):
    """``out = CombineFunction.apply(x, buffer, handle)``: ``x`` bf16 [num_recv_tokens, hidden],
    already weighted by the expert side; ``out`` bf16 [tokens, hidden], each token summed over
    the ranks it went to. Backward: cached dispatch of the gradient (rounded to bf16)."""

    @staticmethod
    def forward(ctx, x, buffer, handle):
        if x.dtype != torch.bfloat16:
            raise TypeError(f"combine sums bf16 rows; x is {x.dtype}")
        combined, _, _ = buffer.combine(x.contiguous(), handle)
        ctx.buffer, ctx.handle = buffer, handle
        return combined

    @staticmethod
    def backward(ctx, grad_out):
        grad_x, _, _, _, _, _ = ctx.buffer.dispatch(grad_out.to(torch.bfloat16).contiguous(), handle=ctx.handle)
        return grad_x, None, None
