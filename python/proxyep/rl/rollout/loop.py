"""A rollout worker (docs/RL.md section 3): one EP group (the ranks of one ``proxyep launch``
job, its own gloo process group, never the trainer's) serving the tiny MoE policy with
low-latency EP, leasing samples from a coordinator.

Roles. Rank 0 alone talks to the coordinator: it leases (up to ``capacity`` samples held by the
whole worker), spreads the new leases over the ranks (fewest held first), reports and completes,
and a background thread heartbeats the held leases at a third of the lease timeout. Every rank
generates the sequences it was given (generation.BatchGenerator) and all ranks step together:
the MoE exchange is collective, so a rank with nothing to run still steps with zero rows.

One loop turn, on every rank: rank 0 broadcasts a *control* message (new leases per rank,
leases to drop, stop, fatal error, a weights version to apply, whether to step); every rank
applies it and, when told, steps its generator once; every rank gathers its *messages* to rank
0 (tokens to report every ``report_every`` tokens, finished samples, refused leases, a stop
notice it received, a local error, weights it has staged); rank 0 sends them on to the
coordinator. A sample's tokens reach the coordinator once each: they leave the rank's
unreported buffer only when sent.

Stale leases: ones the heartbeat no longer returns, or a report refused with StaleLease, are
dropped at the next turn (their unreported tokens are discarded: the coordinator would not take
them, and the sample was requeued with what it had).

Stopping (spot.StopNotice: SIGTERM to any rank, a notice file, an HTTP notice): no more leases;
every rank hands over its unreported tokens and rank 0 releases each held lease as
``interrupted`` with them, all within ``drain_budget_s`` of the notice; ``run`` then returns.

Failure: every call has a deadline (the coordinator client's timeout, the process group's
timeout). A coordinator that fails to answer, or any rank's error, ends ``run`` on every rank
with WorkerError naming the phase and the peer (the coordinator's address, the rank). A main
loop that stalls (e.g. in a collective with a dead rank) stops heartbeating, so its leases
expire and are requeued by the coordinator rather than held forever.
"""

import dataclasses
import logging
import threading
import time

import torch.distributed as dist

from ..coordinator.protocol import Progress, ReleaseReason, RLError, StaleLease, UnknownLease
from .generation import BatchGenerator, GenRequest, sample_seed

log = logging.getLogger("proxyep.rl.worker")


class WorkerError(RuntimeError):
    """The worker stopped on an error (the message names the phase and the peer)."""


@dataclasses.dataclass
class WorkerStats:
    leases: int = 0  # leases received
    completed: int = 0  # samples completed
    stretches: int = 0  # leases whose token budget ran out before the sample ended (given back)
    partial_reports: int = 0
    tokens: int = 0  # tokens sent to the coordinator while serving (drain flushes not included)
    steps: int = 0
    stale: int = 0  # leases dropped as stale
    rejected: int = 0  # leases this worker could not run (released as errors)
    released: int = 0  # leases released when stopping
    stop_reason: str = ""
    drain_s: float = 0.0  # from the notice to the last release


class _Local:
    """A lease being generated on this rank: the tokens not yet sent to the coordinator.
    Routed experts go with them unless the sample's earlier tokens came without (the store
    keeps them for all of a sample's tokens or none)."""

    def __init__(self, lease):
        self.lease = lease
        self.routed = lease.prefix.routed_experts is not None or not lease.prefix.tokens
        self.unreported = self._empty()

    def _empty(self):
        return Progress(routed_experts=[] if self.routed else None)

    def add(self, ev):
        p = self.unreported
        p.tokens.append(ev.token)
        p.logprobs.append(ev.logprob)
        p.versions.append(ev.version)
        if self.routed:
            p.routed_experts.append(ev.routed_experts)

    def take(self):
        """The unreported tokens as a dict (None when there are none); the buffer restarts."""
        p, self.unreported = self.unreported, self._empty()
        return p.to_dict() if p.tokens else None


HOLD_S = 5.0  # the longest a lease waits for the weights of the version it was issued at


