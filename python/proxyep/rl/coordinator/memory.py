"""The embedded rollout coordinator: interface.py's semantics in plain Python structures under
one lock (thread-safe), the default store, and the reference the Redis store
(redis.py) is tested against. Both share this module's input checks, error texts and
snapshot format, so a snapshot of either restores into the other and a refused call reads the
same from both.

Queue: a heap keyed (-priority, admission seq, sample index) of the samples waiting. A requeued
remainder goes back under its group's key, so it is leased before anything admitted after its
group (docs/RL.md: discard-and-requeue to the back starves long rollouts). Entries of groups that
ended meanwhile are skipped when they surface (lazy deletion).

Choices the interface leaves open, kept identically by both stores:
- Lease ids are ``L<n>`` from one counter (kept in snapshots): an id at or below the counter was
  issued (``StaleLease`` when no longer held), any other is ``UnknownLease``.
- ``Lease.attempt`` and ``Sample.attempts`` are 1 + the sample's failed attempts so far (error
  releases and expiries); interrupted/draining releases do not count, so attempt <= max_attempts.
- A lease covers at most ``token_budget`` tokens: appending more under it is refused. A worker
  whose budget ran out before the sample finished hands the rest back with an ``interrupted``
  or ``draining`` release (requeued in place, no attempt used; counted as interrupted / drained).
- A remainder with nothing left to generate (max_new_tokens reached, or ending with the stop
  token) finishes when it would be requeued ("length" / "stop") instead of being leased again
  with a budget of 0.
- An ``aborted`` release of a lease still held drops its whole group (a group missing a sample is
  useless for GRPO); a stale lease's release is refused like its report (``StaleLease``).
- When a group fails or is aborted its other leases end (stale) without counting as expiries;
  expiries found at once are handled in (deadline, lease number) order.
- Output of failed, aborted and taken groups is dropped (their state stays known).
- Every call first requeues the leases past their deadline (``now > deadline``).
"""

import dataclasses
import heapq
import json
import math
import threading
import time

from .interface import Coordinator
from .protocol import (CompletedGroup, GroupSpec, GroupState, Lease, Progress, ReleaseReason, RLError, Sample,
                       SamplingParams, StaleLease, UnknownLease)

# The Redis store parks requeued stream entries under this consumer name; refused as a worker id
# by both stores so that they accept the same ids.
RESERVED_WORKER = "proxyep:requeued"
SNAPSHOT_FORMAT = "proxyep.rl.coordinator/1"
COUNTERS = ("submitted", "completed_groups", "failed_groups", "aborted_groups", "samples_completed",
            "leases_issued", "requeued", "interrupted", "drained", "expired", "errors", "tokens_reported")
FINISH_REASONS = ("stop", "length")


# ---- input checks and error texts shared by both stores -------------------------------------------

def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_options(lease_timeout_s, lease_tokens, max_attempts):
    if not _is_real(lease_timeout_s) or not (lease_timeout_s > 0 and math.isfinite(lease_timeout_s)):
        raise RLError(f"lease_timeout_s must be a positive number of seconds, got {lease_timeout_s!r}")
    if lease_tokens is not None and not (_is_int(lease_tokens) and lease_tokens > 0):
        raise RLError(f"lease_tokens must be None or a positive int, got {lease_tokens!r}")
    if not (_is_int(max_attempts) and max_attempts > 0):
        raise RLError(f"max_attempts must be a positive int, got {max_attempts!r}")


def check_worker(worker_id):
    if not isinstance(worker_id, str) or not worker_id:
        raise RLError(f"worker_id must be a non-empty string, got {worker_id!r}")
    if worker_id == RESERVED_WORKER:
        raise RLError(f"worker_id {RESERVED_WORKER!r} is reserved")


def check_capacity(capacity):
    if not (_is_int(capacity) and capacity > 0):
        raise RLError(f"capacity must be a positive int, got {capacity!r}")


