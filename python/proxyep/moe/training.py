"""Training and comparison helpers for TinyMoELM (model.py) and its dense reference
(reference_model.py): a synthetic language task, the EP train step (per-rank batch, dense
gradients averaged over the group, expert gradients scaled to the global mean) and the reference
step over the global batch, which give comparable losses.

Loss on rank r: mean cross-entropy over its batch + the MoE aux losses of its tokens. The global
loss is the mean over ranks (every rank has the same number of tokens); its gradient is, for a
replicated (dense) parameter, the mean over ranks of the per-rank gradients (all-reduce sum /
R), and for an expert, the gradient the EP backward already sums over every rank's tokens that
reached it, divided by R. The reference computes exactly that loss over the R batches with all
experts in one process.
"""

import torch
import torch.distributed as dist

from .model import cross_entropy


class BigramTask:
    """Sequences from a fixed random bigram grammar: each token has ``branching`` successors
    (a random subset of the vocabulary) with fixed random probabilities. Batches are seeded by
    (task seed, step, rank), so any process can regenerate any rank's batch."""

    def __init__(self, vocab, seed=0, branching=4, temperature=1.5):
        g = torch.Generator().manual_seed(seed * 7919 + 3)
        self.vocab, self.seed = vocab, seed
        self.successors = torch.stack([torch.randperm(vocab, generator=g)[:branching] for _ in range(vocab)])
        self.probs = torch.softmax(torch.randn(vocab, branching, generator=g) * temperature, dim=-1)

    def batch(self, step, rank, batch, length):
        """int64 [batch, length + 1] (inputs = [:, :-1], targets = [:, 1:])."""
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 4099 + rank)
        cur = torch.randint(self.vocab, (batch,), generator=g)
        seq = [cur]
        for _ in range(length):
            choice = torch.multinomial(self.probs[cur], 1, generator=g).squeeze(1)
            cur = self.successors[cur, choice]
            seq.append(cur)
        return torch.stack(seq, dim=1)

    def entropy(self):
        """Mean over tokens (uniformly) of the successor entropy: about the best loss."""
        return float(-(self.probs * self.probs.log()).sum(dim=1).mean())


def sync_gradients(model, group=None):
    """Dense gradients: averaged over the group (one flat all-reduce, so every rank gets the same
    bits); expert gradients: divided by the group size (global-mean loss)."""
    world = dist.get_world_size(group)
    dense = model.dense_parameters()
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in dense])
    dist.all_reduce(flat, group=group)
    flat /= world
    offset = 0
    for p in dense:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n
    for p in model.expert_parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad /= world


def ep_train_step(model, optimizer, tokens, group=None):
    """One EP step on this rank's tokens [B, S + 1]. Returns float64 [2]: the global mean of
    (cross-entropy, aux) before the update (the same on every rank)."""
    optimizer.zero_grad(set_to_none=True)
    logits, aux = model(tokens[:, :-1])
    ce = cross_entropy(logits, tokens[:, 1:])
    (ce + aux).backward()
    sync_gradients(model, group)
    optimizer.step()
    stats = torch.stack([ce.detach(), aux.detach()]).double()
    dist.all_reduce(stats, group=group)
    return stats / dist.get_world_size(group)


def reference_train_step(model, optimizer, batches):
    """One reference step over the global batch (one [B, S + 1] tensor per rank, each run as that
    rank runs it: the aux loss over its tokens). Returns float64 [2] (cross-entropy, aux), means
    over the batches, before the update."""
    optimizer.zero_grad(set_to_none=True)
    total, ces, auxes = 0, [], []
    for tokens in batches:
        logits, aux = model(tokens[:, :-1])
        ce = cross_entropy(logits, tokens[:, 1:])
        total = total + ce + aux
        ces.append(ce.detach())
        auxes.append(aux.detach())
    (total / len(batches)).backward()
    optimizer.step()
    return torch.stack([torch.stack(ces).mean(), torch.stack(auxes).mean()]).double()


@torch.no_grad()
def gather_ep_state(model, group=None):
    """(dense {name: tensor} of this rank, experts {name: [E, ...]} gathered over the group in
    rank order), for DenseTinyMoELM.load_from_ep. Collective."""
    experts = {id(p) for p in model.expert_parameters()}
    dense, rows = {}, {}
    world = dist.get_world_size(group)
    for name, p in model.named_parameters():
        if id(p) in experts:
            parts = [torch.empty_like(p) for _ in range(world)]
            dist.all_gather(parts, p.detach().contiguous(), group=group)
            rows[name] = torch.cat(parts)
        else:
            dense[name] = p.detach().clone()
    return dense, rows
