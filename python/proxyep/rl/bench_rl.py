"""``python3 -m proxyep.bench rl``: the GRPO run (``python3 -m proxyep.rl run``) as a reproducible
rollout-throughput benchmark (docs/RL.md section 7).

Configurations, each run ``--repeats`` times from scratch (its own run directory):
- ProxyEP EP (``exchange: proxyep``: deep_ep in the trainer, LL decode in the workers) against
  the same loop with its EP exchange over ``torch.distributed.all_to_all_single`` on gloo
  (``exchange: a2a``), at the default worker count, with and without preemption;
- scaling: 1, 2 and 4 rollout workers (no preemption).
Within each repeat every configuration runs once, in the same order, ProxyEP and a2a
interleaved, so that drift of the (shared) machine hits all of them alike.

Preemption (default): one Spot notice per worker, worker i after iteration (i + 1) * N / (W + 1)
of N (the run's ``preempt.schedule`` in iterations, so that both exchanges are hit at the same
point of their runs, whatever their speed). ``--preempt-rate R`` uses the run's Poisson notices
(per worker per minute) instead.

What is measured, per configuration over all its repeats:
- iteration time p50/p95/p99 over every iteration of every repeat except each run's first (it
  includes starting the workers and their first weight pull);
- rollout tokens/s of each run (its rollout tokens over its iteration seconds, first iteration
  excluded likewise), median and spread (min, max, quartiles) over the repeats;
- weight sync seconds, the reward curve (every iteration, mean/min/max over repeats);
- samples lost and duplicated (summary.json of each run): anything but 0 is a failure and the
  benchmark exits 1, as it does when a run fails.
The report and the plots are bench_rl_report.py's.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from .coordinator.protocol import RLError
from .run import Supervisor, default_cli
from .run_config import RunConfig


class Variant:
    """One configuration of the benchmark: the exchange, the number of rollout workers and
    whether workers are preempted."""

    def __init__(self, exchange, workers, preempt):
        self.exchange, self.workers, self.preempt = exchange, workers, preempt

    @property
    def name(self):
        return f"{self.exchange}-w{self.workers}" + ("-preempt" if self.preempt else "")

    def to_dict(self):
        return {"exchange": self.exchange, "workers": self.workers, "preempt": self.preempt}


def variant_config(base: RunConfig, variant: Variant, iterations, preempt_rate):
    """The RunConfig of ``variant``: ``base`` with its exchange, workers and preemption."""
    d = base.to_dict()
    d["grpo"]["iterations"] = iterations
    d["trainer"]["exchange"] = d["rollout"]["exchange"] = variant.exchange
    d["rollout"]["workers"] = variant.workers
    # the base's faults are replaced by the variant's
    d["preempt"]["rate"] = preempt_rate if (variant.preempt and preempt_rate) else 0.0
    d["preempt"]["schedule"] = []
    if variant.preempt and not preempt_rate:
        d["preempt"]["schedule_unit"] = "iterations"
        d["preempt"]["schedule"] = [[at, i] for i, at in enumerate(notice_iterations(iterations, variant.workers))]
    return RunConfig.from_dict(d)


def notice_iterations(iterations, workers):
    """After which iteration each worker gets its notice: evenly spread, 1 .. N-1."""
    return [min(iterations - 1, max(1, round((i + 1) * iterations / (workers + 1)))) for i in range(workers)]


class BenchSupervisor(Supervisor):
    """The run's Supervisor with a deadline for the whole run: past it, an error naming the
    iteration it got to (raised from the progress poll, which runs every 50 ms of Supervisor.run's
    loop, so the stop goes through its finally: every job it started is stopped)."""

    def __init__(self, *args, deadline_s, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline_s = deadline_s

    def _print_progress(self):
        super()._print_progress()
        if self.started is not None and time.monotonic() - self.started > self.deadline_s:
            raise RLError(f"bench rl: the run did not finish within {self.deadline_s:.0f} s (at iteration "
                          f"{len(self.records)} of {self.config.grpo.iterations}; see {self.run_dir}/logs)")


def _read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def run_once(variant, config, run_dir, cli, deadline_s):
    """One run of ``variant``: its result as read back from the run directory (metrics.jsonl,
    summary.json, events.jsonl). Never raises for a failed run: ``error`` says what failed."""
    started = time.monotonic()
    error, code = None, None
    try:
        sup = BenchSupervisor(config, run_dir, cli=cli, quiet=True, deadline_s=deadline_s)
        code = sup.run()
        if code != 0:
            error = f"the trainer exited with {code} (see {run_dir}/logs/trainer.log)"
    except RLError as e:
        error = str(e)
    wall_s = time.monotonic() - started
    metrics = _read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    events = _read_jsonl(os.path.join(run_dir, "events.jsonl"))
    summary = None
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
    elif error is None:
        error = f"no summary.json in {run_dir}"
    if error is None and len(metrics) != config.grpo.iterations:
        error = f"{len(metrics)} of {config.grpo.iterations} iterations in metrics.jsonl"
    timed = metrics[1:]  # the first iteration includes the workers' start and first weight pull
    tokens = sum(m["rollout_tokens"] for m in timed)
    seconds = sum(m["iteration_s"] for m in timed)
    preempts = [e for e in events if e["event"] == "preempt" and e.get("why") != "run finished"]
    return {
        "run_dir": run_dir, "exit_code": code, "error": error, "wall_s": wall_s,
        "iterations": len(metrics),
        "iteration_s": [m["iteration_s"] for m in metrics],
        "rollout_s": [m["rollout_s"] for m in metrics],
        "train_s": [m["train_s"] for m in metrics],
        "sync_s": [m["sync_s"] for m in metrics],
        "rollout_tokens": [m["rollout_tokens"] for m in metrics],
        "reward_mean": [m["reward_mean"] for m in metrics],
        "weight_sync_bytes": [m["weight_sync"]["bytes"] for m in metrics],
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "lost": summary["lost"] if summary else None,
        "duplicated": summary["duplicated"] if summary else None,
        "pool": summary["pool"] if summary else None,
        "preemptions": len(preempts),
        "worker_restarts": sum(1 for e in events if e["event"] == "worker_started") - config.rollout.workers,
    }


def _pct(values):
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "min": float(a.min()),
            "max": float(a.max()), "n": int(a.size)}


def _spread(values):
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max()),
            "q1": float(np.percentile(a, 25)), "q3": float(np.percentile(a, 75)), "n": int(a.size),
            "per_run": [float(v) for v in values]}


def summarize(runs):
    """A configuration's figures over its runs (first iteration of each excluded from timings)."""
    ok = [r for r in runs if r["error"] is None]
    curve = None
    if ok:
        n = min(len(r["reward_mean"]) for r in ok)
        cols = [[r["reward_mean"][i] for r in ok] for i in range(n)]
        curve = {"mean": [float(np.mean(c)) for c in cols], "min": [min(c) for c in cols],
                 "max": [max(c) for c in cols]}
    return {
        "runs_ok": len(ok), "runs_failed": len(runs) - len(ok),
        "iteration_s": _pct([v for r in ok for v in r["iteration_s"][1:]]),
        "rollout_s": _pct([v for r in ok for v in r["rollout_s"][1:]]),
        "train_s": _pct([v for r in ok for v in r["train_s"][1:]]),
        "weight_sync_s": _pct([v for r in ok for v in r["sync_s"][1:]]),
        "weight_sync_bytes": (ok[0]["weight_sync_bytes"][-1] if ok and ok[0]["weight_sync_bytes"] else None),
        "rollout_tokens_per_s": _spread([r["tokens_per_s"] for r in ok if r["tokens_per_s"] is not None]),
        "reward_curve": curve,
        "lost": sum(r["lost"] or 0 for r in runs), "duplicated": sum(r["duplicated"] or 0 for r in runs),
        "preemptions": sum(r["preemptions"] for r in runs),
        "requeued": sum((r["pool"] or {}).get("requeued", 0) for r in runs),
        "interrupted": sum((r["pool"] or {}).get("interrupted", 0) for r in runs),
    }


