"""Inputs of both benchmarks, and the exchange a PyTorch user writes without an EP library:
``all_to_all_single`` over gloo (counts, then rows straight into the receive tensor, and back)."""

import torch
import torch.distributed as dist


def inputs(args, rank):
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    x = torch.randn(args.tokens, args.hidden, generator=g).to(torch.bfloat16)
    scores = torch.randn(args.tokens, args.experts, generator=g).abs() + 1
    topk_idx = torch.topk(scores, args.topk, dim=-1).indices
    topk_weights = torch.rand(args.tokens, args.topk, generator=g)
    return x, topk_idx, topk_weights


def _exchange(send, send_counts, recv_counts, width, dtype):
    """Rows of `send` (grouped by destination, send_counts each) to their ranks."""
    recv = torch.empty(int(recv_counts.sum()), width, dtype=dtype)
    # gloo's all-to-all has no bf16: rows travel as their bytes, as a user would send them
    as_bits = (lambda t: t.view(torch.uint8)) if dtype == torch.bfloat16 else (lambda t: t)
    dist.all_to_all_single(as_bits(recv), as_bits(send), recv_counts.tolist(), send_counts.tolist())
    return recv


def ll_inputs(args, rank):
    """DeepEP's test_low_latency.py data, as the C++ LL bench makes it (its cast cost depends on
    the values): x = rank - 128 except the last 128 channels, which hold the token index; top-k
    of |randn| + 1 with 10 entries -1; weights |randn|."""
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    x = torch.full((args.tokens, args.hidden), float(rank - 128), dtype=torch.bfloat16)
    x[:, -128:] = torch.arange(args.tokens, dtype=torch.float32).view(-1, 1).to(torch.bfloat16)
    scores = torch.randn(args.tokens, args.experts, generator=g).abs() + 1
    topk_idx = torch.topk(scores, args.topk, dim=-1, sorted=True).indices
    drop = torch.randperm(args.tokens * args.topk, generator=g)[:10]
    topk_idx.view(-1)[drop] = -1
    topk_weights = torch.randn(args.tokens, args.topk, generator=g).abs()
    return x, topk_idx, topk_weights


class GlooRows:
    """Normal mode's semantics: one row per (token, destination rank), combine sums at home."""

    def __init__(self, topk_idx, experts, ranks):
        local = experts // ranks
        dest = torch.where(topk_idx >= 0, topk_idx // local, torch.full_like(topk_idx, -1))
        self.in_rank = torch.stack([(dest == r).any(dim=1) for r in range(ranks)], dim=1)
        self.order = torch.cat([torch.nonzero(self.in_rank[:, r]).flatten() for r in range(ranks)])
        self.send_counts = self.in_rank.sum(dim=0).to(torch.int64)
        self.recv_counts = torch.empty_like(self.send_counts)

    def dispatch(self, x):
        dist.all_to_all_single(self.recv_counts, self.send_counts)
        return _exchange(x.index_select(0, self.order), self.send_counts, self.recv_counts, x.shape[1],
                         x.dtype)

    def combine(self, rows, num_tokens):
        back = _exchange(rows, self.recv_counts, self.send_counts, rows.shape[1], rows.dtype)
        out = torch.zeros(num_tokens, rows.shape[1], dtype=torch.float32)
        out.index_add_(0, self.order, back.float())
        return out.to(torch.bfloat16)


class GlooMessages:
    """Low-latency semantics: one row per (token, selected expert), combine weighted at home."""

    def __init__(self, topk_idx, experts, ranks):
        local = experts // ranks
        valid = topk_idx >= 0
        tokens = torch.arange(topk_idx.shape[0]).view(-1, 1).expand_as(topk_idx)[valid]
        slots = torch.arange(topk_idx.shape[1]).view(1, -1).expand_as(topk_idx)[valid]
        expert = topk_idx[valid]
        order = torch.argsort(expert, stable=True)  # by destination rank, then expert
        self.tokens, self.slots = tokens[order], slots[order]
        self.send_counts = torch.bincount(expert[order] // local, minlength=ranks).to(torch.int64)
        self.recv_counts = torch.empty_like(self.send_counts)

    def dispatch(self, x):
        dist.all_to_all_single(self.recv_counts, self.send_counts)
        return _exchange(x.index_select(0, self.tokens), self.send_counts, self.recv_counts, x.shape[1],
                         x.dtype)

    def combine(self, rows, topk_weights):
        back = _exchange(rows, self.recv_counts, self.send_counts, rows.shape[1], rows.dtype)
        weights = topk_weights[self.tokens, self.slots].view(-1, 1)
        out = torch.zeros(topk_weights.shape[0], rows.shape[1], dtype=torch.float32)
        out.index_add_(0, self.tokens, back.float() * weights)
        return out.to(torch.bfloat16)
