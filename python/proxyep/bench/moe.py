"""``python3 -m proxyep.bench moe``: TinyMoELM (proxyep.moe) training steps and greedy decode with
the MoE token exchange through ProxyEP (deep_ep.Buffer normal mode for training, low-latency mode
for decode) against the same model whose exchange is ``torch.distributed.all_to_all_single`` over
gloo (proxyep.moe.a2a_exchange), in the same job, alternating.

Training step = forward + backward + dense-gradient all-reduce (gloo, both variants) + Adam step,
on this rank's batch; timed from the Buffer's bootstrap barrier, the slowest rank per step. Split:
the exchange (the dispatch/combine autograd functions' forward and backward, timed inside them),
the gradient all-reduce, and the rest (compute: attention, router, experts, head, loss, the
optimizer). Both variants start from the same weights and see the same batches: their losses are
compared step by step (the sanity check; the exit code is 1 when it fails).

Decode: greedy generation with the KV cache, prompt through the normal exchange, then one token
per sequence per step: ProxyEP's low-latency path (``forward_low_latency``), ProxyEP's normal
mode, and the all_to_all_single model; per-step times (slowest rank) and tokens/s (all ranks).
"""

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist

import deep_ep
import proxyep
from proxyep.moe.a2a_exchange import A2ACombineFunction, A2ADispatchFunction, AllToAllExchange
from proxyep.moe.exchange import CombineFunction, DispatchFunction
from proxyep.moe.layer import DeepEPExchange
from proxyep.moe.model import TinyMoELM, cross_entropy
from proxyep.moe.training import BigramTask, sync_gradients

from .harness import add_shape_arguments, percentiles, run_ranks

VARIANTS = ("proxyep", "a2a")