def _ratio(a, b):
    return a / b if a is not None and b else None


def compare(configs, exchanges, workers, scaling):
    """Ratios within this invocation: ProxyEP over a2a (tokens/s medians, iteration p50), p99
    with preemption over p99 without, and tokens/s against the number of workers."""
    def get(name, *path):
        v = configs.get(name, {}).get("summary")
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        return v

    out = {"proxyep_over_a2a": {}, "preempt_p99_ratio": {}, "scaling": {}}
    if "proxyep" in exchanges and "a2a" in exchanges:
        for w in sorted({workers, *scaling}):
            for suffix in ("", "-preempt"):
                p, a = f"proxyep-w{w}{suffix}", f"a2a-w{w}{suffix}"
                if p in configs and a in configs:
                    out["proxyep_over_a2a"][p.replace("proxyep-", "")] = {
                        "tokens_per_s": _ratio(get(p, "rollout_tokens_per_s", "median"),
                                               get(a, "rollout_tokens_per_s", "median")),
                        "iteration_p50_speedup": _ratio(get(a, "iteration_s", "p50"), get(p, "iteration_s", "p50")),
                    }
    for x in exchanges:
        with_, without = f"{x}-w{workers}-preempt", f"{x}-w{workers}"
        if with_ in configs and without in configs:
            out["preempt_p99_ratio"][x] = _ratio(get(with_, "iteration_s", "p99"), get(without, "iteration_s", "p99"))
        points = {}
        for w in sorted({workers, *scaling}):
            s = get(f"{x}-w{w}", "rollout_tokens_per_s")
            if s:
                points[str(w)] = {"median": s["median"], "min": s["min"], "max": s["max"]}
        if len(points) > 1:
            out["scaling"][x] = points
    main = out["proxyep_over_a2a"].get(f"w{workers}", {}).get("tokens_per_s")
    p99 = out["preempt_p99_ratio"].get("proxyep")
    out["targets"] = {
        "proxyep_tokens_per_s_over_a2a_at_least_1.4": {"value": main, "met": None if main is None else main >= 1.4},
        "proxyep_preempt_p99_over_no_preempt_at_most_2": {"value": p99, "met": None if p99 is None else p99 <= 2.0},
    }
    return out


