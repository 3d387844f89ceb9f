"""The dense single-process reference of MoELayer: the same router, routing, load-balancing loss
and experts (all E of them, built from the same seed and global indices), no exchange. The tokens
are rounded to bf16 before the experts, as the layer's dispatch moves them, so the experts see
exactly the same inputs; everything after is float32 (the layer rounds the expert outputs, the
combined sum and the gradients crossing the exchange to bf16: see tests/python/test_moe.py for
the tolerances this gives)."""

import torch

from .functional import expert_weights, grouped_experts, route, router_step, router_weight


class DenseMoE(torch.nn.Module):
    def __init__(self, hidden, ffn_hidden, num_experts, topk, score="softmax", aux_loss_coef=0.0, seed=0):
        super().__init__()
        self.hidden, self.num_experts, self.topk = hidden, num_experts, topk
        self.score, self.aux_loss_coef = score, aux_loss_coef
        self.router_weight = torch.nn.Parameter(router_weight(seed, num_experts, hidden))
        fc1, fc2 = zip(*(expert_weights(seed, e, hidden, ffn_hidden) for e in range(num_experts)))
        self.fc1 = torch.nn.Parameter(torch.stack(fc1))  # [E, H, 2F]
        self.fc2 = torch.nn.Parameter(torch.stack(fc2))  # [E, F, H]
        self.last_topk_idx = None

    def forward(self, x):
        """(output [T, H] float32, aux loss) for the tokens x [T, H]: the layer's output for the
        same tokens on one rank (the router runs on exactly these rows, as on that rank)."""
        topk_weights, topk_idx, aux = router_step(x, self.router_weight, self.topk, self.score,
                                                  self.num_experts, self.aux_loss_coef)
        self.last_topk_idx = topk_idx
        x_exchanged = x.to(torch.bfloat16).float()
        return grouped_experts(x_exchanged, topk_idx, topk_weights, self.fc1, self.fc2), aux

    @torch.no_grad()
    def partial_magnitudes(self, x, num_ranks):
        """sum over ranks r of |the part of the output from rank r's experts| [T, H], for the
        tokens x: what the layer rounds to bf16 before combining (the forward error bound)."""
        _, topk_weights, topk_idx = route(x.float() @ self.router_weight.t(), self.topk, self.score)
        x_exchanged = x.to(torch.bfloat16).float()
        local = self.num_experts // num_ranks
        total = torch.zeros(x.shape[0], self.fc2.shape[-1])
        for r in range(num_ranks):
            part = grouped_experts(x_exchanged, topk_idx, topk_weights, self.fc1[r * local:(r + 1) * local],
                                   self.fc2[r * local:(r + 1) * local], expert_offset=r * local)
            total += part.abs()
        return total

    @torch.no_grad()
    def exchange_rounded(self, x, num_ranks):
        """The forward output for the tokens x with the layer's bf16 roundings reproduced: each
        rank's part (over the ranks the token goes to) rounded to bf16, summed in float32 in
        rank order (as deep_ep's combine does, from 0), the sum rounded to bf16. Differs from the
        layer only where the float32 GEMMs, run here on other row sets, differ in the last bits."""
        _, topk_weights, topk_idx = route(x.float() @ self.router_weight.t(), self.topk, self.score)
        x_exchanged = x.to(torch.bfloat16).float()
        local = self.num_experts // num_ranks
        acc = torch.zeros(x.shape[0], self.fc2.shape[-1])
        for r in range(num_ranks):
            part = grouped_experts(x_exchanged, topk_idx, topk_weights, self.fc1[r * local:(r + 1) * local],
                                   self.fc2[r * local:(r + 1) * local], expert_offset=r * local)
            goes = ((topk_idx >= r * local) & (topk_idx < (r + 1) * local)).any(dim=1, keepdim=True)
            acc = torch.where(goes, acc + part.to(torch.bfloat16).float(), acc)
        return acc.to(torch.bfloat16).float()
