"""The GRPO train step of the expert-parallel TinyMoELM (proxyep.rl.train.trainer.GRPOTrainer,
run on every rank of a `proxyep launch` job; MoE exchange through deep_ep) against the dense
reference computing the same loss over the whole batch in one process.

Sequences of different prompt and output lengths are dealt to the ranks unevenly, so a trainer
that averaged per-rank token means instead of taking the global token mean would be off by the
ranks' token-count ratio (a relative gradient error well above the bound). Behaviour log-probs
are the reference's own plus noise, so the truncated importance weights differ from 1 and some
hit the cap. One SGD step (lr 1): the parameter change is the gradient; each parameter's must be
within 2^-6 relative error in norm of the reference's (three bf16 roundings through the
exchange, as tests/python/test_moe_model.py)."""

import torch
import torch.distributed as dist

import deep_ep
from proxyep.moe import DenseTinyMoELM, TinyMoELM
from proxyep.rl.train.grpo import LossConfig, grpo_loss, sequence_logprobs
from proxyep.rl.train.trainer import GRPOTrainer, TrainSequence, pack

torch.set_num_threads(1)
KW = dict(vocab=32, hidden=128, layers=2, heads=4, num_experts=4, topk=2, ffn_hidden=32, seed=5, max_seq=32,
          aux_loss_coef=0.01)
CFG = LossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, tis_cap=1.5)
TEMPERATURE = 0.8


def sequences(ref):
    g = torch.Generator().manual_seed(11)
    seqs = []
    for i in range(7):  # 7 over 2 ranks: 4 and 3 sequences, of unequal lengths
        prompt = torch.randint(KW["vocab"], (3 + i % 3,), generator=g).tolist()
        output = torch.randint(KW["vocab"], (2 + (5 * i) % 7,), generator=g).tolist()
        tokens = torch.tensor([prompt + output])
        with torch.no_grad():
            exact = sequence_logprobs(ref(tokens)[0], tokens, TEMPERATURE)[0, len(prompt) - 1:]
        behaviour = (exact + torch.randn(len(output), generator=g) * 0.3).tolist()
        seqs.append(TrainSequence(prompt, output, behaviour, float(torch.randn((), generator=g))))
    return seqs


def test_ep_step_matches_reference():
    R, rank = dist.get_world_size(), dist.get_rank()
    ref = DenseTinyMoELM(**KW)
    seqs = sequences(ref)
    shares = [seqs[r::R] for r in range(R)]

    buffer = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22, explicitly_destroy=True)
    try:
        model = TinyMoELM(group=dist.group.WORLD, buffer=buffer, **KW)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainer = GRPOTrainer(model, torch.optim.SGD(model.parameters(), lr=1.0), loss_config=CFG,
                              temperature=TEMPERATURE)
        stats = trainer.step(shares[rank])
    finally:
        buffer.destroy()

    # The reference: every rank's batch padded to the global longest, the global token mean of the
    # per-token terms, plus the mean over ranks of each rank's aux loss.
    longest = max(len(s.prompt) + len(s.output) for s in seqs)
    total_tokens = sum(len(s.output) for s in seqs)
    objective, surrogate = 0, 0
    for share in shares:
        tokens, mask, behaviour, adv = pack(share, 0, longest)
        logits, aux = ref(tokens)
        logp = sequence_logprobs(logits, tokens, TEMPERATURE)
        loss, _ = grpo_loss(logp, logp.detach(), adv, mask, CFG, behaviour_logp=behaviour)
        objective = objective + loss * mask.sum() / total_tokens + aux / R
        surrogate = surrogate + float(loss * mask.sum() / total_tokens)
    objective.backward()
    assert stats["tokens"] == total_tokens
    # The reported loss is the global token mean too (bf16 exchange: a few 1e-3 apart).
    assert abs(stats["loss"] - surrogate) <= 1e-2 * max(1.0, abs(surrogate)), (stats["loss"], surrogate)

    local = KW["num_experts"] // R
    errors = {}
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        expected = q.grad if q.grad is not None else torch.zeros_like(q)
        if name.endswith(("fc1", "fc2")):
            expected = expected[rank * local:(rank + 1) * local]
        step = before[name] - p.detach()
        errors[name] = float((step - expected).norm() / expected.norm().clamp(min=1e-12))
    bad = {k: v for k, v in errors.items() if not v <= 2.0**-6}
    print(f"rank {rank}: max relative gradient error {max(errors.values()):.2e}", flush=True)
    assert not bad, bad
