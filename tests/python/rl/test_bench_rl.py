"""python.rl.bench_rl: ``python3 -m proxyep.bench rl --quick`` end to end (real GRPO runs: the
trainer and rollout workers as `proxyep launch` jobs, ProxyEP and the a2a baseline, one
preempted configuration, 1 and 2 workers), then its outputs checked against the runs they came
from: every figure recomputed from the run directories' metrics.jsonl / summary.json /
events.jsonl / config.json, no sample lost or duplicated, PNGs that are PNGs, a report naming
the configuration and the machine. Also: bad options are refused before anything runs, and a
run past its deadline makes the benchmark fail (exit 1, named in the JSON), its processes gone.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

QUICK_NAMES = ["proxyep-w2", "a2a-w2", "proxyep-w2-preempt", "proxyep-w1"]
QUICK_ITERATIONS = 4  # --quick's; the preempted configuration's notices come after iterations 1 and 3
# One run per configuration, not --quick's 2: each run is ~11 s of start-ups, and the figures
# over several repeats are checked on made-up runs (test_summary_over_repeats) instead.
REPEATS = 1


def bench(args, timeout):
    cmd = [sys.executable, "-m", "proxyep.bench", "rl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bench") / "out")
    proc = bench(["--quick", "--repeats", str(REPEATS), "--out", out, "--json"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    with open(os.path.join(out, "bench_rl.json")) as f:
        assert json.load(f) == doc
    return out, doc


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_sections_and_accounting(quick):
    out, doc = quick
    assert doc["ok"] is True and doc["accounting"] == {"lost": 0, "duplicated": 0, "failed_runs": []}
    for key in ("cpu", "cores", "kernel", "python", "torch", "date"):
        assert doc["machine"][key], key
    st = doc["settings"]
    assert st["repeats"] == REPEATS and st["iterations"] == QUICK_ITERATIONS and st["order"] == QUICK_NAMES
    assert list(doc["configurations"]) == QUICK_NAMES
    for name, c in doc["configurations"].items():
        s = c["summary"]
        assert s["runs_ok"] == REPEATS and s["runs_failed"] == 0, name
        assert set(s["iteration_s"]) >= {"p50", "p95", "p99"}, name
        assert s["iteration_s"]["n"] == REPEATS * (QUICK_ITERATIONS - 1), name  # each run's first not timed
        assert s["rollout_tokens_per_s"]["median"] > 0 and len(s["rollout_tokens_per_s"]["per_run"]) == REPEATS, name
        assert len(s["reward_curve"]["mean"]) == QUICK_ITERATIONS and s["weight_sync_s"]["p50"] >= 0, name
        assert s["lost"] == 0 and s["duplicated"] == 0, name
    cmp_ = doc["comparisons"]
    assert set(cmp_["proxyep_over_a2a"]) == {"w2"} and cmp_["proxyep_over_a2a"]["w2"]["tokens_per_s"] > 0
    assert set(cmp_["preempt_p99_ratio"]) == {"proxyep"} and cmp_["preempt_p99_ratio"]["proxyep"] > 0
    assert set(cmp_["scaling"]) == {"proxyep"} and set(cmp_["scaling"]["proxyep"]) == {"1", "2"}
    assert cmp_["targets"]["proxyep_tokens_per_s_over_a2a_at_least_1.4"]["value"] == \
        cmp_["proxyep_over_a2a"]["w2"]["tokens_per_s"]


def test_figures_come_from_the_runs(quick):
    out, doc = quick
    for name, c in doc["configurations"].items():
        times, per_run = [], []
        for r in c["runs"]:
            run_dir = r["run_dir"]
            assert run_dir == os.path.join(out, "runs", name, f"r{r['repeat']}")
            metrics = _jsonl(os.path.join(run_dir, "metrics.jsonl"))
            assert len(metrics) == QUICK_ITERATIONS
            times += [m["iteration_s"] for m in metrics[1:]]  # the first iteration is not timed
            per_run.append(sum(m["rollout_tokens"] for m in metrics[1:]) / sum(m["iteration_s"] for m in metrics[1:]))
            with open(os.path.join(run_dir, "summary.json")) as f:
                summary = json.load(f)
            assert summary["lost"] == 0 and summary["duplicated"] == 0 and r["lost"] == 0 and r["duplicated"] == 0
            with open(os.path.join(run_dir, "config.json")) as f:
                config = json.load(f)
            assert config == c["config"], name
            assert config["trainer"]["exchange"] == config["rollout"]["exchange"] == c["variant"]["exchange"]
            assert config["rollout"]["workers"] == c["variant"]["workers"]
            assert config["grpo"]["iterations"] == QUICK_ITERATIONS
            notices = [e for e in _jsonl(os.path.join(run_dir, "events.jsonl"))
                       if e["event"] == "preempt" and e["why"] == "scheduled"]
            assert r["preemptions"] == len(notices)
            if c["variant"]["preempt"]:
                assert notices, f"{run_dir}: no Spot notice during the run"
            else:
                assert not notices
        s = c["summary"]
        assert s["iteration_s"]["p50"] == pytest.approx(statistics.median(times), rel=1e-9), name
        assert s["iteration_s"]["max"] == pytest.approx(max(times), rel=1e-9), name
        assert s["rollout_tokens_per_s"]["per_run"] == pytest.approx(per_run, rel=1e-9), name
        assert s["rollout_tokens_per_s"]["median"] == pytest.approx(statistics.median(per_run), rel=1e-9), name
    p, a = doc["configurations"]["proxyep-w2"]["summary"], doc["configurations"]["a2a-w2"]["summary"]
    assert doc["comparisons"]["proxyep_over_a2a"]["w2"]["tokens_per_s"] == pytest.approx(
        p["rollout_tokens_per_s"]["median"] / a["rollout_tokens_per_s"]["median"])


def test_report_and_plots(quick):
    out, doc = quick
    assert len(doc["outputs"]["plots"]) == 4
    for path in doc["outputs"]["plots"]:
        with open(path, "rb") as f:
            head = f.read(8)
        assert head == b"\x89PNG\r\n\x1a\n", path
        assert os.path.getsize(path) > 1000, path
    with open(os.path.join(out, "bench_rl.md")) as f:
        report = f.read()
    for name in QUICK_NAMES:
        assert f"| {name} |" in report, name
    assert doc["command"] in report and "--quick" in doc["command"]
    assert doc["machine"]["cpu"] in report and '"group_size"' in report  # the machine, the base RunConfig
    p50 = doc["configurations"]["a2a-w2"]["summary"]["iteration_s"]["p50"]
    assert f"| {p50:.3f} |" in report


def _made_up_run(iteration_s, tokens_per_s, reward, error=None):
    return {"error": error, "iteration_s": iteration_s, "rollout_s": iteration_s, "train_s": iteration_s,
            "sync_s": iteration_s, "weight_sync_bytes": [64], "tokens_per_s": tokens_per_s,
            "reward_mean": reward, "lost": 0, "duplicated": 0, "preemptions": 1,
            "pool": {"requeued": 2, "interrupted": 1}}


def test_summary_over_repeats():
    """summarize() over three runs and a failed one: every run's timed iterations pooled (the
    first of each left out), tokens/s as a median over runs, the reward curve per iteration."""
    from proxyep.rl.bench_rl import summarize
    runs = [_made_up_run([9.0, 1.0, 2.0], 10.0, [0.1, 0.2, 0.3]),
            _made_up_run([9.0, 3.0, 4.0], 30.0, [0.3, 0.4, 0.5]),
            _made_up_run([9.0, 5.0, 6.0], 20.0, [0.2, 0.6, 0.1]),
            _made_up_run([], None, [], error="did not finish")]
    s = summarize(runs)
    assert s["runs_ok"] == 3 and s["runs_failed"] == 1
    assert s["iteration_s"]["n"] == 6 and s["iteration_s"]["p50"] == pytest.approx(3.5)
    assert s["iteration_s"]["max"] == 6.0 and s["iteration_s"]["min"] == 1.0
    assert s["rollout_tokens_per_s"]["median"] == 20.0 and s["rollout_tokens_per_s"]["per_run"] == [10.0, 30.0, 20.0]
    assert s["reward_curve"]["mean"] == pytest.approx([0.2, 0.4, 0.3])
    assert s["reward_curve"]["min"] == [0.1, 0.2, 0.1] and s["reward_curve"]["max"] == [0.3, 0.6, 0.5]
    assert (s["preemptions"], s["requeued"], s["interrupted"]) == (4, 8, 4)


BAD_OPTIONS = [
    (["--iterations", "1"], "--iterations must be at least 2"),
    (["--config", '{"rollout": {"workerz": 3}}'], "unknown keys"),
    (["--scaling", "0,2"], "worker counts must be positive"),
    (["--preempt-exchanges", "nccl"], "--preempt-exchanges"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Every BAD_OPTIONS invocation, started together (each is mostly a Python and torch start-up):
    (exit code, stderr, its --out) per entry, in order."""
    base = tmp_path_factory.mktemp("refused")
    started = []
    try:
        for i, (args, _) in enumerate(BAD_OPTIONS):
            out = base / f"out{i}"
            proc = subprocess.Popen([sys.executable, "-m", "proxyep.bench", "rl", "--out", str(out), *args],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            started.append((proc, out))
        results = []
        for proc, out in started:
            _, stderr = proc.communicate(timeout=120)
            results.append((proc.returncode, stderr, out))
        return results
    finally:
        for proc, _ in started:  # only where a wait above failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("index", range(len(BAD_OPTIONS)), ids=[m for _, m in BAD_OPTIONS])
def test_bad_options_refused_before_anything_runs(refused, index):
    code, stderr, out = refused[index]
    assert code == 2 and BAD_OPTIONS[index][1] in stderr, stderr
    assert not out.exists()


def test_a_run_past_its_deadline_fails_the_benchmark(tmp_path):
    out = tmp_path / "out"
    proc = bench(["--out", str(out), "--repeats", "1", "--iterations", "4", "--no-preempt", "--scaling", "2",
                  "--run-timeout", "2", "--json"], timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and len(doc["accounting"]["failed_runs"]) == 2
    for c in doc["configurations"].values():
        (r,) = c["runs"]
        assert "did not finish within 2 s" in r["error"], r["error"]
        assert c["summary"]["runs_failed"] == 1 and c["summary"]["iteration_s"] is None
        # every process the run started is gone (stopped through the supervisor's finally)
        pids = [e["pid"] for e in _jsonl(os.path.join(r["run_dir"], "events.jsonl")) if e["event"] == "worker_started"]
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in pids), pids
    assert "FAILED" in open(out / "bench_rl.md").read()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes (its parent, the benchmark, has exited)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
