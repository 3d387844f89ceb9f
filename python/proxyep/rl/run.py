"""``python3 -m proxyep.rl run --config FILE`` (and ``proxyep rl run``): a GRPO run as local
process groups, supervised.

- the trainer: ``proxyep launch -n T -- python3 -m proxyep.rl trainer`` (roles/trainer.py; its
  rank 0 hosts the coordinator, the buffer and the weight publisher, and writes endpoints.json);
- the rollout pool: W workers, each ``proxyep launch -n R --ranks-per-node P -- python3 -m
  proxyep.rl worker`` (roles/worker.py; its own EP group, never a member of the trainer's),
  pointed at the coordinator and at the publisher, from which each rank pulls the latest
  committed weights. The same entry points run each role on its own machine (deploy/kubernetes/rl);
- preemption (``--preempt RATE`` per worker per minute, or a schedule): the supervisor writes a
  worker's notice file (the stand-in for the Spot notice); the worker stops leasing, flushes and
  releases as interrupted, exits 0; after ``restart_delay_s`` a replacement with a new worker id
  joins and pulls the latest weights. A worker that dies any other way is replaced too; a
  schedule entry of kind "kill" makes one die that way (SIGKILL to its ranks and launcher: a lost
  machine, whose leases the coordinator requeues when they expire).
- ``"coordinator": "redis"``: the supervisor runs its own redis-server (append-only, in
  <run dir>/redis, coordinator/redis_server.py) and hands its URL to the trainer
  (PROXYEP_RL_REDIS_URL) and, through endpoints.json, to the workers; if that server dies it is
  restarted on the same port and directory (it reloads its append-only file) and the run goes on.
- a live progress line per iteration (from the trainer's metrics.jsonl), and at the end a table.

Everything lives in the run directory: config.json, endpoints.json, metrics.jsonl, logs/,
checkpoints/ (unless the config puts them in S3), events.jsonl (preemptions, kills, restarts),
redis/ (with the redis coordinator).
``--resume`` restarts the trainer from its newest complete checkpoint (workers are replaced too:
they pull the checkpoint's version from the new publisher).
"""

import dataclasses
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time

from .coordinator.protocol import RLError
from .run_config import RunConfig

HERE = os.path.dirname(os.path.abspath(__file__))


def default_cli():
    """The proxyep CLI: PROXYEP_RL_CLI, else the build tree this package was imported from
    (<build>/python/proxyep/rl -> <build>/tools/proxyep), else `proxyep` on PATH."""
    if os.environ.get("PROXYEP_RL_CLI"):
        return os.environ["PROXYEP_RL_CLI"]
    # The package is linked into <build>/python; resolve the link's directory, not the source's.
    here = os.path.dirname(os.path.abspath(sys.modules["proxyep"].__file__))
    candidate = os.path.normpath(os.path.join(here, "..", "..", "tools", "proxyep"))
    return candidate if os.path.exists(candidate) else "proxyep"


def stop_launch(proc, wait_s, grace_s):
    """Stops a ``proxyep launch`` job: waits ``wait_s`` for it to end by itself, then SIGTERM to
    the launcher (which passes it to its ranks and SIGKILLs them after its grace period,
    ``grace_s``), and SIGKILL to the launcher only if it outlives that too."""
    if proc.poll() is not None:
        return
    try:
        proc.wait(timeout=wait_s)
        return
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def launched_ranks(launcher_pid):
    """The pids of a ``proxyep launch`` job's ranks: the launcher's children (each rank leads its
    own process group, so the launcher's group does not reach them). Found in /proc by parent pid."""
    ranks = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
        if int(stat[stat.rindex(")") + 2:].split()[1]) == launcher_pid:
            ranks.append(int(entry))
    return sorted(ranks)


def kill_launch(proc):
    """SIGKILL to a ``proxyep launch`` job's ranks, then to the launcher (a lost machine: nothing
    gets to flush or release). Returns the rank pids killed."""
    ranks = launched_ranks(proc.pid) if proc.poll() is None else []
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    return ranks


def _exit_on_signal(signum, frame):
    # SIGTERM/SIGINT end the supervisor through its finally blocks, which stop every job it
    # started (a plain kill would leave them running).
    raise SystemExit(128 + signum)


