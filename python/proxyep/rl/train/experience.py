"""The experience buffer between the rollout pool and the trainer (docs/RL.md section 4): scored
groups wait here until the trainer pops a batch, with staleness bounded by admission control.

Entries are :class:`ScoredGroup`: a coordinator.protocol.CompletedGroup (tokens, behaviour
log-probs, the policy version of every token, optionally the routed experts) plus one reward per
sample, where the rewards came from, and an explicit loss mask per sample over prompt + output
(prompt tokens 0: never trained).

Admission control (AReaL): with batch size B groups, staleness bound eta, policy version v (the
one new rollouts start from: the coordinator's, which may lag the trainer's) and ``running``
groups in flight, ``allowed(v, running) = min(max_in_flight - running,
(eta + v + 1) * B - (accepted + running))``, never negative, where ``accepted`` counts the groups
in the buffer plus those consumed (filtered, evicted and failed groups are not counted, so their
refills are allowed). The driver asks before submitting and registers each submission with
:meth:`ExperienceBuffer.submitted` (which refuses one the formula does not allow).

The bound needs one of two consumption policies, chosen by ``max_age_versions``:
- ``None`` (wait): pop_batch serves groups strictly in admission order, waiting for an older
  group still in flight rather than overtaking it. Then the k-th admitted group (counting from
  0, less those filtered or failed) is consumed in batch floor(k / B), and the formula at its
  submission gave k < (eta + v_submit + 1) * B; so a trainer whose version counts its steps
  consumes it at version <= v_submit + eta, and none of its tokens is older than v_submit. A
  failed or aborted group stops being waited for (:meth:`failed`, :meth:`aborted`).
- an integer (drop): pop_batch serves the oldest *ready* groups and evicts instead every group
  whose oldest token is more than ``max_age_versions`` behind the consuming version; evicted
  groups are reported for refill.
test_experience.py checks both with random interleavings (hypothesis).

``snapshot()``/``restore()`` carry the ready groups, the pending (submitted, not yet put) ids, the
consumed watermark (count and every id ever settled, so none is accepted twice) and the counters,
as JSON-able values.
"""

import dataclasses
import math
import threading
import time
from typing import Dict, List, Optional, Tuple

from ..coordinator.protocol import CompletedGroup, GroupSpec, RLError

SNAPSHOT_FORMAT = 1


class BatchTimeout(RLError):
    """pop_batch's deadline passed before a batch was ready; nothing was consumed.
    ``ready``: groups ready then; ``needed``: the batch size; ``waiting_for``: the oldest group
    still in flight that the wait policy was holding the batch for (or None)."""

    def __init__(self, message, ready, needed, waiting_for=None):
        super().__init__(message)
        self.ready, self.needed, self.waiting_for = ready, needed, waiting_for


class AdmissionRefused(RLError):
    """submitted() of a group that admission control does not allow now."""


def prompt_output_mask(sample):
    """The default loss mask of a sample over prompt + output: 0 on the prompt, 1 on every
    generated token."""
    return [0] * len(sample.prompt) + [1] * len(sample.output.tokens)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