class RolloutWorker:
    """One rank's side of a worker (construct and ``run`` on every rank of the group).

    ``generator``: this rank's BatchGenerator over the EP model. ``coordinator``: the Coordinator
    (rank 0 only; None on the others); ``coordinator_name``: how errors name it (its address).
    ``capacity``: samples held by the whole worker. ``report_every``: tokens per report_partial.
    ``notice``: a spot.StopNotice. ``heartbeat_s``: None = a third of the lease timeout (from
    the first lease's deadline). ``lease_poll_s``: how often rank 0 asks for work when it has
    room. ``weight_source``: an object whose ``poll()`` returns None or (version, this rank's
    state) of new weights; they are applied on all ranks at the same turn, once every rank has
    staged that version. ``group``: the worker's process group (None: the default group)."""

    def __init__(self, generator: BatchGenerator, worker_id, coordinator=None, coordinator_name="coordinator",
                 capacity=4, report_every=4, notice=None, drain_budget_s=30.0, heartbeat_s=None, lease_poll_s=0.05,
                 seed=0, weight_source=None, group=None):
        if capacity < 1 or report_every < 1:
            raise ValueError(f"capacity {capacity} and report_every {report_every} must be positive")
        if drain_budget_s <= 0:
            raise ValueError(f"drain_budget_s must be positive, got {drain_budget_s}")
        self.generator, self.worker_id = generator, worker_id
        self.coordinator, self.coordinator_name = coordinator, coordinator_name
        self.capacity, self.report_every = capacity, report_every
        self.notice, self.drain_budget_s = notice, drain_budget_s
        self.heartbeat_s, self.lease_poll_s, self.seed = heartbeat_s, lease_poll_s, seed
        self.weight_source, self.group = weight_source, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if self.rank == 0 and coordinator is None:
            raise ValueError("rank 0 needs the coordinator")
        self.src = 0 if group is None else dist.distributed_c10d._get_global_rank(group, 0)
        self.stats = WorkerStats()
        self._local = {}  # lease_id -> _Local (this rank)
        self._staged = None  # (version, state) waiting to be applied
        self._staged_sent = None
        # Rank 0 only.
        self._owner = {}  # lease_id -> rank (None: held back, see _control)
        self._held = {}  # lease_id -> (Lease, monotonic time it arrived): waiting for its version's weights
        self._serving = generator.version  # the version every rank serves (rank 0's view)
        self._leases = {}  # lease_id -> Lease
        self._drop = set()  # stale lease ids to drop at the next turn
        self._rank_stop = None  # a stop notice a rank reported
        self._staged_by_rank = {}
        self._fatal = None  # (message, release_leases)
        self._lock = threading.Lock()
        self._lease_timeout = None
        self._next_lease_at = 0.0
        self._alive_at = time.monotonic()
        self._hb_stop = threading.Event()
        self._hb_thread = None

    # ---- the loop (every rank) ----

    def run(self):
        """Serves leases until told to stop (returns WorkerStats after draining) or an error
        (raises WorkerError on every rank)."""
        if self.rank == 0:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
            self._hb_thread.start()
        try:
            while True:
                control = self._broadcast(self._control() if self.rank == 0 else None, "control")
                if control["fatal"]:
                    self._fail(control)
                if control["stop"]:
                    return self._drain(control["stop"])
                messages = self._apply(control)
                if control["run"]:
                    messages += self._step()
                messages += self._notices()
                gathered = self._gather(messages, "messages")
                if self.rank == 0:
                    self._alive_at = time.monotonic()
                    self._handle(gathered)
        finally:
            self._hb_stop.set()
            if self._hb_thread is not None:
                self._hb_thread.join()

    def _broadcast(self, obj, phase):
        box = [obj]
        try:
            dist.broadcast_object_list(box, src=self.src, group=self.group)
        except RuntimeError as e:
            raise WorkerError(f"worker {self.worker_id} rank {self.rank}: {phase} broadcast from rank 0 failed "
                              f"(a rank died or hung?): {e}") from e
        return box[0]

    def _gather(self, obj, phase):
        out = [None] * self.world if self.rank == 0 else None
        try:
            dist.gather_object(obj, out, dst=self.src, group=self.group)
        except RuntimeError as e:
            raise WorkerError(f"worker {self.worker_id} rank {self.rank}: {phase} gather to rank 0 failed "
                              f"(a rank died or hung?): {e}") from e
        return out

    def _apply(self, control):
        """Drops, new leases and a weights version from the control message; returns messages
        for leases this rank cannot run."""
        messages = []
        for lease_id in control["drop"]:
            if self._local.pop(lease_id, None) is not None:
                self.generator.drop(lease_id)
        if control["apply"] is not None:
            version, state = self._staged
            assert version == control["apply"], (version, control["apply"])
            self.generator.apply_weights(version, state)
            self._staged = None
            log.info("worker %s rank %d: weights version %d applied", self.worker_id, self.rank, version)
        for lease in control["assign"].get(self.rank, []):
            prefix = lease.prefix.tokens
            req = GenRequest(key=lease.lease_id, context=list(lease.prompt) + list(prefix),
                             budget=lease.token_budget, remaining=lease.sampling.max_new_tokens - len(prefix),
                             temperature=lease.sampling.temperature, stop_token=lease.sampling.stop_token,
                             seed=sample_seed(self.seed, lease.group_id, lease.sample_index, len(prefix)))
            try:
                self.generator.add(req)
            except RLError as e:
                messages.append(("reject", lease.lease_id, str(e)))
                continue
            self._local[lease.lease_id] = _Local(lease)
        return messages

    def _step(self):
        try:
            events = self.generator.step()
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, then all stop
            log.exception("worker %s rank %d: generation step failed", self.worker_id, self.rank)
            return [("error", f"rank {self.rank}: generation step failed: {e!r}")]
        messages = []
        for ev in events:
            held = self._local[ev.key]
            held.add(ev)
            if ev.finished is not None:
                del self._local[ev.key]
                messages.append(("finish", ev.key, held.take(), ev.finished))
            elif len(held.unreported.tokens) >= self.report_every:
                messages.append(("partial", ev.key, held.take()))
        return messages

    def _notices(self):
        messages = []
        if self.notice is not None and self.notice.is_set():
            messages.append(("stop", f"rank {self.rank}: {self.notice.reason}"))
        if self.weight_source is not None:
            try:
                update = self.weight_source.poll()
                if update is not None:
                    self.generator.check_weights(*update)
                    self._staged = update
            except Exception as e:  # noqa: BLE001 - whatever the source raises, the update is refused
                # Refused before anything changed: this rank does not stage it, so no rank
                # applies it, and the worker keeps serving the version it has.
                log.error("worker %s rank %d: weights update refused: %s", self.worker_id, self.rank, e)
            if self._staged is not None and self._staged[0] != self._staged_sent:
                self._staged_sent = self._staged[0]
                messages.append(("staged", self._staged[0]))
        return messages

    # ---- rank 0: deciding the turn ----

    def _control(self):
        control = {"fatal": None, "release": False, "stop": None, "drop": [], "assign": {}, "apply": None,
                   "run": False}
        with self._lock:
            fatal = self._fatal
            # Only leases still held: one the heartbeat missed because it just ended is no news.
            drop = sorted(lease_id for lease_id in self._drop if lease_id in self._owner)
            self._drop.clear()
        for lease_id in drop:
            self._forget(lease_id)
            self.stats.stale += 1
        control["drop"] = drop
        if fatal is not None:
            control["fatal"], control["release"] = fatal
            return control
        if self.notice is not None and self.notice.is_set():
            control["stop"] = f"rank 0: {self.notice.reason}"
        elif self._rank_stop is not None:
            control["stop"] = self._rank_stop
        if control["stop"]:
            return control
        staged = set(self._staged_by_rank.values())
        if len(self._staged_by_rank) == self.world and len(staged) == 1:
            control["apply"] = staged.pop()
            self._serving = control["apply"]
            self._staged_by_rank.clear()
        load = {r: 0 for r in range(self.world)}
        for r in self._owner.values():
            if r is not None:
                load[r] += 1

        def assign(lease):
            r = min(load, key=lambda k: (load[k], k))
            load[r] += 1
            with self._lock:
                self._owner[lease.lease_id] = r
                self._leases[lease.lease_id] = lease
            control["assign"].setdefault(r, []).append(lease)

        # A lease issued at a version this worker does not serve yet waits (its heartbeats go on)
        # until that version is applied, so its tokens are not older than the version it was
        # issued at (the staleness bound counts on it); after HOLD_S it runs anyway, its tokens
        # tagged with the older version they really come from.
        now = time.monotonic()
        for lease_id, (lease, since) in list(self._held.items()):
            if lease_id not in self._owner:
                del self._held[lease_id]  # dropped meanwhile
            elif lease.version_started <= self._serving or now - since > HOLD_S:
                del self._held[lease_id]
                assign(lease)
        free = self.capacity - len(self._owner)
        now = time.monotonic()
        if free > 0 and now >= self._next_lease_at:
            self._next_lease_at = now + self.lease_poll_s
            try:
                leases = self._call("lease", self.coordinator.lease, self.worker_id, free)
            except (WorkerError, RLError) as e:
                control["fatal"] = str(e)
                return control
            for lease in leases:
                if lease.version_started > self._serving:
                    with self._lock:
                        self._owner[lease.lease_id] = None
                        self._leases[lease.lease_id] = lease
                    self._held[lease.lease_id] = (lease, now)
                else:
                    assign(lease)
                if self._lease_timeout is None:
                    self._lease_timeout = max(lease.deadline - time.time(), 0.1)
            self.stats.leases += len(leases)
        control["run"] = any(r is not None for r in self._owner.values())
        if not control["run"]:
            # Idle: wait for the next look at the queue (a stop notice ends the wait at once).
            if self.notice is not None:
                self.notice.wait(self.lease_poll_s)
            else:
                time.sleep(self.lease_poll_s)
        return control

    def _forget(self, lease_id):
        with self._lock:
            self._owner.pop(lease_id, None)
            self._leases.pop(lease_id, None)

    def _call(self, phase, fn, *args):
        """A coordinator call. StaleLease/UnknownLease (the lease is not ours any more) pass
        through; anything else means the coordinator is gone, or it and this worker disagree
        (the RPC client reports a lost connection as a plain RLError too): WorkerError naming
        the coordinator and the phase."""
        try:
            return fn(*args)
        except (StaleLease, UnknownLease):
            raise
        except Exception as e:  # noqa: BLE001 - transport errors differ per client; all are fatal
            raise WorkerError(f"worker {self.worker_id}: coordinator {self.coordinator_name} failed during "
                              f"{phase}: {type(e).__name__}: {e}") from e

    # ---- rank 0: sending results on ----

    def _handle(self, gathered):
        for rank, messages in enumerate(gathered):
            for msg in messages:
                try:
                    self._handle_one(rank, msg)
                except WorkerError as e:
                    with self._lock:
                        if self._fatal is None:
                            self._fatal = (str(e), False)
                    return

    def _handle_one(self, rank, msg):
        kind = msg[0]
        if kind == "stop":
            if self._rank_stop is None:
                self._rank_stop = msg[1]
            return
        if kind == "error":
            with self._lock:
                if self._fatal is None:
                    self._fatal = (f"worker {self.worker_id}: {msg[1]}", True)
            return
        if kind == "staged":
            self._staged_by_rank[rank] = msg[1]
            return
        lease_id = msg[1]
        if lease_id not in self._owner:
            return  # dropped as stale meanwhile: the coordinator would refuse it
        try:
            if kind == "reject":
                log.error("worker %s: lease %s cannot run here: %s", self.worker_id, lease_id, msg[2])
                self.stats.rejected += 1
                self._forget(lease_id)
                self._call("release", self.coordinator.release, lease_id, self.worker_id, ReleaseReason.error, None)
                return
            progress = Progress.from_dict(msg[2])
            self.stats.tokens += len(progress.tokens)
            if kind == "partial":
                self._call("report_partial", self.coordinator.report_partial, lease_id, self.worker_id, progress)
                self.stats.partial_reports += 1
            elif kind == "finish" and msg[3] == "budget":
                # The lease's stretch is done, the sample is not: hand the tokens and the rest
                # back (requeued in place with everything as its prefix; no attempt used).
                self._forget(lease_id)
                self._call("release", self.coordinator.release, lease_id, self.worker_id,
                           ReleaseReason.interrupted, progress)
                self.stats.stretches += 1
            elif kind == "finish":
                self._forget(lease_id)
                self._call("complete", self.coordinator.complete, lease_id, self.worker_id, progress, msg[3])
                self.stats.completed += 1
        except (StaleLease, UnknownLease) as e:
            log.warning("worker %s: lease %s is stale (%s): dropped", self.worker_id, lease_id, e)
            if lease_id in self._owner:
                # Still running on its rank: dropped there at the next turn.
                with self._lock:
                    self._drop.add(lease_id)

    # ---- rank 0: heartbeats ----

    def _heartbeat_interval(self):
        if self.heartbeat_s is not None:
            return self.heartbeat_s
        return self._lease_timeout / 3 if self._lease_timeout else 0.5

    def _heartbeat_loop(self):
        while not self._hb_stop.wait(self._heartbeat_interval()):
            with self._lock:
                held = list(self._leases)
            if not held:
                continue
            # A loop that has not turned for a whole lease timeout is stuck (a dead rank in a
            # collective): stop renewing, so the coordinator requeues the work.
            stall = self._lease_timeout or 3 * self._heartbeat_interval()
            if time.monotonic() - self._alive_at > stall:
                continue
            try:
                alive = set(self._call("heartbeat", self.coordinator.heartbeat, self.worker_id, held))
            except (WorkerError, RLError) as e:
                with self._lock:
                    if self._fatal is None:
                        self._fatal = (str(e), False)
                return
            stale = [lease_id for lease_id in held if lease_id not in alive]
            if stale:
                with self._lock:
                    self._drop.update(stale)

    # ---- stopping ----

    def _drain(self, reason):
        """Every rank hands over its unreported tokens; rank 0 releases every held lease as
        interrupted with them, within the budget."""
        flush = []
        for lease_id, held in self._local.items():
            self.generator.drop(lease_id)
            flush.append((lease_id, held.take()))
        self._local.clear()
        gathered = self._gather(flush, "drain")
        result = None
        if self.rank == 0:
            result = self._release_all(reason, [item for part in gathered for item in part])
        result = self._broadcast(result, "drain result")
        self.stats.stop_reason, self.stats.drain_s, self.stats.released = reason, result["drain_s"], result["released"]
        if result["error"]:
            raise WorkerError(result["error"])
        return self.stats

    def _release_all(self, reason, flush):
        self._hb_stop.set()  # no more renewals: what is not released in time expires
        started = self.notice.noticed_at if self.notice is not None and self.notice.noticed_at else time.monotonic()
        deadline = started + self.drain_budget_s
        pending = dict(flush)
        released, error = 0, None
        for lease_id in list(self._owner):
            if time.monotonic() >= deadline:
                error = (f"worker {self.worker_id}: drain budget {self.drain_budget_s} s spent with "
                         f"{len(self._owner)} leases not released (they will expire at the coordinator "
                         f"{self.coordinator_name})")
                break
            progress = Progress.from_dict(pending[lease_id]) if pending.get(lease_id) else None
            try:
                self._call("release", self.coordinator.release, lease_id, self.worker_id, ReleaseReason.interrupted,
                           progress)
                released += 1
            except (StaleLease, UnknownLease):
                pass  # already requeued by the coordinator with what it had
            except (WorkerError, RLError) as e:
                error = f"{e} (while draining: {len(self._owner)} leases left to expire)"
                break
            self._forget(lease_id)
        drain_s = time.monotonic() - started
        log.info("worker %s: stopped (%s): %d leases released as interrupted in %.3f s", self.worker_id, reason,
                 released, drain_s)
        return {"released": released, "drain_s": drain_s, "error": error}

    def _fail(self, control):
        """A fatal error: everyone stops; rank 0 gives the held leases back as errors when the
        coordinator is still there (``release``), else they expire there."""
        self._local.clear()
        if self.rank == 0 and control["release"]:
            for lease_id in list(self._owner):
                try:
                    self._call("release", self.coordinator.release, lease_id, self.worker_id, ReleaseReason.error,
                               None)
                except (RLError, WorkerError):
                    break
                self._forget(lease_id)
        raise WorkerError(control["fatal"])