def check_lease_id(lease_id):
    if not isinstance(lease_id, str) or not lease_id:
        raise RLError(f"lease_id must be a non-empty string, got {lease_id!r}")


def check_lease_ids(lease_ids):
    if not isinstance(lease_ids, (list, tuple)):
        raise RLError(f"lease_ids must be a list of lease ids, got {type(lease_ids).__name__}")
    for lease_id in lease_ids:
        check_lease_id(lease_id)
    return list(lease_ids)


def lease_number(lease_id):
    """n for an id of the form L<n> (n >= 1), else None."""
    if isinstance(lease_id, str) and lease_id[:1] == "L" and lease_id[1:].isdigit() and lease_id[1:2] != "0":
        return int(lease_id[1:])
    return None


def unknown_lease(lease_id):
    return UnknownLease(f"lease {lease_id!r} was never issued by this coordinator")


def stale_lease(lease_id):
    return StaleLease(f"lease {lease_id!r} is no longer held (expired, released, completed, or its group ended)")


def wrong_worker(lease_id, holder, worker_id):
    return StaleLease(f"lease {lease_id!r} is held by worker {holder!r}, not {worker_id!r}")


def too_many_tokens(lease_id, have, n, max_new_tokens):
    return RLError(f"lease {lease_id!r}: {n} more tokens after {have} exceed max_new_tokens {max_new_tokens}")


def over_budget(lease_id, used, n, budget):
    return RLError(f"lease {lease_id!r}: {n} more tokens after {used} exceed the lease's token_budget {budget}")


def routed_mismatch(lease_id):
    return RLError(f"lease {lease_id!r}: routed experts must be given for all of a sample's tokens or none")


def unknown_group(group_id):
    return RLError(f"unknown group {group_id!r}")


def duplicate_group(group_id):
    return RLError(f"group {group_id!r} was already submitted")


def check_progress(progress):
    """A validated copy (logprobs as floats), so later changes by the caller do not leak in."""
    if not isinstance(progress, Progress):
        raise RLError(f"progress must be a Progress, got {type(progress).__name__}")
    for name in ("tokens", "logprobs", "versions"):
        if not isinstance(getattr(progress, name), (list, tuple)):
            raise RLError(f"progress.{name} must be a list")
    progress.validate()
    if not all(_is_int(t) and t >= 0 for t in progress.tokens):
        raise RLError("progress.tokens must be non-negative ints")
    if not all(_is_real(x) and not math.isnan(x) for x in progress.logprobs):
        raise RLError("progress.logprobs must be numbers")
    if not all(_is_int(v) and v >= 0 for v in progress.versions):
        raise RLError("progress.versions must be non-negative ints")
    routed = progress.routed_experts
    if routed is not None:
        ok = isinstance(routed, (list, tuple)) and all(
            isinstance(layers, (list, tuple)) and all(
                isinstance(ks, (list, tuple)) and all(_is_int(e) and e >= 0 for e in ks) for ks in layers)
            for layers in routed)
        if not ok:
            raise RLError("progress.routed_experts must be [token][layer][k] non-negative ints")
        routed = [[list(ks) for ks in layers] for layers in routed] if progress.tokens else None
    return Progress(list(progress.tokens), [float(x) for x in progress.logprobs], list(progress.versions), routed)


