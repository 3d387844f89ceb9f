"""Helpers of test_rl_run.py: a GRPO run (``python3 -m proxyep.rl run``) as a real child process
on loopback, its run directory's files, and the processes of its jobs found by pid.

Every wait has a deadline and names what it waited for; every process started here is stopped
by its pid (the supervisor by SIGTERM, which stops its own jobs in its finally blocks; SIGKILL
only if it outlives that).
"""

import json
import os
import signal
import subprocess
import sys
import time

# The EP traffic of every launched job goes over TCP with the reorder shim (unordered
# completions), as the project's correctness tests run it.
FABRIC_ENV = {"PROXYEP_FABRIC_PROVIDER": "tcp", "PROXYEP_FABRIC_REORDER": "1", "PROXYEP_EP_TIMEOUT_MS": "20000"}


def small_config(**sections):
    """The reference model and task with a short run; ``sections`` update it, one level deep."""
    config = {"grpo": {"iterations": 12}, "rollout": {"lease_timeout_s": 10.0}, "checkpoint_every": 0, "seed": 3}
    for name, value in sections.items():
        if isinstance(value, dict):
            config.setdefault(name, {}).update(value)
        else:
            config[name] = value
    return config


class Run:
    """One ``python3 -m proxyep.rl run`` process over ``run_dir``."""

    def __init__(self, run_dir, config, *args, env=None):
        self.run_dir = str(run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        self.config = config
        full_env = dict(os.environ, **FABRIC_ENV, **(env or {}))
        self.log_path = os.path.join(self.run_dir, f"supervisor-{time.time_ns()}.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "proxyep.rl", "run", "--run-dir", self.run_dir,
                                          "--config", json.dumps(config), *args],
                                         env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def logs(self):
        """Every log of the run directory, for a failure's message."""
        out = [f"--- supervisor\n{self.output()[-3000:]}"]
        logs = os.path.join(self.run_dir, "logs")
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            with open(os.path.join(logs, name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)

    def wait(self, timeout_s):
        """The supervisor's exit code; on the deadline it is stopped and the test fails."""
        return wait_or_stop(self.proc, timeout_s, 90, lambda: f"the run did not end within {timeout_s} s\n{self.logs()}")

    def stop(self):
        stop_process(self.proc, 90)

    # ---- the run directory ----

    def jsonl(self, name):
        path = os.path.join(self.run_dir, name)
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def metrics(self):
        return self.jsonl("metrics.jsonl")

    def events(self, kind=None):
        return [e for e in self.jsonl("events.jsonl") if kind is None or e["event"] == kind]

    def summary(self):
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            return json.load(f)

    def worker_log(self, index):
        with open(os.path.join(self.run_dir, "logs", f"worker-{index}.log"), errors="replace") as f:
            return f.read()


def stop_process(proc, grace_s):
    """SIGTERM to a process this test started (its drain), SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_or_stop(proc, timeout_s, grace_s, failure):
    """The process's exit code; past ``timeout_s`` it is stopped (stop_process) and the test fails
    with ``failure()``'s message."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(proc, grace_s)
        raise AssertionError(failure())


def wait_for(predicate, timeout_s, what, run=None):
    """Polls ``predicate`` until it is true; AssertionError naming ``what`` on the deadline or
    when the run's supervisor exits first."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if run is not None and run.proc.poll() is not None:
            raise AssertionError(f"the run ended (code {run.proc.returncode}) while waiting for {what}\n{run.logs()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s} s" + (f"\n{run.logs()}" if run else ""))
        time.sleep(0.05)


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_of(int(entry)) == pid:
                    out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_accounting(summary):
    """What every run's summary must say: nothing lost, nothing consumed twice, every submitted
    group ended in the pool, every collected one placed."""
    assert summary["lost"] == 0, summary
    assert summary["duplicated"] == 0, summary
    pool, controller = summary["pool"], summary["controller"]
    assert pool["submitted"] == controller["submitted"], summary
    assert pool["completed_groups"] + pool["failed_groups"] + pool["aborted_groups"] == pool["submitted"], summary
    assert pool["running"] == 0 and pool["queued"] == 0, summary