def machine():
    """What the figures were measured on."""
    import torch

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"hostname": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(),
            "cores_usable": len(os.sched_getaffinity(0)), "memory_bytes": mem, "kernel": platform.release(),
            "os": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "numpy": np.__version__, "loadavg_at_start": list(os.getloadavg()),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _git_commit():
    here = os.path.dirname(os.path.realpath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _workers_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated worker counts, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"worker counts must be positive, got {text!r}")
    return values


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m proxyep.bench rl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="output directory (default: runs/bench-rl-<time>)")
    p.add_argument("--config", default="{}", help="the base RunConfig (file or inline JSON); exchange, "
                   "workers, iterations and preemption are the benchmark's")
    p.add_argument("--repeats", type=int, default=None, help="runs per configuration (default 5; --quick 2)")
    p.add_argument("--iterations", type=int, default=None, help="GRPO iterations per run (default 30; --quick 4)")
    p.add_argument("--workers", type=int, default=None, help="rollout workers of the main comparison "
                   "(default: the base config's)")
    p.add_argument("--scaling", type=_workers_list, default=None,
                   help="worker counts of the scaling series (default 1,2,4; --quick 1,2)")
    p.add_argument("--scaling-exchanges", default=None,
                   help="exchanges of the scaling series (default proxyep,a2a; --quick proxyep)")
    p.add_argument("--no-preempt", action="store_true", help="skip the preemption configurations")
    p.add_argument("--preempt-exchanges", default=None,
                   help="exchanges with a preemption configuration (default proxyep,a2a; --quick proxyep)")
    p.add_argument("--preempt-rate", type=float, default=0.0,
                   help="Poisson Spot notices per worker per minute instead of one notice per worker")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds one run may take (default: "
                   "120 + 10 per iteration)")
    p.add_argument("--quick", action="store_true", help="a smoke-sized benchmark (2 repeats of 4 iterations)")
    p.add_argument("--cli", default=None, help="the proxyep CLI (default: PROXYEP_RL_CLI or the build tree's)")
    p.add_argument("--json", action="store_true", help="print the JSON document at the end")
    args = p.parse_args(argv)
    q = args.quick
    args.repeats = args.repeats if args.repeats is not None else (2 if q else 5)
    args.iterations = args.iterations if args.iterations is not None else (4 if q else 30)
    args.scaling = args.scaling if args.scaling is not None else ([1, 2] if q else [1, 2, 4])
    for name in ("scaling_exchanges", "preempt_exchanges"):
        text = getattr(args, name) or ("proxyep" if q else "proxyep,a2a")
        values = [v.strip() for v in text.split(",") if v.strip()]
        if not values or any(v not in ("proxyep", "a2a") for v in values):
            p.error(f"--{name.replace('_', '-')}: a comma-separated list of proxyep, a2a; got {text!r}")
        setattr(args, name, values)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.iterations < 2:
        p.error("--iterations must be at least 2 (the first of each run is not timed)")
    if args.preempt_rate < 0:
        p.error("--preempt-rate must be >= 0")
    try:
        args.base = RunConfig.load(args.config)
        if args.workers is None:
            args.workers = args.base.rollout.workers
        if args.workers < 1:
            p.error("--workers must be at least 1")
        for w in sorted({args.workers, *args.scaling}):  # every configuration valid before anything runs
            for x in ("proxyep", "a2a"):
                variant_config(args.base, Variant(x, w, True), args.iterations, args.preempt_rate)
    except RLError as e:
        p.error(str(e))
    if args.run_timeout is None:
        args.run_timeout = 120.0 + 10.0 * args.iterations
    return args


def build_plan(args):
    """Every configuration of this invocation, in the order each repeat runs them."""
    variants = [Variant(x, args.workers, False) for x in ("proxyep", "a2a")]
    if not args.no_preempt:
        variants += [Variant(x, args.workers, True) for x in args.preempt_exchanges]
    for w in args.scaling:
        if w != args.workers:
            variants += [Variant(x, w, False) for x in args.scaling_exchanges]
    return variants


