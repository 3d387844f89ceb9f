"""The rollout coordinator's interface (docs/RL.md section 3): the lease protocol over groups of
samples. Two stores implement it with the same semantics and pass the same tests:
``MemoryCoordinator`` (memory.py, the embedded default) and ``RedisCoordinator``
(redis.py: streams with a consumer group, persistent across coordinator restarts).
``CoordinatorClient`` (service.py) reaches an embedded one from other processes.

Semantics every implementation keeps:
- Queue order: higher ``priority`` first, then oldest admission (submit time) first. A requeued
  remainder keeps its group's place: it is leased before anything admitted after it.
- ``lease`` issues at most ``capacity`` leases, each for one sample (a sample is never leased
  twice at once), with ``token_budget = min(lease_tokens, tokens still to generate)`` and
  ``deadline = now + lease_timeout_s``.
- ``heartbeat`` extends the deadlines of the leases the worker still holds and returns their ids;
  leases it no longer holds (expired, aborted) are left out, which tells the worker to stop them.
- ``report_partial`` appends tokens to the sample's progress (kept across requeues);
  ``complete`` appends the last tokens and finishes the sample; both refuse a lease the caller
  no longer holds with ``StaleLease`` and an id never issued with ``UnknownLease``, changing
  nothing. Appending beyond max_new_tokens is refused (``RLError``).
- ``release`` (and expiry, found by ``reap`` or by any call) requeues the remainder: prompt plus
  the progress so far. ``error`` releases and expiries count as attempts; after ``max_attempts``
  the group is ``failed``. ``interrupted``/``draining`` releases do not count (a Spot notice is not
  the sample's fault). ``aborted`` releases do not requeue.
- ``abort(group_id)`` / ``abort(None)`` (all pending groups) drops the group(s): outstanding leases
  become stale, nothing more is issued for them.
- ``take_completed`` hands each complete group out exactly once, oldest admission first.
- ``snapshot``/``restore``: the whole state as a JSON-able dict (leases outstanding at snapshot time
  are requeued on restore, their progress kept).
- Every method validates its input before changing anything.
"""

import abc
from typing import Dict, List, Optional

from .protocol import CompletedGroup, GroupSpec, GroupState, Lease, Progress, ReleaseReason


class Coordinator(abc.ABC):
    @abc.abstractmethod
    def submit(self, group: GroupSpec) -> None:
        """Admits a group (all its samples queued). A duplicate group_id is refused (RLError)."""

    @abc.abstractmethod
    def lease(self, worker_id: str, capacity: int) -> List[Lease]:
        """Up to ``capacity`` new leases for ``worker_id``, in queue order."""

    @abc.abstractmethod
    def heartbeat(self, worker_id: str, lease_ids: List[str]) -> List[str]:
        """Extends the deadlines of the leases ``worker_id`` still holds; returns their ids."""

    @abc.abstractmethod
    def report_partial(self, lease_id: str, worker_id: str, progress: Progress) -> None:
        """Appends tokens generated so far under the lease (also extends its deadline)."""

    @abc.abstractmethod
    def complete(self, lease_id: str, worker_id: str, progress: Progress, finish_reason: str) -> None:
        """Appends the last tokens and finishes the sample; completes the group when it was its last."""

    @abc.abstractmethod
    def release(self, lease_id: str, worker_id: str, reason: ReleaseReason,
                progress: Optional[Progress] = None) -> None:
        """Gives the lease back (``progress``: tokens not yet reported); requeues unless aborted."""

    @abc.abstractmethod
    def abort(self, group_id: Optional[str] = None) -> int:
        """Aborts one pending group or (None) every pending group; returns how many."""

    @abc.abstractmethod
    def reap(self) -> int:
        """Requeues every lease past its deadline now; returns how many."""

    @abc.abstractmethod
    def take_completed(self, max_groups: Optional[int] = None) -> List[CompletedGroup]:
        """Complete groups not yet taken, oldest admission first (each exactly once)."""

    @abc.abstractmethod
    def group_state(self, group_id: str) -> GroupState:
        """Raises RLError for an unknown group."""

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """The current policy version (monotonic: a lower one is refused); new leases record it."""

    @abc.abstractmethod
    def version(self) -> int: ...

    @abc.abstractmethod
    def stats(self) -> Dict[str, int]:
        """Counters and gauges: submitted, completed_groups, failed_groups, aborted_groups,
        samples_completed, leases_issued, requeued, interrupted, expired, errors, running
        (leases outstanding), queued (samples waiting), tokens_reported."""

    @abc.abstractmethod
    def snapshot(self) -> dict: ...

    @abc.abstractmethod
    def restore(self, state: dict) -> None:
        """Replaces the whole state with a snapshot's (outstanding leases requeued)."""

    def close(self) -> None:
        """Releases connections (the state stays in the store)."""