@dataclasses.dataclass
class WorkerSlot:
    index: int
    generation: int = 0
    proc: subprocess.Popen = None
    notice: str = ""
    noticed_at: float = None
    restart_at: float = None
    preemptions: int = 0
    restarts: int = 0

    @property
    def worker_id(self):
        return f"w{self.index}.{self.generation}"


class Supervisor:
    def __init__(self, config: RunConfig, run_dir, cli=None, resume=False, out=sys.stdout, quiet=False,
                 start_timeout_s=120.0):
        self.config, self.run_dir, self.resume, self.out, self.quiet = config, run_dir, resume, out, quiet
        self.cli = cli or default_cli()
        self.start_timeout_s = start_timeout_s
        self.python = sys.executable
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        self.config_path = os.path.join(run_dir, "config.json")
        with open(self.config_path, "w") as f:
            f.write(config.to_json())
        self.env = dict(os.environ)
        self.env.setdefault("PROXYEP_RL_AUTHKEY", secrets.token_hex(32))
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(HERE)),
                                                             self.env.get("PYTHONPATH", "")] if p)
        self.redis = None  # the RedisServer of "coordinator": "redis"
        self.trainer = None
        self.workers = [WorkerSlot(i) for i in range(config.rollout.workers)]
        self.rng = random.Random(config.preempt.seed)
        self.started = None
        self.printed = 0
        self.records = []

    # ---- processes ----

    def _log(self, name):
        return open(os.path.join(self.run_dir, "logs", f"{name}.log"), "ab")

    def _event(self, kind, **info):
        with open(os.path.join(self.run_dir, "events.jsonl"), "a") as f:
            f.write(json.dumps({"time": time.time(), "event": kind, **info}) + "\n")

    def _start_redis(self):
        from .coordinator.redis_server import RedisServer

        directory = os.path.join(self.run_dir, "redis")
        os.makedirs(directory, exist_ok=True)
        self.redis = RedisServer(directory, appendfsync=self.config.redis_appendfsync)
        self.env["PROXYEP_RL_REDIS_URL"] = self.redis.url
        self._event("redis_started", pid=self.redis.process.pid, port=self.redis.port)

    def _tend_redis(self):
        """A redis-server that died is started again on its port and directory (it reloads its
        append-only file); the trainer's host retries meanwhile, workers that fail are replaced."""
        if self.redis is None or self.redis.process.poll() is None:
            return
        self._event("redis_died", pid=self.redis.process.pid, code=self.redis.process.returncode)
        self.redis.start()
        self._event("redis_started", pid=self.redis.process.pid, port=self.redis.port)

    def _start_trainer(self):
        t = self.config.trainer
        cmd = [self.cli, "launch", "-n", str(t.ranks), "--ranks-per-node", str(t.ranks_per_node), "--",
               self.python, "-m", "proxyep.rl", "trainer", "--config", self.config_path, "--run-dir", self.run_dir]
        if not self.resume:
            cmd.append("--fresh")  # the role resumes by default; a run does only when asked
        endpoints = os.path.join(self.run_dir, "endpoints.json")
        if os.path.exists(endpoints):
            os.unlink(endpoints)
        with self._log("trainer") as log:
            self.trainer = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while not os.path.exists(endpoints):
            if self.trainer.poll() is not None:
                raise RLError(f"rl run: the trainer exited with {self.trainer.returncode} before it was ready "
                              f"(see {self.run_dir}/logs/trainer.log)")
            if time.monotonic() > deadline:
                raise RLError(f"rl run: the trainer was not ready within {self.start_timeout_s} s "
                              f"(see {self.run_dir}/logs/trainer.log)")
            time.sleep(0.05)
        with open(endpoints) as f:
            self.endpoints = json.load(f)

    def _start_worker(self, slot: WorkerSlot):
        r = self.config.rollout
        slot.notice = os.path.join(self.run_dir, f"notice-{slot.worker_id}")
        host, port = self.endpoints["publisher"]
        # The model, capacity, drain budget, exchange and (redis) leasing options come from the
        # config (roles/worker.py), as for a worker on another machine.
        cmd = [self.cli, "launch", "-n", str(r.ranks), "--ranks-per-node", str(r.ranks_per_node),
               "--grace-ms", str(int((r.drain_budget_s + 10) * 1000)), "--",
               self.python, "-m", "proxyep.rl", "worker", "--config", self.config_path,
               "--coordinator", self.endpoints["coordinator"], "--worker-id", slot.worker_id,
               "--notice-file", slot.notice, "--seed", str(self.config.seed * 1000 + slot.index),
               "--weights-from", f"{host}:{port}"]
        with self._log(f"worker-{slot.index}") as log:
            log.write(f"==== {slot.worker_id} ====\n".encode())
            log.flush()
            slot.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        slot.noticed_at, slot.restart_at = None, None
        self._event("worker_started", worker=slot.worker_id, pid=slot.proc.pid)

    def _preempt(self, slot: WorkerSlot, why):
        if slot.proc is None or slot.proc.poll() is not None or slot.noticed_at is not None:
            return
        with open(slot.notice, "w") as f:
            f.write(why)
        slot.noticed_at = time.monotonic()
        slot.preemptions += 1
        self._event("preempt", worker=slot.worker_id, why=why)

    def _kill(self, slot: WorkerSlot):
        if slot.proc is None or slot.proc.poll() is not None:
            return
        ranks = kill_launch(slot.proc)
        self._event("worker_killed", worker=slot.worker_id, pid=slot.proc.pid, ranks=ranks)

    def _stop_all(self, timeout_s):
        """Notices to every worker (they drain and exit 0); one still running after
        ``timeout_s`` is stopped through its launcher."""
        for slot in self.workers:
            self._preempt(slot, "run finished")
        deadline = time.monotonic() + timeout_s
        for slot in self.workers:
            if slot.proc is not None:
                stop_launch(slot.proc, max(0.1, deadline - time.monotonic()),
                            int((self.config.rollout.drain_budget_s + 10)))

    # ---- the loop ----

    def run(self):
        self.started = time.monotonic()
        # What an earlier run (before a --resume) left must not end this one: gone before the
        # trainer starts, since it writes trainer-done itself, and before the workers start, whose
        # notice files (the earlier run's stop of its workers) would stop them at once.
        names = ["trainer-done", "workers-stopped"]
        names += [n for n in os.listdir(self.run_dir) if n.startswith("notice-")]
        for name in names:
            if os.path.exists(os.path.join(self.run_dir, name)):
                os.unlink(os.path.join(self.run_dir, name))
        try:
            if self.config.coordinator == "redis":
                self._start_redis()
            self._start_trainer()
        except BaseException:
            if self.trainer is not None:
                stop_launch(self.trainer, 0, 3)
            self._stop_redis()
            raise
        for slot in self.workers:
            self._start_worker(slot)
        p = self.config.preempt
        schedule = sorted((float(e[0]), int(e[1]), e[2] if len(e) > 2 else "notice") for e in p.schedule)
        rate = self.config.preempt.rate / 60.0
        next_random = [self._next_arrival(rate) for _ in self.workers]
        code = None
        finishing = False
        try:
            while code is None:
                now = time.monotonic() - self.started
                at = now if p.schedule_unit == "seconds" else (self.records[-1]["iteration"] if self.records else 0)
                while schedule and schedule[0][0] <= at and not finishing:
                    _, w, kind = schedule.pop(0)
                    if kind == "kill":
                        self._kill(self.workers[w])
                    else:
                        self._preempt(self.workers[w], "scheduled")
                self._tend_redis()
                for i, slot in enumerate(self.workers):
                    if finishing:
                        break
                    if rate > 0 and now >= next_random[i]:
                        self._preempt(slot, f"random (rate {self.config.preempt.rate}/min)")
                        next_random[i] = now + self._next_arrival(rate)
                    self._tend(slot)
                self._print_progress()
                if not finishing and os.path.exists(os.path.join(self.run_dir, "trainer-done")):
                    # The last iteration is done: drain the pool while the coordinator is still up.
                    finishing = True
                    self._stop_all(self.config.rollout.drain_budget_s + 15)
                    open(os.path.join(self.run_dir, "workers-stopped"), "w").close()
                code = self.trainer.poll()
                time.sleep(0.05)
        finally:
            try:
                stop_launch(self.trainer, 0, 3)
                self._stop_all(self.config.rollout.drain_budget_s + 15)
            finally:
                self._stop_redis()
        self._print_progress()
        return code

    def _stop_redis(self):
        if self.redis is not None:
            self.redis.stop()
            self._event("redis_stopped", pid=self.redis.process.pid)

    def _next_arrival(self, rate):
        return self.rng.expovariate(rate) if rate > 0 else float("inf")

    def _tend(self, slot: WorkerSlot):
        if slot.proc is None:
            return
        rc = slot.proc.poll()
        if rc is None:
            return
        now = time.monotonic()
        if slot.restart_at is None:
            kind = "drained" if slot.noticed_at is not None and rc == 0 else "died"
            self._event(f"worker_{kind}", worker=slot.worker_id, code=rc,
                        drain_s=(now - slot.noticed_at) if slot.noticed_at is not None else None)
            slot.restart_at = now + self.config.preempt.restart_delay_s
            if os.path.exists(slot.notice):
                os.unlink(slot.notice)
        elif now >= slot.restart_at:
            slot.generation += 1
            slot.restarts += 1
            self._start_worker(slot)

    # ---- output ----

    def _print_progress(self):
        path = os.path.join(self.run_dir, "metrics.jsonl")
        if not os.path.exists(path):
            return
        with open(path) as f:
            lines = f.readlines()
        for line in lines[self.printed:]:
            if not line.endswith("\n"):
                break  # being written
            rec = json.loads(line)
            self.records.append(rec)
            self.printed += 1
            if not self.quiet:
                p = rec["pool"]
                self.out.write(
                    f"iter {rec['iteration']:4d}  reward {rec['reward_mean']:.3f}  exact {rec['exact_fraction']:.2f}  "
                    f"iter {rec['iteration_s']:.2f}s (rollout {rec['rollout_s']:.2f} train {rec['train_s']:.2f} "
                    f"sync {rec['sync_s']:.2f})  {rec['rollout_tokens_per_s']:.0f} tok/s  "
                    f"stale {rec['staleness']}  requeued {p['requeued']} interrupted {p['interrupted']} "
                    f"failed {rec['failed_groups']}\n")
                self.out.flush()


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="python3 -m proxyep.rl run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="{}", help="a JSON file or inline JSON (RunConfig); default: the reference run")
    p.add_argument("--run-dir", default=None, help="default: runs/rl-<time>")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--preempt", type=float, default=None, help="Spot notices per worker per minute")
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--cli", default=None, help="the proxyep CLI (default: PROXYEP_RL_CLI or the build tree's)")
    args = p.parse_args(argv)
    try:
        config = RunConfig.load(args.config)
        if args.preempt is not None:
            config.preempt.rate = args.preempt
        if args.iterations is not None:
            config.grpo.iterations = args.iterations
        config.validate()
    except RLError as e:
        print(f"rl run: {e}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or os.path.join("runs", time.strftime("rl-%Y%m%d-%H%M%S"))
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    sup = Supervisor(config, run_dir, cli=args.cli, resume=args.resume)
    print(f"rl run: {run_dir} (trainer {config.trainer.ranks} ranks, {config.rollout.workers} workers x "
          f"{config.rollout.ranks} ranks, staleness {config.grpo.staleness})", flush=True)
    try:
        code = sup.run()
    except RLError as e:
        print(f"rl run: {e}", file=sys.stderr)
        return 1
    if code != 0:
        print(f"rl run: the trainer exited with {code} (see {run_dir}/logs/trainer.log)", file=sys.stderr)
        return 1
    recs = sup.records
    if recs:
        k = max(1, len(recs) // 5)
        first = sum(r["reward_mean"] for r in recs[:k]) / k
        last = sum(r["reward_mean"] for r in recs[-k:]) / k
        print(f"rl run: {len(recs)} iterations; reward {first:.3f} (first {k}) -> {last:.3f} (last {k})")
    return 0
