"""RolloutWorker's loop in this process (a one-rank gloo group, the generator over the dense
reference, a MemoryCoordinator called directly), for what a launched worker cannot show
deterministically: the order of events around a lease that goes stale while it runs.

* test_heartbeat_drops_stale_lease: the generator is held before the sample's first step until
  the heartbeat thread has run; the heartbeat finds the lease's group aborted (the audit aborts it as the
  heartbeat arrives), so the worker drops the sample at the next turn: nothing more is sent for
  it (no report, no complete), it counts as stale, and the worker goes on to serve other work.
* test_stale_report_is_dropped: the same for a report refused with StaleLease (the group aborted
  right after the worker's first report was accepted).
* test_refused_lease_request_is_fatal: a coordinator that fails a call stops the loop with
  WorkerError naming it and the phase.
"""

import threading

import pytest
import torch
import torch.distributed as dist

from proxyep.rl.coordinator.memory import MemoryCoordinator
from proxyep.rl.coordinator.protocol import GroupSpec, GroupState, RLError, SamplingParams
from proxyep.rl.model_config import build_dense_reference
from proxyep.rl.rollout.generation import BatchGenerator
from proxyep.rl.rollout.loop import RolloutWorker, WorkerError
from proxyep.rl.rollout.spot import StopNotice
from rollout_harness import CONFIG, AuditedCoordinator, wait_for

torch.set_num_threads(1)
DEADLINE_S = 60


@pytest.fixture(scope="module", autouse=True)
def one_rank_group(tmp_path_factory):
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class HeldGenerator(BatchGenerator):
    """Steps normally until ``hold()``; then the next step waits for ``release()``."""

    def __init__(self, model):
        super().__init__(model)
        self._go = threading.Event()
        self._go.set()
        self.waiting = threading.Event()

    def hold(self):
        self._go.clear()

    def release(self):
        self._go.set()

    def step(self):
        if not self._go.is_set():
            self.waiting.set()
            assert self._go.wait(DEADLINE_S), "generator held past the deadline"
        return super().step()


class Running:
    """worker.run() in a thread; ``stop()`` sets the notice and returns its stats."""

    def __init__(self, worker, notice):
        self.worker, self.notice = worker, notice
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.worker.run()
        except Exception as e:  # noqa: BLE001 - handed to the test thread
            self.error = e

    def stop(self):
        self.notice.set("test")
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise self.error
        return self.result


def group(group_id, max_new_tokens=30):
    return GroupSpec(group_id, [1, 2, 3], 1, SamplingParams(max_new_tokens=max_new_tokens))


def sent_for(audit, group_id, kinds=("report", "complete", "release")):
    return [(kind, lid) for _, kind, _, lid, _ in audit.events
            if kind in kinds and audit.sample_of(lid)[0] == group_id]


def test_heartbeat_drops_stale_lease():
    audit = AuditedCoordinator(MemoryCoordinator(lease_timeout_s=60.0))
    audit.submit(group("doomed"))
    gen = HeldGenerator(build_dense_reference(CONFIG))
    beat = threading.Event()
    heartbeat = audit.heartbeat

    def aborting_heartbeat(worker_id, lease_ids):
        if lease_ids and not beat.is_set():
            audit.inner.abort("doomed")  # the group ends while the worker runs its sample
            beat.set()
        return heartbeat(worker_id, lease_ids)

    audit.heartbeat = aborting_heartbeat
    notice = StopNotice()
    gen.hold()
    worker = RolloutWorker(gen, "w", coordinator=audit, capacity=2, report_every=1000, notice=notice,
                           heartbeat_s=0.02)
    running = Running(worker, notice)
    assert gen.waiting.wait(DEADLINE_S)  # the sample was leased and prefilled; the next step waits
    assert beat.wait(DEADLINE_S)
    gen.release()
    wait_for(lambda: worker.stats.stale == 1, DEADLINE_S, "the stale lease dropped")
    assert audit.group_state("doomed") is GroupState.aborted
    audit.submit(group("next", max_new_tokens=5))
    wait_for(lambda: audit.group_state("next") is GroupState.complete, DEADLINE_S, "group 'next' complete")
    stats = running.stop()
    assert sent_for(audit, "doomed") == [] and "doomed" not in gen.keys()
    assert stats.stale == 1 and stats.completed == 1 and stats.released == 0


def test_stale_report_is_dropped():
    audit = AuditedCoordinator(MemoryCoordinator(lease_timeout_s=60.0))
    audit.submit(group("doomed"))
    report = audit.report_partial

    def aborting_report(lease_id, worker_id, progress):
        report(lease_id, worker_id, progress)
        audit.inner.abort("doomed")  # accepted, then the group ends

    audit.report_partial = aborting_report
    notice = StopNotice()
    worker = RolloutWorker(BatchGenerator(build_dense_reference(CONFIG)), "w", coordinator=audit, capacity=2,
                           report_every=2, notice=notice, heartbeat_s=60.0)
    running = Running(worker, notice)
    wait_for(lambda: worker.stats.stale == 1, DEADLINE_S, "the stale lease dropped")
    audit.submit(group("next", max_new_tokens=5))
    wait_for(lambda: audit.group_state("next") is GroupState.complete, DEADLINE_S, "group 'next' complete")
    stats = running.stop()
    # One report accepted (2 tokens); the second refused as stale; nothing after it.
    assert [kind for kind, _ in sent_for(audit, "doomed")] == ["report"]
    assert stats.stale == 1 and stats.completed == 1


def test_refused_lease_request_is_fatal():
    class Broken(MemoryCoordinator):
        def lease(self, worker_id, capacity):
            raise RLError("coordinator at 10.0.0.1:7000: lease: connection lost (EOFError())")

    notice = StopNotice()
    worker = RolloutWorker(BatchGenerator(build_dense_reference(CONFIG)), "w", coordinator=Broken(),
                           coordinator_name="tcp://10.0.0.1:7000", notice=notice)
    with pytest.raises(WorkerError, match=r"coordinator tcp://10.0.0.1:7000 failed during lease"):
        worker.run()
