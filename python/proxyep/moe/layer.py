"""An expert-parallel MoE layer whose token exchange runs through ``deep_ep`` (exchange.py).

Forward, per rank, for its own tokens x [T, H] (float32):

1. router: logits = x @ W_r^T (W_r [E, H], replicated, the same on every rank from the seed),
   softmax or sigmoid scores, top-k (functional.route); optional load-balancing loss
   (functional.load_balancing_loss over this rank's tokens, times ``aux_loss_coef``);
2. dispatch (DispatchFunction) of bf16(x) with the top-k ids and float32 weights;
3. local experts (E / world_size per rank, global ids rank*E_local ...) as a grouped SwiGLU FFN
   in float32 on the received rows: each row gets sum over its slots with a local expert of
   weight * FFN_e(row) (DeepEP's normal combine does not apply weights; the expert side does);
4. combine (CombineFunction) of the bf16-rounded expert outputs: each token summed over the ranks
   it went to; returned as float32.

Backward: combine's is a cached dispatch of the gradient, dispatch's a combine of the gradients
of the received rows and of their top-k weights (the router's gradient through the weights).
Expert gradients cover every rank's tokens that chose the local experts; the router's gradient
covers this rank's tokens only (sum it over the group, as data parallelism would).

``forward_low_latency`` is the inference path over a ``low_latency_mode`` Buffer (decode-sized
batches, no autograd): ``low_latency_dispatch`` of the bf16 tokens (``use_fp8=False``), each
local expert's FFN on its received rows (unweighted, rounded to bf16), ``low_latency_combine``
with the top-k weights (DeepEP's LL combine applies them: float32, k ascending, one bf16
rounding).

``exchange``: the token exchange of ``forward`` (default :class:`DeepEPExchange` over ``buffer``);
any object with the same ``dispatch`` / ``combine`` (a2a_exchange.AllToAllExchange: the same
model over ``all_to_all_single``, where ``buffer`` may be None).
"""

import torch
import torch.distributed as dist

from .exchange import CombineFunction, DispatchFunction
from .functional import expert_ffn, expert_weights, grouped_experts, route, router_step, router_weight


class DeepEPExchange:
    """``dispatch(x, topk_idx, topk_weights, num_experts)`` -> DispatchFunction's outputs and
    ``combine(y, handle)`` -> CombineFunction's, over ``buffer`` (the autograd functions may be
    replaced by subclasses, e.g. timed ones)."""

    def __init__(self, buffer, dispatch_fn=DispatchFunction, combine_fn=CombineFunction):
        self.buffer, self.dispatch_fn, self.combine_fn = buffer, dispatch_fn, combine_fn

    def dispatch(self, x, topk_idx, topk_weights, num_experts):
        return self.dispatch_fn.apply(x, topk_idx, topk_weights, self.buffer, num_experts)

    def combine(self, y, handle):
        return self.combine_fn.apply(y, self.buffer, handle)


class MoELayer(torch.nn.Module):
    def __init__(self, hidden, ffn_hidden, num_experts, topk, group, buffer, score="softmax",
                 aux_loss_coef=0.0, seed=0, exchange=None):
        super().__init__()
        if hasattr(group, "size"):
            world = group.size()
        else:
            world = buffer.group_size if buffer is not None else dist.get_world_size(group)
        rank = buffer.rank if buffer is not None else dist.get_rank(group)
        if num_experts % world:
            raise ValueError(f"num_experts {num_experts} is not a multiple of the group size {world}")
        if not 1 <= topk <= num_experts:
            raise ValueError(f"topk must be in [1, {num_experts}], got {topk}")
        if (hidden * 2) % 16:
            raise ValueError(f"hidden {hidden}: bf16 rows must be a multiple of 16 bytes")
        if score not in ("softmax", "sigmoid"):
            raise ValueError(f"score must be 'softmax' or 'sigmoid', got {score!r}")
        self.hidden, self.ffn_hidden, self.num_experts, self.topk = hidden, ffn_hidden, num_experts, topk
        self.group, self.buffer, self.score, self.aux_loss_coef = group, buffer, score, aux_loss_coef
        self.num_local_experts = num_experts // world
        self.expert_offset = rank * self.num_local_experts
        self.router_weight = torch.nn.Parameter(router_weight(seed, num_experts, hidden))
        fc1, fc2 = zip(*(expert_weights(seed, self.expert_offset + e, hidden, ffn_hidden)
                         for e in range(self.num_local_experts)))
        self.fc1 = torch.nn.Parameter(torch.stack(fc1))  # [E_local, H, 2F]
        self.fc2 = torch.nn.Parameter(torch.stack(fc2))  # [E_local, F, H]
        self.exchange = exchange if exchange is not None else DeepEPExchange(buffer)
        self.last_topk_idx = None

    def forward(self, x):
        """(output [T, H] float32, aux loss (0-dim; zero when aux_loss_coef is 0))."""
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be [tokens, {self.hidden}], got {tuple(x.shape)}")
        topk_weights, topk_idx, aux = router_step(x, self.router_weight, self.topk, self.score,
                                                  self.num_experts, self.aux_loss_coef)
        self.last_topk_idx = topk_idx
        recv_x, recv_idx, recv_w, _, handle = self.exchange.dispatch(
            x.to(torch.bfloat16), topk_idx, topk_weights, self.num_experts)
        y = grouped_experts(recv_x.float(), recv_idx, recv_w, self.fc1, self.fc2)
        out = self.exchange.combine(y.to(torch.bfloat16), handle)
        return out.float(), aux

    @torch.no_grad()
    def forward_low_latency(self, x, ll_buffer, num_max_dispatch_tokens_per_rank):
        """The output [T, H] float32 for x [T, H] through ``ll_buffer`` (a Buffer in
        low_latency_mode over the same group; T <= num_max_dispatch_tokens_per_rank, the same
        value on every rank and every call, hidden a multiple of 128). Collective: every rank
        calls it, T may differ (0 included). No aux loss, no gradient."""
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be [tokens, {self.hidden}], got {tuple(x.shape)}")
        _, topk_weights, topk_idx = route(x.float() @ self.router_weight.t(), self.topk, self.score)
        self.last_topk_idx = topk_idx
        recv, counts, handle, _, _ = ll_buffer.low_latency_dispatch(
            x.to(torch.bfloat16).contiguous(), topk_idx.contiguous(), num_max_dispatch_tokens_per_rank,
            self.num_experts, use_fp8=False)
        out = torch.zeros_like(recv)  # [E_local, R * T_max, H] bf16
        for e in range(self.num_local_experts):
            n = int(counts[e])
            if n:
                out[e, :n] = expert_ffn(recv[e, :n].float(), self.fc1[e], self.fc2[e]).to(torch.bfloat16)
        combined, _, _ = ll_buffer.low_latency_combine(out, topk_idx, topk_weights.float().contiguous(), handle)
        return combined.float()