def parse(argv):
    """Defaults: a shape whose step the exchange weighs on (small hidden and FFN, few tokens per
    rank): on a 2-vCPU machine attention's H^2 per token dominates any larger one."""
    p = argparse.ArgumentParser(prog="python3 -m proxyep.bench moe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="ranks to start when run alone")
    p.add_argument("--ranks-per-node", type=int, default=None, help="default: all on one node")
    add_shape_arguments(p)
    p.add_argument("--tokens", type=int, default=64, help="training tokens per rank (a multiple of --seq)")
    p.add_argument("--seq", type=int, default=16, help="training sequence length")
    p.add_argument("--aux-loss-coef", type=float, default=0.01)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=30, help="timed training steps per variant")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps per variant first")
    p.add_argument("--decode-tokens", type=int, default=16, help="new tokens per sequence (0: no decode)")
    p.add_argument("--decode-batch", type=int, default=8, help="sequences per rank in decode")
    p.add_argument("--prompt", type=int, default=4, help="prompt length in decode")
    p.add_argument("--decode-rounds", type=int, default=3, help="generations per variant (timed; one more untimed)")
    p.add_argument("--loss-tolerance", type=float, default=0.0,
                   help="largest |proxyep - a2a| global-mean loss difference at any step (default 0: the "
                        "two exchanges round the same way, so the losses must be identical)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    for name in ("ranks", "hidden", "layers", "heads", "experts", "topk", "ffn_hidden", "vocab", "tokens", "seq",
                 "steps", "decode_batch", "prompt", "decode_rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.decode_tokens < 0:
        p.error("--warmup and --decode-tokens must be at least 0")
    if args.tokens % args.seq:
        p.error("--tokens must be a multiple of --seq")
    if args.experts % args.ranks:
        p.error("--experts must be divisible by --ranks")
    if args.hidden % args.heads:
        p.error("--hidden must be a multiple of --heads")
    if args.decode_tokens and args.hidden % 128:
        p.error("decode through the low-latency path needs --hidden a multiple of 128 (or --decode-tokens 0)")
    if args.ranks_per_node is not None and (args.ranks_per_node < 1 or args.ranks % args.ranks_per_node):
        p.error("--ranks-per-node must divide --ranks")
    return args


class Timer:
    """Seconds spent in the exchange on this rank since the last reset()."""

    def __init__(self):
        self.seconds = 0.0

    def reset(self):
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def timed(fn, timer):
    """A subclass of the autograd function ``fn`` whose forward and backward add their wall time
    to ``timer``."""

    class Timed(fn):
        @staticmethod
        def forward(ctx, *args):
            t0 = time.perf_counter()
            try:
                return fn.forward(ctx, *args)
            finally:
                timer.seconds += time.perf_counter() - t0

        @staticmethod
        def backward(ctx, *grads):
            t0 = time.perf_counter()
            try:
                return fn.backward(ctx, *grads)
            finally:
                timer.seconds += time.perf_counter() - t0

    Timed.__name__ = f"Timed{fn.__name__}"
    return Timed


class TimedLowLatency:
    """The low-latency Buffer with its dispatch/combine calls timed into ``timer``."""

    def __init__(self, buffer, timer):
        self._buffer, self._timer = buffer, timer

    def __getattr__(self, name):
        attr = getattr(self._buffer, name)
        if name not in ("low_latency_dispatch", "low_latency_combine"):
            return attr

        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._timer.seconds += time.perf_counter() - t0

        return call


def train_step(model, optimizer, tokens, timer):
    """(loss on this rank before the update, [step, exchange, all-reduce] seconds on this rank)."""
    timer.reset()
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    logits, aux = model(tokens[:, :-1])
    ce = cross_entropy(logits, tokens[:, 1:])
    (ce + aux).backward()
    t1 = time.perf_counter()
    sync_gradients(model)
    t2 = time.perf_counter()
    optimizer.step()
    t3 = time.perf_counter()
    return float(ce.detach() + aux.detach()), [t3 - t0, timer.reset(), t2 - t1]


@torch.no_grad()
def decode(model, prompts, steps, low_latency, timer):
    """Greedy decode: the prompt through the normal exchange, then ``steps`` - 1 one-token
    forwards (through LL when ``low_latency``). Returns (tokens [B, steps], per decode step
    [seconds, exchange seconds] on this rank)."""
    cache = model.new_cache()
    logits, _ = model(prompts, cache=cache)
    out, samples = [], []
    nxt = logits[:, -1].argmax(dim=-1)
    out.append(nxt)
    for _ in range(steps - 1):
        timer.reset()
        t0 = time.perf_counter()
        logits, _ = model(nxt.view(-1, 1), cache=cache, low_latency=low_latency)
        nxt = logits[:, -1].argmax(dim=-1)
        samples.append([time.perf_counter() - t0, timer.reset()])
        out.append(nxt)
    return torch.stack(out, dim=1), samples


def _slowest(samples):
    """Each column's maximum over the ranks, per sample (collective)."""
    t = torch.tensor(samples, dtype=torch.float64).reshape(len(samples), -1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def _ms(values):
    return {k: v * 1e3 for k, v in percentiles(values).items()}


def body(args):
    rank, R = dist.get_rank(), dist.get_world_size()
    per_node = args.ranks_per_node or R
    batch = args.tokens // args.seq
    max_seq = max(args.seq, args.prompt + args.decode_tokens)
    prefill = args.decode_batch * args.prompt
    rows = max(args.tokens, prefill)
    nvl = proxyep.nvl_bytes_hint(rows, args.hidden * 2, args.topk, R)
    rdma = proxyep.rdma_bytes_hint(rows, args.hidden * 2, args.topk, R, per_node) if per_node < R else 0
    buffer = deep_ep.Buffer(dist.group.WORLD, nvl, rdma, explicitly_destroy=True)
    ll = None
    if args.decode_tokens:
        hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(args.decode_batch, args.hidden, R, args.experts)
        ll = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=args.experts // R,
                            explicitly_destroy=True)
    timers = {v: Timer() for v in VARIANTS}
    exchanges = {
        "proxyep": DeepEPExchange(buffer, timed(DispatchFunction, timers["proxyep"]),
                                  timed(CombineFunction, timers["proxyep"])),
        "a2a": AllToAllExchange(dist.group.WORLD, timed(A2ADispatchFunction, timers["a2a"]),
                                timed(A2ACombineFunction, timers["a2a"])),
    }
    kwargs = dict(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                  num_experts=args.experts, topk=args.topk, ffn_hidden=args.ffn_hidden, group=dist.group.WORLD,
                  seed=args.seed, max_seq=max_seq, aux_loss_coef=args.aux_loss_coef)
    models = {"proxyep": TinyMoELM(buffer=buffer, exchange=exchanges["proxyep"], **kwargs),
              "a2a": TinyMoELM(buffer=None, exchange=exchanges["a2a"], **kwargs)}
    if ll is not None:
        models["proxyep"].set_low_latency(TimedLowLatency(ll, timers["proxyep"]), args.decode_batch)
    optimizers = {v: torch.optim.Adam(m.parameters(), lr=args.lr) for v, m in models.items()}
    task = BigramTask(args.vocab, seed=args.seed)
    barrier = buffer.runtime.barrier

    # Training: both variants on the same batch each step, which goes first alternating.
    losses = {v: [] for v in VARIANTS}
    samples = {v: [] for v in VARIANTS}
    for step in range(args.warmup + args.steps):
        tokens = task.batch(step, rank, batch, args.seq)
        for v in (VARIANTS if step % 2 == 0 else VARIANTS[::-1]):
            barrier()
            loss, times = train_step(models[v], optimizers[v], tokens, timers[v])
            losses[v].append(loss)
            if step >= args.warmup:
                samples[v].append(times)
    global_losses = {}
    for v in VARIANTS:
        t = torch.tensor(losses[v], dtype=torch.float64)
        dist.all_reduce(t)
        global_losses[v] = (t / R).tolist()
    max_loss_diff = max(abs(a - b) for a, b in zip(global_losses["proxyep"], global_losses["a2a"]))
    tokens_per_step = args.tokens * R
    train = {}
    for v in VARIANTS:
        mine = torch.tensor(samples[v], dtype=torch.float64)  # [steps, (step, exchange, all-reduce)]
        mine = torch.cat([mine, (mine[:, 0] - mine[:, 1] - mine[:, 2]).view(-1, 1)], dim=1)  # + the rest
        t = _slowest(mine.tolist())
        step_ms = _ms(t[:, 0].tolist())
        train[v] = {"step_ms": step_ms, "exchange_ms": _ms(t[:, 1].tolist()), "allreduce_ms": _ms(t[:, 2].tolist()),
                    "compute_ms": _ms(t[:, 3].tolist()), "tokens_per_s": tokens_per_step / (step_ms["p50"] / 1e3),
                    "step_samples_ms": (t[:, 0] * 1e3).tolist()}
        train[v]["exchange_share"] = train[v]["exchange_ms"]["p50"] / step_ms["p50"]
    result = {"train": train, "losses": global_losses, "max_loss_diff": max_loss_diff,
              "losses_match": max_loss_diff <= args.loss_tolerance, "tokens_per_step": tokens_per_step,
              "num_nvl_bytes": nvl, "num_rdma_bytes": rdma}

    # Decode: the trained models, same prompts; rounds alternate the order of the variants.
    if args.decode_tokens:
        prompts = task.batch(10_000, rank, args.decode_batch, args.prompt - 1)
        paths = (("proxyep_ll", "proxyep", True), ("proxyep_normal", "proxyep", False), ("a2a", "a2a", False))
        dec = {name: [] for name, _, _ in paths}
        ids = {}
        for r in range(args.decode_rounds + 1):
            for name, v, low_latency in (paths if r % 2 == 0 else paths[::-1]):
                barrier()
                t0 = time.perf_counter()
                out, steps = decode(models[v], prompts, args.decode_tokens, low_latency, timers[v])
                total = time.perf_counter() - t0
                ids[name] = out
                if r > 0:
                    dec[name].append((steps, total))
        new_tokens = R * args.decode_batch * (args.decode_tokens - 1)  # tokens made by the timed steps
        decode_result = {}
        for name, runs in dec.items():
            t = _slowest([s for steps, _ in runs for s in steps]) if args.decode_tokens > 1 else None
            entry = {"generate_s": _slowest([[total] for _, total in runs])[:, 0].tolist()}
            if t is not None:
                per_run = t[:, 0].view(len(runs), -1).sum(dim=1)  # each run's decode steps, slowest rank each
                entry.update(step_ms=_ms(t[:, 0].tolist()), exchange_ms=_ms(t[:, 1].tolist()),
                             tokens_per_s=new_tokens / float(per_run.median()))
            decode_result[name] = entry
        same = {name: float((ids[name] == ids["a2a"]).double().mean()) for name in ("proxyep_ll", "proxyep_normal")}
        agree = torch.tensor([same["proxyep_ll"], same["proxyep_normal"]], dtype=torch.float64)
        dist.all_reduce(agree)
        decode_result["token_agreement_with_a2a"] = {"proxyep_ll": float(agree[0]) / R,
                                                     "proxyep_normal": float(agree[1]) / R}
        decode_result["new_tokens_per_round"] = new_tokens
        result["decode"] = decode_result
        if ll is not None:
            ll.destroy()
    buffer.destroy()
    return result


def _row(name, d):
    return f"  {name:38s}{d['p50']:10.2f}{d['p95']:10.2f}{d['p99']:10.2f}"


def report(args, result):
    doc = {"benchmark": "moe", "ranks": args.ranks, "ranks_per_node": args.ranks_per_node or args.ranks,
           "model": {k: getattr(args, k) for k in ("hidden", "layers", "heads", "experts", "topk", "ffn_hidden",
                                                  "vocab", "seq", "aux_loss_coef", "seed")},
           "workload": {k: getattr(args, k) for k in ("tokens", "steps", "warmup", "lr", "decode_tokens",
                                                     "decode_batch", "prompt", "decode_rounds")}}
    doc.update(result)
    train = result["train"]
    doc["train_speedup"] = train["a2a"]["step_ms"]["p50"] / train["proxyep"]["step_ms"]["p50"]
    doc["exchange_speedup"] = train["a2a"]["exchange_ms"]["p50"] / max(train["proxyep"]["exchange_ms"]["p50"], 1e-9)
    if "decode" in result and "tokens_per_s" in result["decode"]["a2a"]:
        d = result["decode"]
        doc["decode_speedup"] = {k: d[k]["tokens_per_s"] / d["a2a"]["tokens_per_s"]
                                 for k in ("proxyep_ll", "proxyep_normal")}
    doc["verified"] = result["losses_match"]
    if args.json:
        print(json.dumps(doc, indent=1))
        return doc
    m = doc["model"]
    print(f"proxyep.bench moe: {args.ranks} ranks, {doc['ranks_per_node']} per node; TinyMoELM hidden "
          f"{m['hidden']}, {m['layers']} layers, {m['heads']} heads, top-{m['topk']} of {m['experts']} experts, "
          f"ffn {m['ffn_hidden']}, vocab {m['vocab']}; {args.tokens} tokens per rank ({args.tokens // args.seq} x "
          f"{args.seq}); slowest rank per step, {args.steps} steps after {args.warmup}")
    print(f"  {'training step (ms)':38s}{'p50':>10s}{'p95':>10s}{'p99':>10s}")
    for v, label in (("proxyep", "ProxyEP"), ("a2a", "all_to_all_single (gloo)")):
        t = train[v]
        print(_row(f"{label} step", t["step_ms"]))
        print(_row("  exchange (dispatch+combine, fwd+bwd)", t["exchange_ms"]))
        print(_row("  gradient all-reduce (gloo)", t["allreduce_ms"]))
        print(_row("  rest (compute, optimizer)", t["compute_ms"]))
    for v, label in (("proxyep", "ProxyEP"), ("a2a", "all_to_all_single")):
        t = train[v]
        print(f"  {label}: {t['tokens_per_s']:.0f} tokens/s (all ranks, p50 step); exchange "
              f"{100 * t['exchange_share']:.0f}% of the p50 step")
    print(f"  training step speedup (a2a p50 / ProxyEP p50): {doc['train_speedup']:.2f}x; exchange alone "
          f"{doc['exchange_speedup']:.2f}x")
    verdict = "DIFFERENT"
    if result["losses_match"]:
        verdict = "identical" if result["max_loss_diff"] == 0 else "within tolerance"
    print(f"  losses: max |ProxyEP - a2a| over {len(result['losses']['a2a'])} steps {result['max_loss_diff']:.2e} "
          f"(tolerance {args.loss_tolerance}): {verdict}; "
          f"first {result['losses']['proxyep'][0]:.4f}, last {result['losses']['proxyep'][-1]:.4f}")
    if "decode" in result:
        d = result["decode"]
        print(f"  decode ({args.decode_batch} sequences per rank, prompt {args.prompt}, {args.decode_tokens} new "
              f"tokens, {args.decode_rounds} timed rounds)")
        print(f"  {'decode step (ms)':38s}{'p50':>10s}{'p95':>10s}{'p99':>10s}{'tokens/s':>12s}{'vs a2a':>9s}")
        for name, label in (("proxyep_ll", "ProxyEP low-latency"), ("proxyep_normal", "ProxyEP normal mode"),
                            ("a2a", "all_to_all_single (gloo)")):
            if "step_ms" not in d[name]:
                continue
            ratio = d[name]["tokens_per_s"] / d["a2a"]["tokens_per_s"]
            print(_row(label, d[name]["step_ms"]) + f"{d[name]['tokens_per_s']:12.0f}{ratio:8.2f}x")
            print(_row("  exchange", d[name]["exchange_ms"]))
        agree = d["token_agreement_with_a2a"]
        print(f"  decoded ids equal to a2a's: low-latency {100 * agree['proxyep_ll']:.1f}%, normal "
              f"{100 * agree['proxyep_normal']:.1f}%")
    print(f"verified: {'yes' if doc['verified'] else 'NO'}")
    return doc


def main(argv):
    args = parse(argv)
    result = run_ranks(body, args)
    if result is None:  # not rank 0 under a launcher
        return 0
    doc = report(args, result)
    return 0 if doc["verified"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
