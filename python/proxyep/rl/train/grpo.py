"""GRPO's arithmetic (docs/RL.md section 2), as plain tensor functions so tests can check them
against a direct computation and the trainer cannot drift from them.

- ``group_advantages``: (r_i - mean(r)) / (std(r) + eps) over one group, with the unbiased std;
  a group of one has mean 0 and std 1 (its advantage is its reward); ``scale=False`` is
  Dr.GRPO (no division).
- ``grpo_loss``: the PPO clipped surrogate on the per-token ratio pi_theta / pi_old (lower clip
  1 - clip_low, upper 1 + clip_high: DAPO raises the upper one), optionally times a truncated
  importance weight pi_old / pi_behaviour (capped at ``tis_cap``, no gradient) when the tokens
  came from an older policy than pi_old, plus ``kl_coef`` x the k3 estimator of KL to a frozen
  reference, aggregated as a token mean over the loss mask (the default) or a sequence mean.

Log-probs are of the sampled tokens, [N, T] float; ``mask`` [N, T] is 1 on generated tokens that
are trained (prompt and padding 0); advantages are per sequence [N].
"""

import dataclasses
import math
from typing import Optional, Sequence

import torch


def group_advantages(rewards: Sequence[float], eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """Advantages of one group's samples (float64 [G])."""
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    if r.numel() == 0:
        raise ValueError("group_advantages: empty group")
    if not torch.isfinite(r).all():
        raise ValueError(f"group_advantages: non-finite reward in {r.tolist()}")
    if r.numel() == 1:
        mean, std = 0.0, 1.0
    else:
        mean, std = float(r.mean()), float(r.std(unbiased=True))
    centred = r - mean
    return centred / (std + eps) if scale else centred


@dataclasses.dataclass
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO's clip-higher; 0.2 gives PPO's symmetric clip
    kl_coef: float = 0.0  # many recipes use 0
    tis_cap: Optional[float] = 2.0  # cap of the behaviour importance weight; None: no correction
    aggregation: str = "token_mean"  # or "seq_mean"

    def validate(self):
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"clip range [1-{self.clip_low}, 1+{self.clip_high}] is not valid")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.aggregation not in ("token_mean", "seq_mean"):
            raise ValueError(f"aggregation must be token_mean or seq_mean, got {self.aggregation!r}")


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def grpo_loss(logp, old_logp, advantages, mask, config: LossConfig = LossConfig(), behaviour_logp=None,
              ref_logp=None):
    """(loss scalar, stats dict). ``old_logp``/``behaviour_logp``/``ref_logp`` carry no gradient."""
    config.validate()
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"grpo_loss: shapes differ: logp {tuple(logp.shape)}, old {tuple(old_logp.shape)}, "
                         f"mask {tuple(mask.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"grpo_loss: advantages {tuple(advantages.shape)} for {logp.shape[0]} sequences")
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - old_logp.detach())
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if behaviour_logp is not None and config.tis_cap is not None:
        weight = torch.exp(old_logp.detach() - behaviour_logp.detach()).clamp(max=config.tis_cap)
        per_token = per_token * weight
    kl = None
    if ref_logp is not None and config.kl_coef > 0:
        kl = k3_kl(logp, ref_logp.detach())
        per_token = per_token + config.kl_coef * kl
    tokens = mask.sum()
    if config.aggregation == "token_mean":
        loss = (per_token * mask).sum() / tokens.clamp(min=1)
    else:
        per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        loss = per_seq.mean()
    with torch.no_grad():
        clipped_frac = (((ratio < 1 - config.clip_low) | (ratio > 1 + config.clip_high)).to(mask.dtype) * mask).sum()
        stats = {"tokens": float(tokens), "clip_fraction": float(clipped_frac / tokens.clamp(min=1)),
                 "ratio_mean": float((ratio * mask).sum() / tokens.clamp(min=1)),
                 "kl": float((kl * mask).sum() / tokens.clamp(min=1)) if kl is not None else 0.0}
    return loss, stats


def sequence_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs [N, T-1] of tokens[:, 1:] under logits[:, :-1] / temperature (the convention the
    rollout workers use for behaviour log-probs)."""
    if not temperature > 0 or math.isinf(temperature):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
