"""What the rollout worker tests share: the coordinator side in the test process (a
MemoryCoordinator behind an audit that the test can also hold back, served by a real
CoordinatorServer on loopback), workers as real ``proxyep launch`` jobs of
``python3 -m proxyep.rl.rollout.worker`` (subprocesses, stopped by pid), and the checks of a
finished sample against the dense reference model.

The audit (:class:`AuditedCoordinator`) records every call the store *accepted*, in order, with
its time: the leases issued (with their prefix), and the tokens each report/complete/release
carried. From it a test checks that every sample's output is exactly the concatenation of what
was accepted for it (nothing lost, nothing twice) and measures requeue latencies. Two gates make
the interruption tests deterministic instead of racing the worker: ``hold_leases(worker)`` makes
lease() give that worker nothing (it is up and asking, but idle), and ``block_complete(worker)``
holds that worker's complete() calls (so its other samples are still mid-generation when it is
told to stop or killed).
"""

import os
import signal
import subprocess
import sys
import threading
import time

import torch

from proxyep.rl.coordinator.interface import Coordinator
from proxyep.rl.coordinator.memory import MemoryCoordinator
from proxyep.rl.coordinator.service import CoordinatorServer
from proxyep.rl.model_config import ModelConfig, build_dense_reference

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
CLI = os.environ.get("PROXYEP_RL_CLI", os.path.join(REPO, "build", "release", "tools", "proxyep"))
CONFIG = ModelConfig(vocab=64, hidden=128, layers=2, heads=4, num_experts=4, topk=2, ffn_hidden=32, max_seq=40, seed=5)
GATE_S = 120  # the most any gate holds a call (a test that forgets to open one fails, not hangs)