def check_group(group):
    """A validated copy of a GroupSpec (through JSON, so that both stores hold the same values and
    a snapshot stays JSON-able)."""
    if not isinstance(group, GroupSpec):
        raise RLError(f"submit takes a GroupSpec, got {type(group).__name__}")
    if not isinstance(group.group_id, str) or not group.group_id:
        raise RLError("group_id must be a non-empty string")
    gid = group.group_id
    if not isinstance(group.prompt, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in group.prompt):
        raise RLError(f"group {gid}: prompt must be a non-empty list of token ids")
    if not _is_int(group.num_samples):
        raise RLError(f"group {gid}: num_samples must be an int")
    if not _is_int(group.priority):
        raise RLError(f"group {gid}: priority must be an int")
    if group.max_policy_lag is not None and not (_is_int(group.max_policy_lag) and group.max_policy_lag >= 0):
        raise RLError(f"group {gid}: max_policy_lag must be None or a non-negative int")
    if not (_is_int(group.min_version) and group.min_version >= 0):
        raise RLError(f"group {gid}: min_version must be a non-negative int")
    if not isinstance(group.metadata, dict):
        raise RLError(f"group {gid}: metadata must be a dict")
    s = group.sampling
    if not isinstance(s, SamplingParams):
        raise RLError(f"group {gid}: sampling must be a SamplingParams")
    if not _is_int(s.max_new_tokens) or not _is_real(s.temperature):
        raise RLError(f"group {gid}: max_new_tokens must be an int and temperature a number")
    if s.stop_token is not None and not (_is_int(s.stop_token) and s.stop_token >= 0):
        raise RLError(f"group {gid}: stop_token must be None or a token id")
    group.validate()
    try:
        return GroupSpec.from_dict(json.loads(json.dumps(group.to_dict(), allow_nan=False)))
    except (TypeError, ValueError) as e:
        raise RLError(f"group {gid}: not JSON-serialisable ({e})") from e


def check_reason(reason):
    try:
        return ReleaseReason(reason)
    except ValueError:
        raise RLError(f"release reason must be one of {[r.value for r in ReleaseReason]}, got {reason!r}") from None


def check_finish_reason(finish_reason):
    if finish_reason not in FINISH_REASONS:
        raise RLError(f"finish_reason must be one of {list(FINISH_REASONS)}, got {finish_reason!r}")


def check_version(version, current):
    if not (_is_int(version) and version >= 0):
        raise RLError(f"version must be a non-negative int, got {version!r}")
    if version < current:
        raise RLError(f"version {version} is lower than the current version {current}")


def check_max_groups(max_groups):
    if max_groups is not None and not (_is_int(max_groups) and max_groups > 0):
        raise RLError(f"max_groups must be None or a positive int, got {max_groups!r}")


def check_group_id(group_id, allow_none=False):
    if group_id is None and allow_none:
        return
    if not isinstance(group_id, str) or not group_id:
        raise RLError(f"group_id must be a non-empty string, got {group_id!r}")


def content_finish(tokens, sampling):
    """'length' / 'stop' when a sample's tokens leave nothing to generate, else None."""
    if len(tokens) >= sampling.max_new_tokens:
        return "length"
    if sampling.stop_token is not None and tokens and tokens[-1] == sampling.stop_token:
        return "stop"
    return None


