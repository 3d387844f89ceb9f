"""The MoE token exchange a PyTorch user writes without an EP library:
``torch.distributed.all_to_all_single`` (gloo here), with the interface and the semantics of
exchange.py's ``DispatchFunction`` / ``CombineFunction`` (deep_ep normal mode), so that
``MoELayer`` / ``TinyMoELM`` run the same model over either (``exchange=AllToAllExchange(group)``).

* :class:`A2ADispatchFunction` ``.apply(x, topk_idx, topk_weights, group, num_experts)`` ->
  ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert, handle)``: one row per
  (token, destination rank), as deep_ep's normal dispatch. Forward: the per-rank counts by one
  ``all_to_all_single``, then one ``all_to_all_single`` of the rows (bf16, sent as bytes: gloo's
  all-to-all has no bf16) packed with their top-k metadata (ids made local to the destination, -1
  for other ranks' experts; weights zeroed there, float32). Backward: the reverse all-to-all of
  the gradients of the rows and of the weights, summed at home in float32 (rank order) and
  rounded once to bf16, as deep_ep's combine (the weight gradients: one rank per slot).
* :class:`A2ACombineFunction` ``.apply(x, group, handle)``: the reverse all-to-all of the (already
  weighted) expert outputs, summed at home in float32 in rank order, rounded once to bf16.
  Backward: the dispatch of the gradient's rows with the cached layout (no counts, no metadata).

Received rows come grouped by source rank, tokens ascending within a source (deep_ep's order
too). The handle is a plain object (not a tensor), as deep_ep's.
"""

import math

import torch
import torch.distributed as dist


class A2AHandle:
    """The layout of one dispatch: ``order`` (this rank's token index of each sent row, grouped
    by destination rank), ``send_counts`` / ``recv_counts`` (int64 [R]), ``num_tokens``."""

    def __init__(self, order, send_counts, recv_counts, num_tokens, group):
        self.order, self.send_counts, self.recv_counts = order, send_counts, recv_counts
        self.num_tokens, self.group = num_tokens, group


def _bytes(t):
    # The row size spelled out: reshape(0, -1) is ambiguous, and a decoding rank may have no rows.
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], t.element_size() * math.prod(t.shape[1:]))


def _all_to_all_rows(send, send_counts, recv_counts, group):
    """Rows of ``send`` (any dtype, 2-D, grouped by destination) to their ranks, as bytes."""
    raw = _bytes(send)
    recv = torch.empty(int(recv_counts.sum()), raw.shape[1], dtype=torch.uint8)
    dist.all_to_all_single(recv, raw, recv_counts.tolist(), send_counts.tolist(), group=group)
    return recv


def _sum_home(rows, order, num_tokens):
    """float32 [num_tokens, ...]: each token's rows summed (index_add in row order = rank order)."""
    out = torch.zeros((num_tokens,) + tuple(rows.shape[1:]), dtype=torch.float32)
    out.index_add_(0, order, rows.float())
    return out