@dataclasses.dataclass
class ScoredGroup:
    """A complete group with one reward per sample (by sample index), the reward's source (e.g.
    ``"rule:add"``) and a loss mask per sample over prompt + output (None: the default mask)."""
    group: CompletedGroup
    rewards: List[float]
    reward_source: str
    loss_masks: Optional[List[List[int]]] = None

    def __post_init__(self):
        if self.loss_masks is None and isinstance(self.group, CompletedGroup):
            self.loss_masks = [prompt_output_mask(s) for s in self.group.samples]

    @property
    def group_id(self):
        return self.group.spec.group_id

    def token_versions(self):
        return [v for s in self.group.samples for v in s.output.versions]

    @property
    def oldest_version(self):
        """The policy version of the group's oldest token (None: no tokens)."""
        versions = self.token_versions()
        return min(versions) if versions else None

    def validate(self):
        """Raises RLError naming the group and what is wrong; changes nothing."""
        if not isinstance(self.group, CompletedGroup):
            raise RLError(f"ScoredGroup.group must be a CompletedGroup, got {type(self.group).__name__}")
        spec = self.group.spec
        if not isinstance(spec, GroupSpec):
            raise RLError("ScoredGroup: the group's spec must be a GroupSpec")
        spec.validate()
        gid, n = spec.group_id, spec.num_samples
        samples = self.group.samples
        if len(samples) != n:
            raise RLError(f"group {gid}: {len(samples)} samples, its spec has num_samples={n}")
        for i, s in enumerate(samples):
            where = f"group {gid} sample {i}"
            if s.sample_index != i or s.group_id != gid:
                raise RLError(f"{where}: holds sample {s.sample_index} of group {s.group_id} (samples go by index)")
            if s.prompt != spec.prompt:
                raise RLError(f"{where}: prompt differs from the group's")
            try:
                s.output.validate()
            except RLError as e:
                raise RLError(f"{where}: {e}") from e
            out = s.output
            if not all(_is_int(t) and t >= 0 for t in out.tokens):
                raise RLError(f"{where}: token ids must be non-negative ints")
            if not all(isinstance(p, (int, float)) and math.isfinite(p) for p in out.logprobs):
                raise RLError(f"{where}: behaviour log-probs must be finite numbers")
            if not all(_is_int(v) and v >= 0 for v in out.versions):
                raise RLError(f"{where}: token versions must be non-negative ints")
            if any(b < a for a, b in zip(out.versions, out.versions[1:])):
                raise RLError(f"{where}: token versions decrease ({out.versions})")
        if not isinstance(self.rewards, (list, tuple)) or len(self.rewards) != n:
            raise RLError(f"group {gid}: {len(self.rewards) if isinstance(self.rewards, (list, tuple)) else '?'} "
                          f"rewards for {n} samples")
        if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)
                   for r in self.rewards):
            raise RLError(f"group {gid}: rewards must be finite numbers, got {list(self.rewards)}")
        if not isinstance(self.reward_source, str) or not self.reward_source:
            raise RLError(f"group {gid}: reward_source must be a non-empty string")
        if not isinstance(self.loss_masks, list) or len(self.loss_masks) != n:
            raise RLError(f"group {gid}: one loss mask per sample needed")
        for i, (s, mask) in enumerate(zip(samples, self.loss_masks)):
            length = len(s.prompt) + len(s.output.tokens)
            if not isinstance(mask, list) or len(mask) != length or any(m not in (0, 1) for m in mask):
                raise RLError(f"group {gid} sample {i}: the loss mask must be {length} zeros/ones "
                              f"(prompt + output)")
            if any(mask[:len(s.prompt)]):
                raise RLError(f"group {gid} sample {i}: the loss mask covers prompt tokens")

    def to_dict(self):
        return {"group": self.group.to_dict(), "rewards": list(self.rewards), "reward_source": self.reward_source,
                "loss_masks": self.loss_masks}

    @classmethod
    def from_dict(cls, d):
        try:
            return cls(CompletedGroup.from_dict(d["group"]), list(d["rewards"]), d["reward_source"],
                       d.get("loss_masks"))
        except (KeyError, TypeError, AttributeError) as e:
            raise RLError(f"ScoredGroup.from_dict: malformed ({e!r})") from e


@dataclasses.dataclass
class _Ready:
    seq: int  # admission order
    scored: ScoredGroup
    put_at: float  # clock() when put
    submitted_version: Optional[int]  # the version it was submitted at, when registered


@dataclasses.dataclass
class _Pending:
    seq: int
    version: int  # submitted at
    spec: Optional[dict]