def parse_snapshot(state):
    """Checks a snapshot dict completely (before any store replaces its state) and returns it as
    (version, next_seq, lease_counter, counters, groups), each group a dict with a GroupSpec,
    admitted_at, seq, GroupState, taken and samples [(Progress, failures, finish_reason, leased)]."""
    def need(cond, what):
        if not cond:
            raise RLError(f"restore: bad snapshot ({what})")

    need(isinstance(state, dict) and state.get("format") == SNAPSHOT_FORMAT, f"format is not {SNAPSHOT_FORMAT}")
    need(set(state) == {"format", "version", "next_seq", "lease_counter", "counters", "groups"}, "fields")
    version, next_seq, lease_counter = state["version"], state["next_seq"], state["lease_counter"]
    need(_is_int(version) and version >= 0, "version")
    need(_is_int(next_seq) and next_seq >= 1, "next_seq")
    need(_is_int(lease_counter) and lease_counter >= 0, "lease_counter")
    counters = state["counters"]
    need(isinstance(counters, dict) and set(counters) == set(COUNTERS)
         and all(_is_int(v) and v >= 0 for v in counters.values()), "counters")
    need(isinstance(state["groups"], list), "groups")
    groups, seen, last_seq = [], set(), 0
    for g in state["groups"]:
        need(isinstance(g, dict) and set(g) == {"spec", "admitted_at", "seq", "state", "taken", "samples"},
             "group fields")
        try:
            spec = check_group(GroupSpec.from_dict(g["spec"]))
        except (TypeError, AttributeError) as e:
            raise RLError(f"restore: bad snapshot (group spec: {e})") from e
        gid = spec.group_id
        need(gid not in seen, f"group {gid} twice")
        seen.add(gid)
        need(_is_int(g["seq"]) and last_seq < g["seq"] < next_seq, f"group {gid} seq")
        last_seq = g["seq"]
        need(_is_real(g["admitted_at"]) and math.isfinite(g["admitted_at"]), f"group {gid} admitted_at")
        try:
            gstate = GroupState(g["state"])
        except ValueError:
            raise RLError(f"restore: bad snapshot (group {gid} state {g['state']!r})") from None
        need(isinstance(g["taken"], bool) and (not g["taken"] or gstate is GroupState.complete), f"group {gid} taken")
        has_output = gstate is GroupState.pending or (gstate is GroupState.complete and not g["taken"])
        need(isinstance(g["samples"], list) and len(g["samples"]) == (spec.num_samples if has_output else 0),
             f"group {gid} samples")
        samples = []
        for s in g["samples"]:
            need(isinstance(s, dict) and set(s) == {"progress", "failures", "finish_reason", "leased"},
                 f"group {gid} sample fields")
            try:
                progress = check_progress(Progress.from_dict(s["progress"]))
            except (TypeError, AttributeError) as e:
                raise RLError(f"restore: bad snapshot (group {gid} progress: {e})") from e
            need(len(progress.tokens) <= spec.sampling.max_new_tokens, f"group {gid} progress length")
            need(_is_int(s["failures"]) and 0 <= s["failures"], f"group {gid} failures")
            finish = s["finish_reason"]
            need(finish is None or finish in FINISH_REASONS, f"group {gid} finish_reason")
            need(isinstance(s["leased"], bool) and not (s["leased"] and finish is not None), f"group {gid} leased")
            need(gstate is GroupState.pending or finish is not None, f"group {gid} complete with unfinished sample")
            samples.append((progress, s["failures"], finish, s["leased"]))
        need(gstate is not GroupState.pending or any(f is None for _, _, f, _ in samples),
             f"group {gid} pending with every sample finished")
        groups.append({"spec": spec, "admitted_at": float(g["admitted_at"]), "seq": g["seq"], "state": gstate,
                       "taken": g["taken"], "samples": samples})
    return version, next_seq, lease_counter, dict(counters), groups


# ---- the store ---------------------------------------------------------------------------------------

class _Sample:
    __slots__ = ("progress", "failures", "finish_reason", "lease", "queued")

    def __init__(self, progress=None, failures=0, finish_reason=None):
        self.progress = progress if progress is not None else Progress()
        self.failures, self.finish_reason, self.lease, self.queued = failures, finish_reason, None, False


class _Group:
    __slots__ = ("spec", "admitted_at", "seq", "state", "taken", "samples", "done")

    def __init__(self, spec, admitted_at, seq):
        self.spec, self.admitted_at, self.seq = spec, admitted_at, seq
        self.state, self.taken = GroupState.pending, False
        self.samples = [_Sample() for _ in range(spec.num_samples)]
        self.done = 0

    def key(self, index):
        return (-self.spec.priority, self.seq, index, self.spec.group_id)


class _Lease:
    __slots__ = ("lease_id", "number", "group", "index", "worker_id", "deadline", "attempt", "version_started",
                 "token_budget", "used")


