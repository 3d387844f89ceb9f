"""The math the expert-parallel layer (layer.py) and the dense reference (reference.py) share:
deterministic initialisation, routing, the load-balancing loss and one expert's FFN. Everything
here is local (no communication), float32."""

import torch
import torch.nn.functional as F


def router_weight(seed, num_experts, hidden):
    """The router's Linear(hidden -> num_experts) weight [E, H], the same on every rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 17)
    return torch.randn(num_experts, hidden, generator=g) * hidden**-0.5


def expert_weights(seed, expert, hidden, ffn_hidden):
    """Global expert ``expert``'s SwiGLU weights: fc1 [H, 2F] (gate | up), fc2 [F, H]. Depends
    only on the seed and the global index, so any rank (or the dense reference) builds the same."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 1009 * (expert + 1))
    fc1 = torch.randn(hidden, 2 * ffn_hidden, generator=g) * hidden**-0.5
    fc2 = torch.randn(ffn_hidden, hidden, generator=g) * ffn_hidden**-0.5
    return fc1, fc2


def route(logits, topk, score):
    """(scores [T, E], topk_weights [T, k] float32, topk_idx [T, k] int64).

    softmax: scores = softmax(logits); weights = the top-k scores (not renormalised, as Megatron's
    default). sigmoid: scores = sigmoid(logits); weights = the top-k scores divided by their sum
    (DeepSeek-V3's normalisation)."""
    logits = logits.float()
    if score == "softmax":
        scores = torch.softmax(logits, dim=-1)
        weights, idx = torch.topk(scores, topk, dim=-1)
    elif score == "sigmoid":
        scores = torch.sigmoid(logits)
        top, idx = torch.topk(scores, topk, dim=-1)
        weights = top / top.sum(dim=-1, keepdim=True)
    else:
        raise ValueError(f"score must be 'softmax' or 'sigmoid', got {score!r}")
    return scores, weights, idx


def load_balancing_loss(scores, topk_idx, num_experts):
    """Switch/GShard auxiliary loss over these tokens: E * sum_e f_e * P_e, with f_e the fraction
    of the T*k selections that went to expert e (no gradient) and P_e the mean over tokens of
    e's score (sigmoid scores normalised per token first). 1.0 when perfectly balanced."""
    t, k = topk_idx.shape
    counts = torch.zeros(num_experts, dtype=torch.float32)
    counts.index_add_(0, topk_idx.reshape(-1), torch.ones(t * k))
    f = counts / (t * k)
    probs = scores / scores.sum(dim=-1, keepdim=True)
    p = probs.mean(dim=0)
    return num_experts * (f * p).sum()


def router_step(x, router, topk, score, num_experts, aux_loss_coef):
    """The router of a layer on tokens x [T, H]: (topk_weights, topk_idx, aux loss), the aux
    loss a zero 0-dim tensor when aux_loss_coef is 0. Shared by the layer and the reference so
    both route the same rows the same way."""
    scores, topk_weights, topk_idx = route(x.float() @ router.t(), topk, score)
    if aux_loss_coef:
        aux = aux_loss_coef * load_balancing_loss(scores, topk_idx, num_experts)
    else:
        aux = torch.zeros(())
    return topk_weights, topk_idx, aux


def expert_ffn(x, fc1, fc2):
    """SwiGLU: (silu(x @ gate) * (x @ up)) @ fc2, x float32 [n, H]."""
    h = x @ fc1
    gate, up = h.chunk(2, dim=-1)
    return (F.silu(gate) * up) @ fc2


def grouped_experts(x, topk_idx, topk_weights, fc1, fc2, expert_offset=0):
    """sum_k topk_weights[n, k] * FFN_{topk_idx[n, k]}(x[n]) for every row n, over the experts
    fc1/fc2 hold ([E_held, H, 2F], [E_held, F, H]; ids offset by ``expert_offset``). Slots with
    an id outside the held experts (-1 included) take no part (and get a zero weight gradient).
    Each held expert runs once on all its rows (a grouped GEMM)."""
    out = torch.zeros(x.shape[0], fc2.shape[-1], dtype=torch.float32)
    local = topk_idx - expert_offset
    for e in range(fc1.shape[0]):
        rows, slots = (local == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        y = expert_ffn(x[rows], fc1[e], fc2[e])
        out = out.index_add(0, rows, y * topk_weights[rows, slots].unsqueeze(1))
    return out