def wait_for(predicate, timeout_s, what):
    """Polls ``predicate`` until true; AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


class AuditedCoordinator(Coordinator):
    def __init__(self, inner):
        self.inner = inner
        self.events = []  # (time, kind, worker, lease_id, detail) of accepted calls
        self.lease_info = {}  # lease_id -> Lease
        self._lock = threading.Lock()
        self._held_leases = {}  # worker -> Event set when it asked
        self._blocked = {}  # worker -> (gate Event, blocked Event)

    # -- gates --

    def hold_leases(self, worker):
        self._held_leases[worker] = threading.Event()

    def asked(self, worker):
        return self._held_leases[worker].is_set()

    def release_leases(self, worker):
        self._held_leases.pop(worker, None)

    def block_complete(self, worker):
        self._blocked[worker] = (threading.Event(), threading.Event())

    def complete_blocked(self, worker):
        return self._blocked[worker][1].is_set()

    def unblock_complete(self, worker):
        gate = self._blocked.pop(worker, None)
        if gate is not None:
            gate[0].set()

    # -- the audit --

    def _record(self, kind, worker, lease_id, detail=None):
        with self._lock:
            self.events.append((time.monotonic(), kind, worker, lease_id, detail))

    def sample_of(self, lease_id):
        lease = self.lease_info[lease_id]
        return lease.group_id, lease.sample_index

    def accepted_pieces(self, group_id, index):
        """The progress the store accepted for a sample, in order: [(kind, worker, Progress)]."""
        out = []
        for _, kind, worker, lease_id, detail in list(self.events):
            if kind in ("report", "complete", "release") and detail is not None \
                    and self.sample_of(lease_id) == (group_id, index):
                out.append((kind, worker, detail))
        return out

    def leases_of(self, group_id, index):
        return [self.lease_info[lid] for _, kind, _, lid, _ in list(self.events)
                if kind == "lease" and self.sample_of(lid) == (group_id, index)]

    def time_of(self, kind, lease_id):
        return next(t for t, k, _, lid, _ in list(self.events) if k == kind and lid == lease_id)

    # -- the interface --

    def submit(self, group):
        return self.inner.submit(group)

    def lease(self, worker_id, capacity):
        held = self._held_leases.get(worker_id)
        if held is not None:
            held.set()
            return []
        leases = self.inner.lease(worker_id, capacity)
        for lease in leases:
            self.lease_info[lease.lease_id] = lease
            self._record("lease", worker_id, lease.lease_id, lease.prefix)
        return leases

    def heartbeat(self, worker_id, lease_ids):
        return self.inner.heartbeat(worker_id, lease_ids)

    def report_partial(self, lease_id, worker_id, progress):
        self.inner.report_partial(lease_id, worker_id, progress)
        self._record("report", worker_id, lease_id, progress)

    def complete(self, lease_id, worker_id, progress, finish_reason):
        gate = self._blocked.get(worker_id)
        if gate is not None:
            gate[1].set()
            if not gate[0].wait(GATE_S):
                raise RuntimeError(f"test gate on {worker_id}'s complete never opened")
        self.inner.complete(lease_id, worker_id, progress, finish_reason)
        self._record("complete", worker_id, lease_id, progress)

    def release(self, lease_id, worker_id, reason, progress=None):
        self.inner.release(lease_id, worker_id, reason, progress)
        self._record("release", worker_id, lease_id, progress)
        self._record(f"release:{getattr(reason, 'value', reason)}", worker_id, lease_id)

    def abort(self, group_id=None):
        return self.inner.abort(group_id)

    def reap(self):
        return self.inner.reap()

    def take_completed(self, max_groups=None):
        return self.inner.take_completed(max_groups)

    def group_state(self, group_id):
        return self.inner.group_state(group_id)

    def set_version(self, version):
        return self.inner.set_version(version)

    def version(self):
        return self.inner.version()

    def stats(self):
        return self.inner.stats()

    def snapshot(self):
        return self.inner.snapshot()

    def restore(self, state):
        return self.inner.restore(state)


class CoordinatorSide:
    """An audited MemoryCoordinator served on loopback; ``url``/``env`` for the workers."""

    def __init__(self, **options):
        self.coordinator = AuditedCoordinator(MemoryCoordinator(**options))
        self.server = CoordinatorServer(self.coordinator, "127.0.0.1", 0)
        host, port = self.server.address
        self.url = f"tcp://{host}:{port}"
        self.env = {"PROXYEP_RL_AUTHKEY": self.server.authkey.hex()}

    def close(self):
        self.server.close()


class WorkerJob:
    """``proxyep launch -n ranks`` of the worker entry point (TCP fabric with the reorder shim),
    its output in ``log_path``."""

    def __init__(self, side_env, url, worker_id, log_path, ranks=2, ranks_per_node=1, extra=(), config=CONFIG):
        self.worker_id, self.log_path = worker_id, log_path
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PROXYEP_FABRIC_PROVIDER="tcp", PROXYEP_FABRIC_REORDER="1",
                   PROXYEP_EP_TIMEOUT_MS="20000", **side_env)
        cmd = [CLI, "launch", "-n", str(ranks), "--ranks-per-node", str(ranks_per_node), "--grace-ms", "60000",
               "--", sys.executable, "-m", "proxyep.rl.rollout.worker", "--coordinator", url,
               "--model-config", config.to_json(), "--worker-id", worker_id, *extra]
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        self.ranks = ranks

    def rank_pids(self):
        """{rank: pid} of the launcher's children (each rank is a direct child)."""
        pid = self.process.pid
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
        out = {}
        for child in children:
            try:
                with open(f"/proc/{child}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            out[int(env[b"RANK"])] = child
        return out

    def signal_rank(self, rank, sig):
        pids = self.rank_pids()
        assert rank in pids, f"rank {rank} of {self.worker_id} not running ({pids})"
        os.kill(pids[rank], sig)

    def kill(self):
        """SIGKILL to every rank and the launcher (the node is gone)."""
        pids = self.rank_pids() if self.process.poll() is None else {}
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)

    def wait(self, timeout_s):
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.worker_id} still running after {timeout_s} s:\n{self.output()}")

    def output(self):
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        """Teardown: whatever is left is killed by pid."""
        if self.process.poll() is None:
            self.kill()
        self._log.close()


class Reference:
    """The dense reference with the workers' weights: recomputes behaviour log-probs."""

    def __init__(self, config=CONFIG, state=None):
        torch.set_num_threads(1)
        self.model = build_dense_reference(config)
        if state is not None:
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, value in state.items():
                    params[name].copy_(value)

    @torch.no_grad()
    def logprobs(self, context, tokens, temperature):
        """log_softmax(logits / T) at each token given everything before it, with the
        low-latency exchange's roundings reproduced (reference_model.ll_rounded_moe)."""
        seq = torch.tensor([list(context) + list(tokens)])
        logits, _ = self.model(seq[:, :-1], low_latency=True)
        logp = torch.log_softmax(logits[0, len(context) - 1:] / temperature, dim=-1)
        return logp[torch.arange(len(tokens)), torch.tensor(tokens)]


def check_concatenation(audit, group_id, sample):
    """The sample's output is exactly the pieces the store accepted for it, in order."""
    tokens, logprobs, versions = [], [], []
    for _, _, progress in audit.accepted_pieces(group_id, sample.sample_index):
        tokens += progress.tokens
        logprobs += progress.logprobs
        versions += progress.versions
    out = sample.output
    assert (out.tokens, out.logprobs, out.versions) == (tokens, logprobs, versions), \
        f"{group_id}/{sample.sample_index}: output is not the concatenation of the accepted pieces"
