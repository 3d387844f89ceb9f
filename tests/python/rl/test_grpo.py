"""GRPO's arithmetic (proxyep.rl.train.grpo) against a direct, scalar computation on fixed data,
and the addition task's rule-based reward (proxyep.rl.train.tasks)."""

import math
import statistics

import pytest
import torch

from proxyep.rl.train.grpo import LossConfig, group_advantages, grpo_loss, k3_kl, sequence_logprobs
from proxyep.rl.train.tasks import BOS, EOS, EQUALS, PLUS, AdditionTask


def test_group_advantages_match_direct_formula():
    rewards = [1.0, 0.0, 0.5, 0.25]
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)  # stdev: unbiased (n - 1)
    got = group_advantages(rewards, eps=1e-6)
    assert got.tolist() == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards], abs=1e-12)
    assert group_advantages(rewards, scale=False).tolist() == pytest.approx([r - mean for r in rewards])
    assert group_advantages([0.7]).tolist() == pytest.approx([0.7 / (1 + 1e-6)])  # mean 0, std 1
    assert group_advantages([0.3, 0.3, 0.3]).abs().max() == 0  # equal rewards: no signal
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([1.0, float("nan")])
    with pytest.raises(ValueError, match="empty"):
        group_advantages([])


def direct_loss(logp, old, adv, mask, cfg, behaviour=None, ref=None):
    """The same loss with Python floats, token by token."""
    total, count, per_seq = 0.0, 0, []
    for i in range(len(logp)):
        s, n = 0.0, 0
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            ratio = math.exp(logp[i][t] - old[i][t])
            clipped = min(max(ratio, 1 - cfg.clip_low), 1 + cfg.clip_high)
            term = -min(ratio * adv[i], clipped * adv[i])
            if behaviour is not None and cfg.tis_cap is not None:
                term *= min(math.exp(old[i][t] - behaviour[i][t]), cfg.tis_cap)
            if ref is not None and cfg.kl_coef > 0:
                d = ref[i][t] - logp[i][t]
                term += cfg.kl_coef * (math.exp(d) - d - 1)
            s, n = s + term, n + 1
        total, count = total + s, count + n
        per_seq.append(s / max(n, 1))
    return total / count if cfg.aggregation == "token_mean" else sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("cfg", [LossConfig(), LossConfig(clip_high=0.2, kl_coef=0.1),
                                 LossConfig(kl_coef=0.05, tis_cap=None, aggregation="seq_mean")])
def test_loss_matches_direct_computation(cfg):
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.4  # ratios inside and outside the clip
    behaviour = old + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.5
    ref = logp + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.3
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 1, 0, 1]], dtype=torch.float64)
    adv = torch.tensor([1.5, -0.7, 0.2], dtype=torch.float64)
    loss, stats = grpo_loss(logp, old, adv, mask, cfg, behaviour_logp=behaviour, ref_logp=ref)
    want = direct_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), cfg, behaviour.tolist(),
                       ref.tolist())
    assert float(loss) == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert stats["tokens"] == 10 and 0 < stats["clip_fraction"] < 1


def test_gradient_raises_logprob_of_positive_advantage():
    """The sign: a step against the loss makes a good sample likelier and a bad one less likely."""
    logits = torch.zeros(2, 4, 6, requires_grad=True)
    tokens = torch.tensor([[1, 2, 3, 4], [1, 5, 5, 5]])
    logp = sequence_logprobs(logits, tokens)
    mask = torch.ones_like(logp)
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), mask)
    loss.backward()
    with torch.no_grad():
        after = sequence_logprobs(logits - 1.0 * logits.grad, tokens)
    assert (after[0] > logp[0]).all() and (after[1] < logp[1]).all()


def test_k3_and_bad_input():
    a, b = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -0.5])
    assert k3_kl(a, a).abs().max() == 0 and (k3_kl(a, b) >= 0).all()
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="shapes differ"):
        grpo_loss(x, torch.zeros(2, 4), torch.zeros(2), x)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(x, x, torch.zeros(2), x, LossConfig(aggregation="sum"))
    with pytest.raises(ValueError, match="temperature"):
        sequence_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=0)


def test_sequence_logprobs_temperature():
    logits = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([[0, 3, 1]])
    got = sequence_logprobs(logits, tokens, temperature=0.5)
    want = [math.log(torch.softmax(logits[0, t] / 0.5, -1)[tokens[0, t + 1]].item()) for t in range(2)]
    assert got[0].tolist() == pytest.approx(want, rel=1e-5)


def test_addition_task_reward():
    task = AdditionTask(digits=2, seed=3)
    for i in range(20):
        a, b = task.operands(i)
        assert task.prompt(i) == [BOS, *map(int, str(a)), PLUS, *map(int, str(b)), EQUALS]
        assert task.reward(i, task.answer(i)) == 1.0
        assert len(task.answer(i)) <= task.max_new_tokens()
    assert task.prompt(5) == AdditionTask(digits=2, seed=3).prompt(5)  # seeded: any process regenerates it
    i = next(i for i in range(100) if sum(task.operands(i)) >= 10)
    ans, total = task.answer(i), sum(task.operands(i))
    off_by_3 = [int(c) for c in str(total + 3)] + [EOS]
    assert task.reward(i, off_by_3) == pytest.approx(0.8 * (1 - 3 / 200))
    assert task.reward(i, [0, 0, 0, EOS]) == pytest.approx(0.8 * max(0.0, 1 - total / 200))
    assert task.reward(i, ans[:-1]) == 0.0  # no EOS: malformed
    assert task.reward(i, [PLUS, EOS]) == 0.0 and task.reward(i, [EOS]) == 0.0 and task.reward(i, []) == 0.0
    assert task.reward(i, [1, EQUALS, EOS]) == 0.0