class ExperienceBuffer:
    """Scored groups between rollout and training; thread-safe (one lock, one condition).

    ``batch_groups`` (B) and ``staleness`` (eta) parametrise admission control; ``max_in_flight``
    caps the groups being generated; ``max_age_versions`` selects the drop policy (see the
    module's docstring); ``dapo_filter`` drops groups whose rewards are all equal (no GRPO
    gradient; groups of one sample are kept, their advantage is their reward); ``clock`` stamps
    put times (the ages in metrics)."""

    def __init__(self, batch_groups, staleness, max_in_flight, max_age_versions=None, dapo_filter=True,
                 clock=time.time):
        for name, value, low in (("batch_groups", batch_groups, 1), ("staleness", staleness, 0),
                                 ("max_in_flight", max_in_flight, 1)):
            if not _is_int(value) or value < low:
                raise RLError(f"ExperienceBuffer: {name} must be an int >= {low}, got {value!r}")
        if max_age_versions is not None and (not _is_int(max_age_versions) or max_age_versions < 0):
            raise RLError(f"ExperienceBuffer: max_age_versions must be None or an int >= 0, got {max_age_versions!r}")
        self.batch_groups, self.staleness, self.max_in_flight = batch_groups, staleness, max_in_flight
        self.max_age_versions, self.dapo_filter, self._clock = max_age_versions, dapo_filter, clock
        self._cond = threading.Condition()
        self._reset()

    def _reset(self):
        self._version = 0
        self._next_seq = 0
        self._ready: Dict[str, _Ready] = {}
        self._pending: Dict[str, _Pending] = {}
        self._settled = set()  # ids consumed, filtered, evicted, failed, aborted or dropped: never taken again
        self._consumed = 0
        self._counts = {"put": 0, "filtered": 0, "evicted": 0, "failed": 0, "aborted": 0, "past_target": 0}
        self._staleness: Dict[int, int] = {}
        self._wait_s = 0.0
        self._refills: List[Tuple[str, str]] = []
        self._history = {"filtered": [], "evicted": [], "failed": []}

    # -- admission control -------------------------------------------------------------------

    def allowed(self, version, running=None):
        """How many new groups the driver may submit now (the formula above). ``running``:
        groups in flight (None: the ones registered with submitted() and not yet settled)."""
        if not _is_int(version) or version < 0:
            raise RLError(f"allowed: version must be an int >= 0, got {version!r}")
        if running is not None and (not _is_int(running) or running < 0):
            raise RLError(f"allowed: running must be an int >= 0, got {running!r}")
        with self._cond:
            return self._allowed(version, len(self._pending) if running is None else running)

    def _allowed(self, version, running):
        accepted = len(self._ready) + self._consumed
        budget = (self.staleness + version + 1) * self.batch_groups - (accepted + running)
        return max(0, min(self.max_in_flight - running, budget))

    def submitted(self, spec: GroupSpec, version=None):
        """Registers a group the driver submits to the coordinator, at ``version``: the policy
        version its rollouts start from (None: the buffer's current one). Refuses
        (AdmissionRefused) when allowed() is 0, and duplicates."""
        if not isinstance(spec, GroupSpec):
            raise RLError(f"submitted: expected a GroupSpec, got {type(spec).__name__}")
        spec.validate()
        with self._cond:
            version = self._version if version is None else version
            if not _is_int(version) or version < 0 or version > self._version:
                raise RLError(f"submitted {spec.group_id}: version {version!r} is not in [0, {self._version}]")
            self._check_new(spec.group_id, "submitted")
            if self._allowed(version, len(self._pending)) < 1:
                raise AdmissionRefused(f"submitted {spec.group_id}: admission control allows no more groups at "
                                       f"version {version} ({len(self._pending)} in flight, "
                                       f"{len(self._ready) + self._consumed} accepted)")
            self._pending[spec.group_id] = _Pending(self._take_seq(), version, spec.to_dict())

    def _check_new(self, gid, op):
        if gid in self._ready or gid in self._settled:
            raise RLError(f"{op} {gid}: duplicate group id (already in the buffer or settled)")
        if op == "submitted" and gid in self._pending:
            raise RLError(f"{op} {gid}: duplicate group id (already in flight)")

    # -- versions ---------------------------------------------------------------------------

    @property
    def version(self):
        with self._cond:
            return self._version

    def set_version(self, version):
        """The current policy version (monotonic; a lower one is refused)."""
        with self._cond:
            self._advance(version, "set_version")
            self._cond.notify_all()

    def _advance(self, version, op):
        if not _is_int(version) or version < self._version:
            raise RLError(f"{op}: version {version!r} is behind the buffer's {self._version} (versions are monotonic)")
        self._version = version

    # -- rollout side -----------------------------------------------------------------------

    def put(self, scored: ScoredGroup) -> bool:
        """Adds a scored group. Returns False when the DAPO filter dropped it (counted, reported
        for refill). Refuses (RLError, nothing changed) malformed groups, tokens from a version
        newer than the buffer's, and a group id seen before."""
        if not isinstance(scored, ScoredGroup):
            raise RLError(f"put: expected a ScoredGroup, got {type(scored).__name__}")
        scored.validate()
        gid = scored.group_id
        with self._cond:
            self._check_new(gid, "put")
            versions = scored.token_versions()
            if versions and max(versions) > self._version:
                raise RLError(f"put {gid}: tokens from version {max(versions)}, the buffer is at {self._version} "
                              f"(a future version)")
            pending = self._pending.pop(gid, None)
            self._counts["put"] += 1
            if self.dapo_filter and len(scored.rewards) > 1 and len(set(scored.rewards)) == 1:
                self._settle(gid, "filtered", refill=True)
                self._cond.notify_all()  # the wait policy may have been holding a batch for it
                return False
            seq = pending.seq if pending is not None else self._take_seq()
            self._ready[gid] = _Ready(seq, scored, self._clock(), pending.version if pending else None)
            self._cond.notify_all()
            return True

    def _take_seq(self):
        self._next_seq += 1
        return self._next_seq - 1

    def _settle(self, gid, reason, refill):
        self._settled.add(gid)
        self._counts[reason] += 1
        if reason in self._history:
            self._history[reason].append(gid)
        if refill:
            self._refills.append((gid, reason))

    def failed(self, group_id):
        """The coordinator marked the group failed: it is no longer waited for; reported for refill."""
        self._drop_in_flight(group_id, "failed", refill=True)

    def aborted(self, group_id):
        """The driver aborted the group (e.g. DAPO surplus): no longer waited for; not refilled."""
        self._drop_in_flight(group_id, "aborted", refill=False)

    def _drop_in_flight(self, gid, reason, refill):
        if not isinstance(gid, str) or not gid:
            raise RLError(f"{reason}: group_id must be a non-empty string")
        with self._cond:
            if gid in self._ready or gid in self._settled:
                raise RLError(f"{reason} {gid}: the group was already put or settled")
            self._pending.pop(gid, None)
            self._settle(gid, reason, refill)
            self._cond.notify_all()

    def take_refills(self) -> List[Tuple[str, str]]:
        """(group_id, reason) of every group filtered, evicted, failed or dropped at restore since
        the last call: each needs a replacement group (a new id)."""
        with self._cond:
            out, self._refills = self._refills, []
            return out

    @property
    def filtered(self):
        with self._cond:
            return list(self._history["filtered"])

    @property
    def evicted(self):
        with self._cond:
            return list(self._history["evicted"])

    @property
    def failed_ids(self):
        with self._cond:
            return list(self._history["failed"])

    def pending_spec(self, group_id) -> Optional[GroupSpec]:
        """The spec a pending group was submitted with (to reissue it after restore)."""
        with self._cond:
            p = self._pending.get(group_id)
            return GroupSpec.from_dict(p.spec) if p is not None and p.spec is not None else None

    # -- trainer side -----------------------------------------------------------------------

    def pop_batch(self, batch_groups, timeout_s, version) -> List[ScoredGroup]:
        """Blocks until ``batch_groups`` groups can be served at policy ``version`` (which also
        advances the buffer's version) and returns them, oldest admission first. Drop policy:
        over-age groups are evicted instead. BatchTimeout after ``timeout_s`` (0: do not wait);
        other threads may put() meanwhile."""
        if not _is_int(batch_groups) or batch_groups < 1:
            raise RLError(f"pop_batch: batch_groups must be an int >= 1, got {batch_groups!r}")
        if not isinstance(timeout_s, (int, float)) or not (0 <= timeout_s < math.inf):
            raise RLError(f"pop_batch: timeout_s must be a finite number >= 0, got {timeout_s!r}")
        start = time.monotonic()
        deadline = start + timeout_s
        with self._cond:
            self._advance(version, "pop_batch")
            try:
                while True:
                    self._evict_over_age()
                    chosen, _ = self._choose(batch_groups)
                    if chosen is not None:
                        return self._consume(chosen)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._timeout(batch_groups, timeout_s)
                    self._cond.wait(remaining)
            finally:
                self._wait_s += time.monotonic() - start

    def _lag(self, entry):
        oldest = entry.scored.oldest_version
        if oldest is None:  # no tokens at all: as old as its submission
            oldest = entry.submitted_version if entry.submitted_version is not None \
                else entry.scored.group.spec.min_version
        return self._version - oldest

    def _evict_over_age(self):
        if self.max_age_versions is None:
            return
        for gid, entry in sorted(self._ready.items(), key=lambda kv: kv[1].seq):
            if self._lag(entry) > self.max_age_versions:
                del self._ready[gid]
                self._settle(gid, "evicted", refill=True)

    def _choose(self, n):
        """(the ids to serve, or None; the in-flight group holding the batch back, or None)."""
        ready = sorted(self._ready.items(), key=lambda kv: kv[1].seq)
        if self.max_age_versions is not None:  # drop policy: the oldest ready ones
            return ([gid for gid, _ in ready[:n]] if len(ready) >= n else None), None
        # Wait policy: the n oldest admitted groups, ready or not; served only once all are ready.
        order = sorted([(e.seq, gid, True) for gid, e in ready] +
                       [(p.seq, gid, False) for gid, p in self._pending.items()])[:n]
        blocking = next((gid for _, gid, is_ready in order if not is_ready), None)
        if len(order) < n or blocking is not None:
            return None, blocking
        return [gid for _, gid, _ in order], None

    def _consume(self, gids):
        out = []
        for gid in gids:
            entry = self._ready.pop(gid)
            lag = self._lag(entry)
            self._staleness[lag] = self._staleness.get(lag, 0) + 1
            self._settled.add(gid)
            self._consumed += 1
            out.append(entry.scored)
        return out

    def _timeout(self, n, timeout_s):
        _, blocking = self._choose(n)
        message = (f"pop_batch at version {self._version}: {len(self._ready)} of {n} groups ready after "
                   f"{timeout_s:.3g} s")
        if blocking is not None:
            p = self._pending[blocking]
            message += (f"; the batch waits for the older group {blocking} (in flight since version {p.version}; "
                        f"failed()/aborted() release it)")
        return BatchTimeout(message, len(self._ready), n, blocking)

    # -- observation -------------------------------------------------------------------------

    def metrics(self) -> dict:
        """depth (ready groups), pending (in flight), accepted (ready + consumed: the formula's),
        consumed, put, filtered, evicted, failed, aborted, past_target (dropped at restore),
        staleness {lag: groups consumed with that lag}, trainer_wait_s (total time in
        pop_batch), oldest_ready_age_s, version."""
        with self._cond:
            now = self._clock()
            oldest = min((e.put_at for e in self._ready.values()), default=None)
            return {"depth": len(self._ready), "pending": len(self._pending),
                    "accepted": len(self._ready) + self._consumed, "consumed": self._consumed,
                    **self._counts, "staleness": dict(sorted(self._staleness.items())),
                    "trainer_wait_s": self._wait_s,
                    "oldest_ready_age_s": None if oldest is None else now - oldest, "version": self._version}

    # -- persistence -------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """The whole state as a JSON-able dict."""
        with self._cond:
            return {
                "format": SNAPSHOT_FORMAT,
                "version": self._version,
                "next_seq": self._next_seq,
                "consumed": self._consumed,
                "ready": [{"seq": e.seq, "put_at": e.put_at, "submitted_version": e.submitted_version,
                           "scored": e.scored.to_dict()}
                          for e in sorted(self._ready.values(), key=lambda e: e.seq)],
                "pending": [{"group_id": gid, "seq": p.seq, "version": p.version, "spec": p.spec}
                            for gid, p in sorted(self._pending.items(), key=lambda kv: kv[1].seq)],
                "settled": sorted(self._settled),
                "counts": dict(self._counts),
                "staleness": {str(k): v for k, v in sorted(self._staleness.items())},
                "trainer_wait_s": self._wait_s,
                "refills": [list(r) for r in self._refills],
                "history": {k: list(v) for k, v in self._history.items()},
            }

    def restore(self, state: dict, version=None) -> List[str]:
        """Replaces the state with a snapshot's, at policy ``version`` (None: the snapshot's; not
        lower). Drops past targets: pending groups submitted more than the bound (max_age_versions,
        or eta under the wait policy) before ``version`` can no longer be consumed in time; and
        evicts ready groups over that age. Both are reported for refill. Returns the ids of the
        remaining pending groups, oldest first, for the driver to reissue (pending_spec() has
        their specs); they keep their place in the admission order. A malformed state raises
        RLError and changes nothing."""
        new = self._parse(state, version)
        with self._cond:
            (self._version, self._next_seq, self._consumed, self._ready, self._pending, self._settled,
             self._counts, self._staleness, self._wait_s, self._refills, self._history) = new
            limit = self.max_age_versions if self.max_age_versions is not None else self.staleness
            for gid, entry in sorted(self._ready.items(), key=lambda kv: kv[1].seq):
                if self._lag(entry) > limit:
                    del self._ready[gid]
                    self._settle(gid, "evicted", refill=True)
            for gid, p in sorted(self._pending.items(), key=lambda kv: kv[1].seq):
                if self._version - p.version > limit:
                    del self._pending[gid]
                    self._settle(gid, "past_target", refill=True)
            self._cond.notify_all()
            return [gid for gid, _ in sorted(self._pending.items(), key=lambda kv: kv[1].seq)]

    def _parse(self, state, version):
        try:
            if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
                raise RLError(f"not an experience buffer snapshot of format {SNAPSHOT_FORMAT}")
            v = state["version"]
            if version is not None:
                if not _is_int(version) or version < v:
                    raise RLError(f"version {version!r} is behind the snapshot's {v}")
                v = version
            ready = {}
            for item in state["ready"]:
                scored = ScoredGroup.from_dict(item["scored"])
                scored.validate()
                submitted_version = item["submitted_version"]
                if submitted_version is not None and not _is_int(submitted_version):
                    raise RLError(f"group {scored.group_id}: submitted_version {submitted_version!r}")
                ready[scored.group_id] = _Ready(int(item["seq"]), scored, float(item["put_at"]), submitted_version)
            pending = {p["group_id"]: _Pending(int(p["seq"]), int(p["version"]), p["spec"]) for p in state["pending"]}
            seqs = [e.seq for e in ready.values()] + [p.seq for p in pending.values()]
            if len(set(seqs)) != len(seqs) or any(q < 0 or q >= int(state["next_seq"]) for q in seqs):
                raise RLError("admission numbers (seq) must be distinct and below next_seq")
            settled = set(state["settled"])
            if set(ready) & set(pending) or (set(ready) | set(pending)) & settled:
                raise RLError("a group id is both ready/pending/settled")
            counts = {k: int(state["counts"].get(k, 0)) for k in self._counts}
            staleness = {int(k): int(n) for k, n in state["staleness"].items()}
            refills = [(str(gid), str(reason)) for gid, reason in state["refills"]]
            history = {k: list(state["history"].get(k, [])) for k in self._history}
            return (v, int(state["next_seq"]), int(state["consumed"]), ready, pending, settled, counts, staleness,
                    float(state["trainer_wait_s"]), refills, history)
        except RLError as e:
            raise RLError(f"ExperienceBuffer.restore: {e}") from e
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RLError(f"ExperienceBuffer.restore: malformed snapshot ({e!r})") from e