class A2ADispatchFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_idx, topk_weights, group, num_experts):
        if x.dtype != torch.bfloat16:
            raise TypeError(f"dispatch moves bf16 tokens; x is {x.dtype}")
        world, num_tokens, k = dist.get_world_size(group), x.shape[0], topk_idx.shape[1]
        local = num_experts // world
        dest = torch.where(topk_idx >= 0, topk_idx // local, torch.full_like(topk_idx, -1))
        in_rank = torch.stack([(dest == r).any(dim=1) for r in range(world)], dim=1)  # [T, R]
        rows_of = [torch.nonzero(in_rank[:, r]).flatten() for r in range(world)]
        order = torch.cat(rows_of)
        dest_of_row = torch.cat([torch.full((len(rows), ), r, dtype=torch.int64) for r, rows in enumerate(rows_of)])
        send_counts = torch.tensor([len(rows) for rows in rows_of], dtype=torch.int64)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        # Metadata of each sent row, local to its destination: ids (-1 elsewhere), weights (0 there).
        idx, w = topk_idx.index_select(0, order), topk_weights.float().index_select(0, order)
        mine = dest.index_select(0, order) == dest_of_row.view(-1, 1)
        idx = torch.where(mine, idx - dest_of_row.view(-1, 1) * local, torch.full_like(idx, -1))
        w = torch.where(mine, w, torch.zeros_like(w))
        hidden = x.shape[1]
        packed = torch.cat([_bytes(x.index_select(0, order)), _bytes(idx.to(torch.int32)), _bytes(w)], dim=1)
        recv = _all_to_all_rows(packed, send_counts, recv_counts, group)
        n = recv.shape[0]
        recv_x = recv[:, :2 * hidden].contiguous().view(torch.bfloat16).view(n, hidden)
        recv_idx = recv[:, 2 * hidden:2 * hidden + 4 * k].contiguous().view(torch.int32).view(n, k).to(torch.int64)
        recv_w = recv[:, 2 * hidden + 4 * k:].contiguous().view(torch.float32).view(n, k)
        valid = recv_idx[recv_idx >= 0]
        counts = torch.bincount(valid, minlength=local).to(torch.int64)
        handle = A2AHandle(order, send_counts, recv_counts, num_tokens, group)
        ctx.handle, ctx.topk = handle, k
        ctx.mark_non_differentiable(recv_idx, counts)
        return recv_x, recv_idx, recv_w, counts, handle

    @staticmethod
    def backward(ctx, grad_recv_x, grad_recv_idx, grad_recv_w, grad_counts, grad_handle):
        if grad_recv_x is None:
            raise RuntimeError("A2ADispatchFunction.backward: recv_x has no gradient")
        h = ctx.handle
        n, hidden, k = grad_recv_x.shape[0], grad_recv_x.shape[1], ctx.topk
        if grad_recv_w is None:
            grad_recv_w = torch.zeros(n, k, dtype=torch.float32)
        packed = torch.cat([_bytes(grad_recv_x.to(torch.bfloat16)), _bytes(grad_recv_w.float())], dim=1)
        back = _all_to_all_rows(packed, h.recv_counts, h.send_counts, h.group)
        m = back.shape[0]
        rows = back[:, :2 * hidden].contiguous().view(torch.bfloat16).view(m, hidden)
        weights = back[:, 2 * hidden:].contiguous().view(torch.float32).view(m, k)
        grad_x = _sum_home(rows, h.order, h.num_tokens).to(torch.bfloat16)
        grad_w = _sum_home(weights, h.order, h.num_tokens)
        return grad_x, None, grad_w, None, None


class A2ACombineFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, handle):
        if x.dtype != torch.bfloat16:
            raise TypeError(f"combine sums bf16 rows; x is {x.dtype}")
        back = _all_to_all_rows(x, handle.recv_counts, handle.send_counts, group)
        rows = back.view(torch.bfloat16).view(back.shape[0], x.shape[1])
        ctx.handle = handle
        return _sum_home(rows, handle.order, handle.num_tokens).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, grad_out):
        h = ctx.handle
        send = grad_out.to(torch.bfloat16).index_select(0, h.order)
        recv = _all_to_all_rows(send, h.send_counts, h.recv_counts, h.group)
        return recv.view(torch.bfloat16).view(recv.shape[0], grad_out.shape[1]), None, None


class AllToAllExchange:
    """The exchange object ``MoELayer(exchange=...)`` takes: ``dispatch(x, topk_idx,
    topk_weights, num_experts)`` and ``combine(y, handle)`` over ``group`` with
    ``all_to_all_single``. ``dispatch_fn`` / ``combine_fn``: the autograd functions (subclasses,
    e.g. timed ones, may replace them)."""

    def __init__(self, group=None, dispatch_fn=A2ADispatchFunction, combine_fn=A2ACombineFunction):
        self.group = group if group is not None else dist.group.WORLD
        self.dispatch_fn, self.combine_fn = dispatch_fn, combine_fn

    def dispatch(self, x, topk_idx, topk_weights, num_experts):
        return self.dispatch_fn.apply(x, topk_idx, topk_weights, self.group, num_experts)

    def combine(self, y, handle):
        return self.combine_fn.apply(y, self.group, handle)