def reproduce_command(argv):
    return "python3 -m proxyep.bench rl " + " ".join(shlex.quote(a) for a in argv)


def run_bench(args, argv, out=sys.stdout):
    """Runs every configuration ``args.repeats`` times; returns the JSON document (also written
    to OUT/bench_rl.json, with the report and the plots beside it)."""
    from . import bench_rl_report

    bench_rl_report.check_matplotlib()  # before anything runs: plots are part of the result
    out_dir = args.out or os.path.join("runs", time.strftime("bench-rl-%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    cli = args.cli or default_cli()
    variants = build_plan(args)
    configs = {v.name: {"variant": v.to_dict(),
                        "config": variant_config(args.base, v, args.iterations, args.preempt_rate).to_dict(),
                        "runs": []} for v in variants}
    doc = {"benchmark": "rl", "command": reproduce_command(argv), "machine": machine(), "git": _git_commit(),
           "settings": {"repeats": args.repeats, "iterations": args.iterations, "workers": args.workers,
                        "scaling": args.scaling, "scaling_exchanges": args.scaling_exchanges,
                        "preempt": None if args.no_preempt else (
                            {"mode": "rate", "per_worker_per_minute": args.preempt_rate, "exchanges":
                             args.preempt_exchanges} if args.preempt_rate else
                            {"mode": "one notice per worker, after iterations (preempt.schedule)",
                             "after_iterations": notice_iterations(args.iterations, args.workers),
                             "exchanges": args.preempt_exchanges}),
                        "run_timeout_s": args.run_timeout, "quick": args.quick,
                        "base_config": args.base.to_dict(), "cli": cli,
                        "timing_excludes": "the first iteration of each run (workers starting, first weight pull)",
                        "order": [v.name for v in variants]},
           "configurations": configs}
    total = len(variants) * args.repeats
    k = 0
    for repeat in range(args.repeats):
        for v in variants:
            k += 1
            run_dir = os.path.join(out_dir, "runs", v.name, f"r{repeat}")
            if os.path.exists(run_dir):
                raise RLError(f"bench rl: {run_dir} exists already (use a new --out)")
            config = RunConfig.from_dict(configs[v.name]["config"])
            r = run_once(v, config, run_dir, cli, args.run_timeout)
            r["repeat"] = repeat
            configs[v.name]["runs"].append(r)
            status = "ok" if r["error"] is None else f"FAILED: {r['error']}"
            it = r["iteration_s"][1:]
            tps = r["tokens_per_s"]
            out.write(f"[{k}/{total}] {v.name} repeat {repeat}: {r['iterations']} it, iter p50 "
                      f"{(float(np.median(it)) if it else float('nan')):.3f} s, "
                      f"{(tps if tps is not None else float('nan')):.0f} tok/s, preempted {r['preemptions']}, "
                      f"lost {r['lost']} dup {r['duplicated']}, {r['wall_s']:.0f} s: {status}\n")
            out.flush()
    for name, c in configs.items():
        c["summary"] = summarize(c["runs"])
    doc["comparisons"] = compare(configs, ["proxyep", "a2a"], args.workers, args.scaling)
    failed = [r["run_dir"] + ": " + r["error"] for c in configs.values() for r in c["runs"] if r["error"]]
    lost = sum(c["summary"]["lost"] for c in configs.values())
    duplicated = sum(c["summary"]["duplicated"] for c in configs.values())
    doc["accounting"] = {"lost": lost, "duplicated": duplicated, "failed_runs": failed}
    doc["ok"] = not failed and lost == 0 and duplicated == 0
    doc["machine"]["loadavg_at_end"] = list(os.getloadavg())
    json_path = os.path.join(out_dir, "bench_rl.json")
    doc["outputs"] = {"json": json_path, "report": os.path.join(out_dir, "bench_rl.md"),
                      "plots": bench_rl_report.plot_paths(out_dir)}
    bench_rl_report.write_plots(doc, out_dir)
    bench_rl_report.write_report(doc, doc["outputs"]["report"])
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
    return doc


def _exit_on_signal(signum, frame):
    # SIGTERM/SIGINT unwind through the supervisor's finally blocks, which stop its jobs.
    raise SystemExit(128 + signum)


def main(argv=None):
    from . import bench_rl_report

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    try:
        # with --json, stdout is the document alone: the progress lines go to stderr
        doc = run_bench(args, argv, out=sys.stderr if args.json else sys.stdout)
    except RLError as e:
        print(f"bench rl: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(bench_rl_report.text_summary(doc))
    if not doc["ok"]:
        a = doc["accounting"]
        print(f"bench rl: FAILED: lost {a['lost']}, duplicated {a['duplicated']}, failed runs "
              f"{a['failed_runs']}", file=sys.stderr)
        return 1
    return 0
