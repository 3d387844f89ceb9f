"""The MoE token exchange over DeepEP V2's ``deep_ep.ElasticBuffer``, as autograd functions
(docs/plans/ELASTIC_BUFFER.md section 6.2), with the interface and the semantics of exchange.py's
V1 pair, so that ``MoELayer`` runs the same model over either
(``MoELayer(..., buffer=None, exchange=ElasticExchange(elastic_buffer))``):

* :class:`ElasticDispatchFunction` ``.apply(x, topk_idx, topk_weights, buffer, num_experts,
  do_expand)`` -> ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert,
  handle)``. Backward = V2's combine of the gradient of ``recv_x`` with the gradient of
  ``recv_topk_weights`` as its ``topk_weights``: the combined weights (lane k as the rank owning
  its expert returned it) are the gradient of ``topk_weights``. In the expanded layout
  (``do_expand``: one slot per (token, local expert), 1-D weights, ``recv_topk_idx`` None) the
  combine sums a token's slot gradients, the derivative of copying the token into each slot.
* :class:`ElasticCombineFunction` ``.apply(x, buffer, handle)``: V2's combine; backward = a
  cached dispatch of the gradient (into the same slots, gaps zeroed, for an expanded handle).

Synchronous calls only: on the CPU there is no stream to overlap with.
"""

import torch

from .exchange import CombineFunction


class ElasticDispatchFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_idx, topk_weights, buffer, num_experts, do_expand=False):
        if x.dtype != torch.bfloat16:
            raise TypeError(f"dispatch moves bf16 tokens; x is {x.dtype}")
        recv_x, recv_idx, recv_w, handle, _ = buffer.dispatch(
            x.contiguous(), topk_idx=topk_idx.contiguous(), topk_weights=topk_weights.float().contiguous(),
            num_experts=num_experts, do_expand=do_expand, do_zero_padding=do_expand)
        ctx.buffer, ctx.handle, ctx.weights_shape = buffer, handle, recv_w.shape
        counts = torch.tensor(handle.num_recv_tokens_per_expert_list, dtype=torch.int64)
        ctx.mark_non_differentiable(counts, *([recv_idx] if recv_idx is not None else []))
        return recv_x, recv_idx, recv_w, counts, handle

    @staticmethod
    def backward(ctx, grad_recv_x, grad_recv_idx, grad_recv_w, grad_counts, grad_handle):
        if grad_recv_x is None:
            raise RuntimeError("ElasticDispatchFunction.backward: recv_x has no gradient")
        if grad_recv_w is None:  # recv_topk_weights took no part in the loss
            grad_recv_w = torch.zeros(ctx.weights_shape, dtype=torch.float32)
        grad_x, grad_w, _ = ctx.buffer.combine(grad_recv_x.to(torch.bfloat16).contiguous(), ctx.handle,
                                               topk_weights=grad_recv_w.float().contiguous())
        return grad_x, None, grad_w, None, None, None


class ElasticCombineFunction(CombineFunction):
    """V1's CombineFunction forward (V2's combine takes and returns the same); its backward is
    V2's cached dispatch."""

    @staticmethod
    def backward(ctx, grad_out):
        expand = ctx.handle.do_expand
        grad_x, _, _, _, _ = ctx.buffer.dispatch(grad_out.to(torch.bfloat16).contiguous(), handle=ctx.handle,
                                                 do_expand=expand, do_zero_padding=expand)
        return grad_x, None, None


class ElasticExchange:
    """MoELayer's exchange over an ElasticBuffer (non-expanded layout: the layer's experts read
    one row per received token with its local top-k ids)."""

    def __init__(self, buffer):
        self.buffer = buffer

    def dispatch(self, x, topk_idx, topk_weights, num_experts):
        return ElasticDispatchFunction.apply(x, topk_idx, topk_weights, self.buffer, num_experts, False)

    def combine(self, y, handle):
        return ElasticCombineFunction.apply(y, self.buffer, handle)
