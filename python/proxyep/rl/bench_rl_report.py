"""The outputs of ``python3 -m proxyep.bench rl`` (bench_rl.py) besides its JSON document: the
Markdown report (tables, ratios, the full configuration, the machine, the command that
reproduces it), the PNG plots (matplotlib's Agg backend: no display needed) and the short text
summary printed at the end. Everything here reads the document only, so a report can be rebuilt
from a saved bench_rl.json."""

import importlib.util
import json
import os

PLOTS = ("iteration_time.png", "throughput.png", "reward.png", "scaling.png")


def check_matplotlib():
    """Fails before any run when the plots could not be drawn (python3-matplotlib, Debian)."""
    if importlib.util.find_spec("matplotlib") is None:
        from .coordinator.protocol import RLError

        raise RLError("bench rl: matplotlib is needed for the plots (Debian: python3-matplotlib, "
                      "scripts/install-deps.sh)")


def plot_paths(out_dir):
    return [os.path.join(out_dir, name) for name in PLOTS]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ok_runs(c):
    return [r for r in c["runs"] if r["error"] is None]


def write_plots(doc, out_dir):
    """iteration_time.png: the distribution of iteration times per configuration (first
    iteration of each run excluded); throughput.png: rollout tokens/s per configuration, median
    with min-max bars and every run as a dot; reward.png: reward per iteration (mean over repeats,
    min-max band); scaling.png: tokens/s against rollout workers."""
    plt = _pyplot()
    configs = doc["configurations"]
    names = list(configs)
    paths = dict(zip(PLOTS, plot_paths(out_dir)))

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    data = [[v for r in _ok_runs(configs[n]) for v in r["iteration_s"][1:]] for n in names]
    shown = [(n, d) for n, d in zip(names, data) if d]
    if shown:
        ax.boxplot([d for _, d in shown], whis=(1, 99), showfliers=True, flierprops={"markersize": 3})
        ax.set_xticks(range(1, len(shown) + 1), [n for n, _ in shown], rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("iteration time (s, log)")
    ax.set_title("Iteration time per configuration (whiskers p1-p99; first iteration of each run excluded)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(paths["iteration_time.png"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    for i, n in enumerate(names):
        s = configs[n]["summary"]["rollout_tokens_per_s"]
        if not s:
            continue
        color = "tab:blue" if configs[n]["variant"]["exchange"] == "proxyep" else "tab:orange"
        ax.bar(i, s["median"], color=color, alpha=0.6,
               yerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]], capsize=4)
        ax.scatter([i] * len(s["per_run"]), s["per_run"], color="black", s=10, zorder=3)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("rollout tokens/s (per run)")
    ax.set_title("Rollout throughput: median over repeats, bars min-max, dots = runs", fontsize=9)
    fig.tight_layout()
    fig.savefig(paths["throughput.png"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in names:
        curve = configs[n]["summary"]["reward_curve"]
        if not curve:
            continue
        x = range(1, len(curve["mean"]) + 1)
        (line,) = ax.plot(x, curve["mean"], label=n)
        ax.fill_between(x, curve["min"], curve["max"], color=line.get_color(), alpha=0.12)
    ax.set_xlabel("iteration")
    ax.set_ylabel("reward (mean of the batch)")
    ax.set_title("Reward per iteration: mean over repeats, band min-max", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths["reward.png"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for x, points in doc["comparisons"]["scaling"].items():
        ws = sorted(points, key=int)
        med = [points[w]["median"] for w in ws]
        err = [[points[w]["median"] - points[w]["min"] for w in ws],
               [points[w]["max"] - points[w]["median"] for w in ws]]
        ax.errorbar([int(w) for w in ws], med, yerr=err, marker="o", capsize=4, label=x)
    ax.set_xlabel("rollout workers")
    ax.set_ylabel("rollout tokens/s (median, min-max)")
    ax.set_title("Scaling over rollout workers (no preemption)", fontsize=9)
    if doc["comparisons"]["scaling"]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(paths["scaling.png"], dpi=110)
    plt.close(fig)


def _f(v, fmt="{:.3f}"):
    return "n/a" if v is None else fmt.format(v)


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def config_rows(doc):
    rows = []
    for name, c in doc["configurations"].items():
        s = c["summary"]
        it, tps, ws = s["iteration_s"] or {}, s["rollout_tokens_per_s"] or {}, s["weight_sync_s"] or {}
        curve = s["reward_curve"]
        rows.append([
            name, f"{s['runs_ok']}/{s['runs_ok'] + s['runs_failed']}", it.get("n", 0),
            _f(it.get("p50")), _f(it.get("p95")), _f(it.get("p99")),
            _f(tps.get("median"), "{:.0f}"),
            f"{_f(tps.get('min'), '{:.0f}')}-{_f(tps.get('max'), '{:.0f}')}",
            f"{_f(tps.get('q1'), '{:.0f}')}-{_f(tps.get('q3'), '{:.0f}')}",
            _f(ws.get("p50")), _f(ws.get("p99")),
            (f"{curve['mean'][0]:.2f} -> {curve['mean'][-1]:.2f}" if curve else "n/a"),
            s["preemptions"], s["requeued"], s["lost"], s["duplicated"]])
    return rows


def write_report(doc, path):
    st, m, cmp_ = doc["settings"], doc["machine"], doc["comparisons"]
    a = doc["accounting"]
    out = ["# proxyep bench rl: GRPO rollout throughput, ProxyEP EP against all_to_all_single (gloo)", ""]
    out.append(f"{m['date']} on {m['hostname']}; verdict: **{'OK' if doc['ok'] else 'FAILED'}** "
               f"(samples lost {a['lost']}, duplicated {a['duplicated']}, failed runs {len(a['failed_runs'])}).")
    out.append("")
    out.append(f"{st['repeats']} repeats of every configuration, {st['iterations']} GRPO iterations per run, "
               f"run order within each repeat: {', '.join(st['order'])}. Timings exclude "
               f"{st['timing_excludes']}. Iteration percentiles are over every remaining iteration of every "
               f"repeat; tokens/s is per run (rollout tokens / iteration seconds) with its median and spread "
               f"over the repeats.")
    out.append("")
    if st["preempt"]:
        p = st["preempt"]
        what = (f"Poisson Spot notices, {p['per_worker_per_minute']} per worker per minute" if p["mode"] == "rate"
                else f"one Spot notice per worker (worker i after iteration {p['after_iterations']}[i]; the "
                     f"run's preempt.schedule in iterations)")
        out += [f"Preemption: {what}; configurations with '-preempt'.", ""]
    out += ["## Results", "", _table(
        ["configuration", "runs ok", "iterations timed", "iter p50 s", "iter p95 s", "iter p99 s",
         "tokens/s median", "tokens/s min-max", "tokens/s IQR", "sync p50 s", "sync p99 s",
         "reward first -> last", "preemptions", "requeued", "lost", "duplicated"], config_rows(doc)), ""]
    out += ["## Ratios (same invocation)", ""]
    rows = [[f"proxyep / a2a at {k}", _f(v["tokens_per_s"], "{:.2f}x"), _f(v["iteration_p50_speedup"], "{:.2f}x")]
            for k, v in cmp_["proxyep_over_a2a"].items()]
    if rows:
        out += [_table(["comparison", "tokens/s ratio", "iteration p50 speedup (a2a / proxyep)"], rows), ""]
    for x, v in cmp_["preempt_p99_ratio"].items():
        out.append(f"- {x}: iteration p99 with preemption / without: {_f(v, '{:.2f}x')}")
    out.append("")
    for name, t in cmp_["targets"].items():
        met = "not measured" if t["met"] is None else ("met" if t["met"] else "NOT met")
        out.append(f"- target {name}: {_f(t['value'], '{:.2f}')} ({met}; reported, not asserted)")
    out.append("")
    if cmp_["scaling"]:
        ws = sorted({w for pts in cmp_["scaling"].values() for w in pts}, key=int)
        rows = [[x] + [(f"{pts[w]['median']:.0f} ({pts[w]['min']:.0f}-{pts[w]['max']:.0f})" if w in pts else "")
                       for w in ws] for x, pts in cmp_["scaling"].items()]
        out += ["## Scaling over rollout workers (tokens/s median, min-max)", "",
                _table(["exchange"] + [f"{w} workers" for w in ws], rows), ""]
    if a["failed_runs"]:
        out += ["## Failed runs", ""] + [f"- {f}" for f in a["failed_runs"]] + [""]
    out += ["## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in doc["outputs"]["plots"]]
    out += ["", "## Machine", "", _table(["", ""], [[k, v] for k, v in m.items()]), "",
            f"Source: {doc.get('git') or 'unknown'}", "",
            "## Configuration", "",
            "Base RunConfig (each configuration overrides grpo.iterations, trainer/rollout.exchange, "
            "rollout.workers and preempt; the full RunConfig of each is in bench_rl.json under "
            "configurations.NAME.config):", "", "```json", json.dumps(st["base_config"], indent=1, sort_keys=True),
            "```", "", _table(["configuration", "exchange", "workers", "preempted"],
                              [[n, c["variant"]["exchange"], c["variant"]["workers"], c["variant"]["preempt"]]
                               for n, c in doc["configurations"].items()]), "",
            "## Reproduce", "", "From the repository root, with the build's python/ on PYTHONPATH "
            "(PYTHONPATH=build/release/python):", "", "```", doc["command"], "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def text_summary(doc):
    lines = ["bench rl: " + ("OK" if doc["ok"] else "FAILED")]
    for row in config_rows(doc):
        lines.append(f"  {row[0]:22s} iter p50/p95/p99 {row[3]}/{row[4]}/{row[5]} s  tokens/s {row[6]} "
                     f"({row[7]})  lost {row[14]} dup {row[15]}")
    for k, v in doc["comparisons"]["proxyep_over_a2a"].items():
        lines.append(f"  proxyep/a2a {k}: tokens/s {_f(v['tokens_per_s'], '{:.2f}x')}, "
                     f"iteration p50 speedup {_f(v['iteration_p50_speedup'], '{:.2f}x')}")
    for x, v in doc["comparisons"]["preempt_p99_ratio"].items():
        lines.append(f"  {x}: p99 with/without preemption {_f(v, '{:.2f}x')}")
    lines.append(f"  report {doc['outputs']['report']}, JSON {doc['outputs']['json']}")
    return "\n".join(lines)
