"""The dense single-process reference of TinyMoELM (model.py): the same architecture and
initialisation from the same seed, every MoE a :class:`DenseMoE` with all the experts (the same
router and the same global experts as the EP model's layers).

``forward(..., low_latency=True)`` runs the MoE with the EP model's low-latency roundings
reproduced (:func:`ll_rounded_moe`), for comparing generations token for token;
``low_latency=False`` is DenseMoE's (tokens rounded to bf16 before the experts, float32 after).
"""

import torch

from .functional import expert_ffn, route
from .model import TinyLMBase, moe_seed
from .reference import DenseMoE


@torch.no_grad()
def ll_rounded_moe(moe, x):
    """DenseMoE ``moe``'s output for x [T, H] with MoELayer.forward_low_latency's roundings: the
    tokens rounded to bf16 (LL dispatch with use_fp8=False), each expert's unweighted output
    rounded to bf16, then deep_ep's LL combine: sum over k ascending of weight * output in
    float32 (products rounded before the adds), rounded once to bf16."""
    _, weights, idx = route(x.float() @ moe.router_weight.t(), moe.topk, moe.score)
    xb = x.to(torch.bfloat16).float()
    acc = torch.zeros(x.shape[0], moe.fc2.shape[-1])
    for k in range(idx.shape[1]):
        part = torch.zeros_like(acc)
        for e in idx[:, k].unique().tolist():
            rows = (idx[:, k] == e).nonzero(as_tuple=True)[0]
            part[rows] = expert_ffn(xb[rows], moe.fc1[e], moe.fc2[e]).to(torch.bfloat16).float()
        prod = weights[:, k:k + 1] * part
        acc = acc + prod
    return acc.to(torch.bfloat16).float()


class DenseTinyMoELM(TinyLMBase):
    """TinyMoELM's dense reference (same arguments, less the group and the buffers)."""

    def __init__(self, vocab, hidden, layers, heads, num_experts, topk=2, ffn_hidden=None, seed=0, max_seq=64,
                 tie_embeddings=False, score="softmax", aux_loss_coef=0.0):
        ffn_hidden = ffn_hidden or 2 * hidden
        super().__init__(vocab, hidden, layers, heads, num_experts, topk, ffn_hidden, max_seq, seed, tie_embeddings,
                         lambda i: DenseMoE(hidden, ffn_hidden, num_experts, topk, score=score,
                                            aux_loss_coef=aux_loss_coef, seed=moe_seed(seed, i)))

    def _moe_low_latency(self, moe, y):
        return ll_rounded_moe(moe, y)

    @torch.no_grad()
    def load_from_ep(self, dense_state, expert_rows):
        """Copy an EP model's weights: ``dense_state`` {name: tensor} of its dense parameters
        (any rank's), ``expert_rows`` {name: [E, ...]} of its fc1/fc2 gathered over the ranks in
        rank order (training.gather_ep_state gives both)."""
        params = dict(self.named_parameters())
        for name, value in list(dense_state.items()) + list(expert_rows.items()):
            params[name].copy_(value)
