"""The GRPO train step on the expert-parallel TinyMoELM (docs/RL.md section 2): sequences
(prompt + generated tokens with their behaviour log-probs and advantage) packed into one batch per
trainer rank, log-probs recomputed by the EP model in normal mode (its MoE exchange through
deep_ep), grpo.grpo_loss, gradients synchronised over the trainer group, one optimiser step.

Loss scale: a global token mean. Rank r's loss is (sum of its masked per-token terms) / (tokens
over all ranks) x R, so after sync_gradients (dense gradients averaged over R ranks, expert
gradients divided by R) every parameter's gradient is exactly that of the token mean over the
whole batch, however the tokens fell on the ranks.

pi_old is the policy being trained at the start of the step (one optimiser step per batch, so the
ratio is 1 with the full gradient A x grad log pi); the behaviour log-probs the rollout recorded
enter through the truncated importance weight pi_old / pi_behaviour, which corrects staleness
and the rollout/trainer numerical gap (bf16 exchange, a different routing order).
"""

import dataclasses
from typing import List, Optional

import torch
import torch.distributed as dist

from proxyep.moe.training import sync_gradients

from .grpo import LossConfig, grpo_loss, sequence_logprobs


@dataclasses.dataclass
class TrainSequence:
    prompt: List[int]
    output: List[int]
    behaviour_logprobs: List[float]
    advantage: float


def pack(seqs: List[TrainSequence], pad_token: int, length: Optional[int] = None):
    """(tokens int64 [N, L], mask [N, L-1], behaviour [N, L-1], advantages [N]) with position t
    predicting token t+1; the mask is 1 exactly on the generated tokens. Right padding: the model
    is causal, so padding after a sequence does not change its log-probs."""
    if not seqs:
        raise ValueError("pack: no sequences")
    need = max(len(s.prompt) + len(s.output) for s in seqs)
    length = need if length is None else length
    if length < need:
        raise ValueError(f"pack: sequences of {need} tokens do not fit length {length}")
    n = len(seqs)
    tokens = torch.full((n, length), pad_token, dtype=torch.long)
    mask = torch.zeros(n, length - 1)
    behaviour = torch.zeros(n, length - 1)
    for i, s in enumerate(seqs):
        if len(s.behaviour_logprobs) != len(s.output):
            raise ValueError(f"pack: sequence {i} has {len(s.output)} tokens and {len(s.behaviour_logprobs)} "
                             "log-probs")
        if not s.prompt:
            raise ValueError(f"pack: sequence {i} has an empty prompt")
        p, o = len(s.prompt), len(s.output)
        tokens[i, :p + o] = torch.tensor(s.prompt + s.output)
        mask[i, p - 1:p - 1 + o] = 1
        behaviour[i, p - 1:p - 1 + o] = torch.tensor(s.behaviour_logprobs)
    advantages = torch.tensor([float(s.advantage) for s in seqs])
    return tokens, mask, behaviour, advantages


class GRPOTrainer:
    """One trainer rank. ``model``: a TinyMoELM on ``group`` (normal-mode Buffer); ``ref_model``: an
    optional frozen copy for the KL term; ``temperature``: the sampling temperature of the rollout,
    so trainer and behaviour log-probs are of the same distribution."""

    def __init__(self, model, optimizer, group=None, loss_config: LossConfig = LossConfig(), temperature=1.0,
                 pad_token=0, ref_model=None):
        loss_config.validate()
        if loss_config.aggregation != "token_mean":
            raise ValueError("GRPOTrainer implements the global token mean only")
        self.model, self.optimizer, self.group = model, optimizer, group
        self.loss_config, self.temperature, self.pad_token, self.ref_model = loss_config, temperature, pad_token, ref_model

    def _world(self):
        return dist.get_world_size(self.group), dist.get_rank(self.group)

    def step(self, local_seqs: List[TrainSequence]):
        """One optimiser step on this rank's sequences (every rank of the group calls it, each with
        at least one sequence, in the same step). Returns stats averaged over the group."""
        world, _ = self._world()
        # Every rank pads to the group's longest sequence so the forwards agree in shape.
        longest = torch.tensor([max(len(s.prompt) + len(s.output) for s in local_seqs)])
        dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=self.group)
        tokens, mask, behaviour, adv = pack(local_seqs, self.pad_token, int(longest))
        local_tokens = mask.sum()
        global_tokens = local_tokens.clone()
        dist.all_reduce(global_tokens, group=self.group)
        if float(global_tokens) == 0:
            raise ValueError("GRPOTrainer.step: no generated tokens in the whole batch")

        self.optimizer.zero_grad(set_to_none=True)
        logits, aux = self.model(tokens)
        logp = sequence_logprobs(logits, tokens, self.temperature)
        ref_logp = None
        if self.ref_model is not None and self.loss_config.kl_coef > 0:
            with torch.no_grad():
                ref_logp = sequence_logprobs(self.ref_model(tokens)[0], tokens, self.temperature)
        loss, stats = grpo_loss(logp, logp.detach(), adv, mask, self.loss_config, behaviour_logp=behaviour,
                                ref_logp=ref_logp)
        scale = local_tokens.clamp(min=1) * world / global_tokens
        (loss * scale + aux).backward()
        sync_gradients(self.model, self.group)
        self.optimizer.step()

        with torch.no_grad():
            gap = ((logp.detach() - behaviour).abs() * mask).sum()
        summary = torch.tensor([float(loss) * float(scale) / world, float(aux) / world,
                                stats["clip_fraction"] * float(local_tokens), float(gap), stats["kl"] * float(local_tokens)],
                               dtype=torch.float64)
        dist.all_reduce(summary, group=self.group)
        n = float(global_tokens)
        return {"loss": float(summary[0]), "aux": float(summary[1]), "clip_fraction": float(summary[2]) / n,
                "logprob_gap": float(summary[3]) / n, "kl": float(summary[4]) / n, "tokens": int(n)}
