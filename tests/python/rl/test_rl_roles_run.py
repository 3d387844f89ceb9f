"""A GRPO run from the three roles started on their own, as on separate machines, on loopback:
``proxyep.rl coordinator`` (a redis-server), a ``worker`` started first, which finds the
trainer's publisher through the coordinator's store, and a one-rank ``trainer`` with its
checkpoints in a directory. Also: a worker whose trainer never comes fails when its wait ends,
naming what it waited for; SIGTERM drains a worker (the Spot notice as Kubernetes delivers it);
the trainer started again resumes from its newest checkpoint.

Each role is a single process (one rank: RANK/WORLD_SIZE/MASTER_* given here, as a launcher
would), with the a2a exchange so no EP group needs a launcher. Every process is stopped by pid.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

from rl_run_helpers import FABRIC_ENV, stop_process, wait_or_stop

ITERATIONS = 3
CONFIG = {"grpo": {"iterations": ITERATIONS, "batch_groups": 2}, "seed": 3, "checkpoint_every": ITERATIONS,
          "trainer": {"ranks": 1, "ranks_per_node": 1, "exchange": "a2a"},
          "rollout": {"workers": 1, "ranks": 1, "exchange": "a2a", "drain_budget_s": 5.0, "lease_timeout_s": 10.0}}
DEADLINE_S = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Role:
    """One ``python3 -m proxyep.rl ROLE`` process, its output in a file."""

    def __init__(self, tmp_path, name, *args, single_rank=True):
        env = dict(os.environ, **FABRIC_ENV, PROXYEP_RL_AUTHKEY="5a" * 32)
        if single_rank:
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(free_port()))
        self.log_path = tmp_path / f"{name}-{time.time_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "proxyep.rl", *args], env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s, what):
        return wait_or_stop(self.proc, timeout_s, 30, lambda: f"{what}: not within {timeout_s} s\n{self.log()[-3000:]}")

    def stop(self):
        stop_process(self.proc, 30)


def wait_for_file(path, timeout_s, what, *roles):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        for role in roles:
            assert role.proc.poll() is None, f"{what}: a role exited with {role.proc.returncode}\n{role.log()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s\n" + "\n".join(
            r.log()[-3000:] for r in roles)
        time.sleep(0.05)


def run_to_the_end(tmp_path, url, config, worker_id):
    """A worker, then the trainer; when the trainer says it is done, SIGTERM drains the worker
    (exit 0) and the trainer is told the pool stopped, as ``proxyep rl run`` does."""
    run_dir = tmp_path / "run"
    for name in ("trainer-done", "workers-stopped"):
        if (run_dir / name).exists():
            (run_dir / name).unlink()
    worker = Role(tmp_path, worker_id, "worker", "--config", json.dumps(config), "--coordinator", url,
                  "--worker-id", worker_id, "--wait-for-weights-s", str(DEADLINE_S))
    trainer = Role(tmp_path, "trainer", "trainer", "--config", json.dumps(config), "--coordinator", url,
                   "--run-dir", str(run_dir), "--checkpoints", str(tmp_path / "checkpoints"),
                   "--publish", "127.0.0.1:0")
    try:
        wait_for_file(run_dir / "trainer-done", DEADLINE_S, "trainer-done", worker, trainer)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(config["rollout"]["drain_budget_s"] + 15, "the worker's drain") == 0, worker.log()
        (run_dir / "workers-stopped").touch()
        assert trainer.wait(60, "the trainer's exit") == 0, trainer.log()[-3000:]
    finally:
        worker.stop()
        trainer.stop()
    return worker, trainer


def test_roles_run_across_machines(tmp_path):
    import redis

    coordinator = Role(tmp_path, "coordinator", "coordinator", "--dir", str(tmp_path / "redis"), "--port", "0",
                       "--url-file", str(tmp_path / "url"), single_rank=False)
    try:
        wait_for_file(tmp_path / "url", 30, "coordinator URL", coordinator)
        url = (tmp_path / "url").read_text().strip()

        # No trainer: the worker's wait ends with an error naming the store and the key.
        lonely = Role(tmp_path, "lonely", "worker", "--config", json.dumps(CONFIG), "--coordinator", url,
                      "--wait-for-weights-s", "1")
        assert lonely.wait(60, "the lonely worker") == 1
        assert f"waiting for weights: no trainer announced its weight publisher in {url} (key proxyep:rl:publisher) " \
               "within 1 s" in lonely.log(), lonely.log()

        worker, trainer = run_to_the_end(tmp_path, url, CONFIG, "w0")
        assert "weights from 127.0.0.1:" in worker.log() and "stopped (rank 0: SIGTERM)" in worker.log(), worker.log()
        with open(tmp_path / "run" / "metrics.jsonl") as f:
            assert [json.loads(line)["iteration"] for line in f] == list(range(1, ITERATIONS + 1))
        with open(tmp_path / "run" / "summary.json") as f:
            summary = json.load(f)
        assert summary["lost"] == 0 and summary["duplicated"] == 0, summary
        client = redis.Redis.from_url(url, socket_timeout=5)
        assert client.get("proxyep:rl:publisher") is None  # withdrawn by the trainer that ended
        client.close()

        # The trainer again, with more iterations: it resumes from its checkpoint at ITERATIONS
        # and publishes that version to a new worker, which finds it through the store.
        more = dict(CONFIG, grpo=dict(CONFIG["grpo"], iterations=ITERATIONS + 1))
        worker, trainer = run_to_the_end(tmp_path, url, more, "w1")
        assert f"resume: checkpoint {ITERATIONS} (version {ITERATIONS})" in trainer.log(), trainer.log()[-3000:]
        with open(tmp_path / "run" / "metrics.jsonl") as f:
            assert [json.loads(line)["iteration"] for line in f] == list(range(1, ITERATIONS + 2))
    finally:
        coordinator.stop()
    assert coordinator.proc.returncode == 0, coordinator.log()