class MemoryCoordinator(Coordinator):
    """``clock``: seconds since the epoch (injectable: tests drive expiry without sleeping)."""

    def __init__(self, lease_timeout_s=30.0, lease_tokens=None, max_attempts=3, clock=time.time):
        check_options(lease_timeout_s, lease_tokens, max_attempts)
        if not callable(clock):
            raise RLError("clock must be callable")
        self._timeout, self._lease_tokens, self._max_attempts = float(lease_timeout_s), lease_tokens, max_attempts
        self._clock = clock
        self._lock = threading.Lock()
        self._reset()

    def _reset(self):
        self._groups = {}  # group_id -> _Group
        self._queue = []  # heap of _Group.key(index): samples waiting
        self._completed = []  # heap of (seq, group_id): complete, not yet taken
        self._leases = {}  # lease_id -> _Lease (outstanding only)
        self._queued = 0
        self._version = 0
        self._next_seq = 1
        self._lease_counter = 0
        self._counters = dict.fromkeys(COUNTERS, 0)

    # -- transitions (lock held) --

    def _now(self):
        now = float(self._clock())
        self._expire(now)
        return now

    def _expire(self, now):
        expired = sorted((l for l in self._leases.values() if now > l.deadline), key=lambda l: (l.deadline, l.number))
        n = 0
        for lease in expired:
            if lease.lease_id in self._leases:  # not ended by an earlier one failing its group
                n += 1
                self._counters["expired"] += 1
                self._requeue(self._end(lease), lease.group, charged=True)
        return n

    def _end(self, lease):
        del self._leases[lease.lease_id]
        sample = lease.group.samples[lease.index]
        sample.lease = None
        return lease.index

    def _enqueue(self, group, index):
        heapq.heappush(self._queue, group.key(index))
        group.samples[index].queued = True
        self._queued += 1

    def _requeue(self, index, group, charged):
        sample = group.samples[index]
        finish = content_finish(sample.progress.tokens, group.spec.sampling)
        if finish is not None:
            self._finish(group, index, finish)
            return
        if charged:
            sample.failures += 1
            if sample.failures >= self._max_attempts:
                self._drop(group, GroupState.failed)
                return
        self._counters["requeued"] += 1
        self._enqueue(group, index)

    def _finish(self, group, index, finish_reason):
        group.samples[index].finish_reason = finish_reason
        self._counters["samples_completed"] += 1
        group.done += 1
        if group.done == group.spec.num_samples:
            group.state = GroupState.complete
            self._counters["completed_groups"] += 1
            heapq.heappush(self._completed, (group.seq, group.spec.group_id))

    def _drop(self, group, state):
        """Ends a pending group as failed or aborted: its leases go stale, its queue entries are
        skipped when they surface, its output is dropped."""
        group.state = state
        self._counters["failed_groups" if state is GroupState.failed else "aborted_groups"] += 1
        for sample in group.samples:
            if sample.lease is not None:
                del self._leases[sample.lease]
            if sample.queued:
                self._queued -= 1
        group.samples = []

    def _held(self, lease_id, worker_id):
        lease = self._leases.get(lease_id)
        if lease is None:
            n = lease_number(lease_id)
            if n is None or n > self._lease_counter:
                raise unknown_lease(lease_id)
            raise stale_lease(lease_id)
        if lease.worker_id != worker_id:
            raise wrong_worker(lease_id, lease.worker_id, worker_id)
        return lease

    def _check_append(self, lease, progress):
        sample = lease.group.samples[lease.index]
        n, have = len(progress.tokens), len(sample.progress.tokens)
        if have + n > lease.group.spec.sampling.max_new_tokens:
            raise too_many_tokens(lease.lease_id, have, n, lease.group.spec.sampling.max_new_tokens)
        if lease.used + n > lease.token_budget:
            raise over_budget(lease.lease_id, lease.used, n, lease.token_budget)
        if n and have and (progress.routed_experts is None) != (sample.progress.routed_experts is None):
            raise routed_mismatch(lease.lease_id)

    def _append(self, lease, progress):
        if not progress.tokens:
            return
        lease.group.samples[lease.index].progress.extend(progress)
        lease.used += len(progress.tokens)
        self._counters["tokens_reported"] += len(progress.tokens)

    # -- the interface --

    def submit(self, group):
        spec = check_group(group)
        with self._lock:
            now = self._now()
            if spec.group_id in self._groups:
                raise duplicate_group(spec.group_id)
            g = _Group(spec, now, self._next_seq)
            self._next_seq += 1
            self._groups[spec.group_id] = g
            for index in range(spec.num_samples):
                self._enqueue(g, index)
            self._counters["submitted"] += 1

    def lease(self, worker_id, capacity):
        check_worker(worker_id)
        check_capacity(capacity)
        with self._lock:
            now = self._now()
            leases, blocked = [], []
            while self._queue and len(leases) < capacity:
                key = heapq.heappop(self._queue)
                group, index = self._groups[key[3]], key[2]
                if group.state is not GroupState.pending:
                    continue  # dropped with its group
                spec = group.spec
                if spec.max_policy_lag is not None and self._version - spec.min_version > spec.max_policy_lag:
                    blocked.append(key)
                    continue
                leases.append(self._issue(group, index, worker_id, now))
            for key in blocked:
                heapq.heappush(self._queue, key)
            return leases

    def _issue(self, group, index, worker_id, now):
        sample, spec = group.samples[index], group.spec
        self._lease_counter += 1
        lease = _Lease()
        lease.lease_id, lease.number = f"L{self._lease_counter}", self._lease_counter
        lease.group, lease.index, lease.worker_id = group, index, worker_id
        lease.deadline = now + self._timeout
        lease.attempt, lease.version_started = sample.failures + 1, self._version
        remaining = spec.sampling.max_new_tokens - len(sample.progress.tokens)
        lease.token_budget = remaining if self._lease_tokens is None else min(self._lease_tokens, remaining)
        lease.used = 0
        self._leases[lease.lease_id] = lease
        sample.lease, sample.queued = lease.lease_id, False
        self._queued -= 1
        self._counters["leases_issued"] += 1
        prefix = Progress.from_dict(sample.progress.to_dict())
        return Lease(lease.lease_id, spec.group_id, index, worker_id, list(spec.prompt), prefix,
                     dataclasses.replace(spec.sampling),
                     lease.token_budget, lease.deadline, lease.attempt, lease.version_started)

    def heartbeat(self, worker_id, lease_ids):
        check_worker(worker_id)
        lease_ids = check_lease_ids(lease_ids)
        with self._lock:
            now = self._now()
            held = []
            for lease_id in lease_ids:
                lease = self._leases.get(lease_id)
                if lease is not None and lease.worker_id == worker_id:
                    lease.deadline = now + self._timeout
                    held.append(lease_id)
            return held

    def report_partial(self, lease_id, worker_id, progress):
        check_lease_id(lease_id)
        check_worker(worker_id)
        progress = check_progress(progress)
        with self._lock:
            now = self._now()
            lease = self._held(lease_id, worker_id)
            self._check_append(lease, progress)
            self._append(lease, progress)
            lease.deadline = now + self._timeout

    def complete(self, lease_id, worker_id, progress, finish_reason):
        check_lease_id(lease_id)
        check_worker(worker_id)
        progress = check_progress(progress)
        check_finish_reason(finish_reason)
        with self._lock:
            self._now()
            lease = self._held(lease_id, worker_id)
            self._check_append(lease, progress)
            self._append(lease, progress)
            self._finish(lease.group, self._end(lease), finish_reason)

    def release(self, lease_id, worker_id, reason, progress=None):
        check_lease_id(lease_id)
        check_worker(worker_id)
        reason = check_reason(reason)
        progress = check_progress(progress) if progress is not None else Progress()
        with self._lock:
            self._now()
            lease = self._held(lease_id, worker_id)
            if reason is ReleaseReason.aborted:
                self._drop(lease.group, GroupState.aborted)
                return
            self._check_append(lease, progress)
            self._append(lease, progress)
            counter = {ReleaseReason.interrupted: "interrupted", ReleaseReason.draining: "drained",
                       ReleaseReason.error: "errors"}[reason]
            self._counters[counter] += 1
            self._requeue(self._end(lease), lease.group, charged=reason is ReleaseReason.error)

    def abort(self, group_id=None):
        check_group_id(group_id, allow_none=True)
        with self._lock:
            self._now()
            if group_id is not None:
                group = self._groups.get(group_id)
                if group is None:
                    raise unknown_group(group_id)
                targets = [group] if group.state is GroupState.pending else []
            else:
                targets = sorted((g for g in self._groups.values() if g.state is GroupState.pending),
                                 key=lambda g: g.seq)
            for group in targets:
                self._drop(group, GroupState.aborted)
            return len(targets)

    def reap(self):
        with self._lock:
            return self._expire(float(self._clock()))

    def take_completed(self, max_groups=None):
        check_max_groups(max_groups)
        with self._lock:
            self._now()
            out = []
            while self._completed and (max_groups is None or len(out) < max_groups):
                _, group_id = heapq.heappop(self._completed)
                group = self._groups[group_id]
                samples = [Sample(group.spec.group_id, i, list(group.spec.prompt), s.progress, s.finish_reason,
                                  s.failures + 1) for i, s in enumerate(group.samples)]
                out.append(CompletedGroup(GroupSpec.from_dict(group.spec.to_dict()), samples, group.admitted_at))
                group.taken, group.samples = True, []
            return out

    def group_state(self, group_id):
        check_group_id(group_id)
        with self._lock:
            self._now()
            group = self._groups.get(group_id)
            if group is None:
                raise unknown_group(group_id)
            return group.state

    def set_version(self, version):
        with self._lock:
            self._now()
            check_version(version, self._version)
            self._version = version

    def version(self):
        with self._lock:
            self._now()
            return self._version

    def stats(self):
        with self._lock:
            self._now()
            return dict(self._counters, running=len(self._leases), queued=self._queued)

    def snapshot(self):
        with self._lock:
            self._now()
            groups = []
            for g in sorted(self._groups.values(), key=lambda g: g.seq):
                samples = [{"progress": s.progress.to_dict(), "failures": s.failures,
                            "finish_reason": s.finish_reason, "leased": s.lease is not None} for s in g.samples]
                groups.append({"spec": g.spec.to_dict(), "admitted_at": g.admitted_at, "seq": g.seq,
                               "state": g.state.value, "taken": g.taken, "samples": samples})
            return {"format": SNAPSHOT_FORMAT, "version": self._version, "next_seq": self._next_seq,
                    "lease_counter": self._lease_counter, "counters": dict(self._counters), "groups": groups}

    def restore(self, state):
        version, next_seq, lease_counter, counters, groups = parse_snapshot(state)
        with self._lock:
            # Lease ids already issued here stay stale: the counter never goes back.
            lease_counter = max(lease_counter, self._lease_counter)
            self._reset()
            self._version, self._next_seq, self._lease_counter = version, next_seq, lease_counter
            self._counters = counters
            requeue = []
            for g in groups:
                group = _Group(g["spec"], g["admitted_at"], g["seq"])
                group.state, group.taken = g["state"], g["taken"]
                group.samples = [_Sample(p, failures, finish) for p, failures, finish, _ in g["samples"]]
                self._groups[group.spec.group_id] = group
                if group.state is GroupState.complete and not group.taken:
                    heapq.heappush(self._completed, (group.seq, group.spec.group_id))
                if group.state is not GroupState.pending:
                    continue
                for index, (_, _, finish, leased) in enumerate(g["samples"]):
                    if finish is not None:
                        group.done += 1
                    elif leased:
                        requeue.append((group, index))
                    else:
                        self._enqueue(group, index)
            # Outstanding leases died with the old state: their remainders go back in line.
            for group, index in requeue:
                if group.state is GroupState.pending:
                    self._requeue(index, group, charged=False)
