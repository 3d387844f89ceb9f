"""The rollout pool's vocabulary (docs/RL.md): what is submitted, leased, reported, completed
and released, as plain dataclasses that cross process boundaries as JSON-able dicts
(``to_dict``/``from_dict``), so the in-process coordinator, the Redis one and the RPC between
them carry exactly the same values.

Units: a *group* (one prompt, G samples) is the unit of completion, advantage and failure; a
*sample* is the unit of scheduling; a *lease* covers one sample's next stretch of at most
``token_budget`` tokens. Token ids are ints, log-probs floats, versions ints (the policy version
that produced each token).
"""

import dataclasses
import enum
from typing import List, Optional


class RLError(RuntimeError):
    """A refused request (bad input, unknown or stale lease); the coordinator's state is
    unchanged when one is raised."""


class UnknownLease(RLError):
    """The lease id was never issued by this coordinator."""


class StaleLease(RLError):
    """The lease was issued but is no longer held by the caller (expired and requeued, released,
    completed, or its group aborted): its output is not accepted, so nothing is counted twice."""


class ReleaseReason(str, enum.Enum):
    interrupted = "interrupted"  # Spot notice / SIGTERM: the remainder is requeued
    draining = "draining"  # the worker is leaving (scale-in): requeued
    error = "error"  # the worker failed on it: requeued, counts as an attempt
    aborted = "aborted"  # surplus work given back after abort(): not requeued


class GroupState(str, enum.Enum):
    pending = "pending"  # some samples not yet complete
    complete = "complete"  # every sample complete
    failed = "failed"  # a sample ran out of attempts: the buffer refills the group
    aborted = "aborted"  # abort(): dropped


def _fields(cls, d):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise RLError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    return cls(**d)


@dataclasses.dataclass
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    stop_token: Optional[int] = None  # generation of a sample ends after emitting it

    def validate(self):
        if self.max_new_tokens <= 0:
            raise RLError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise RLError(f"temperature must be positive, got {self.temperature}")


@dataclasses.dataclass
class GroupSpec:
    """A prompt to sample G times. ``max_policy_lag``: a lease is not issued for this group when
    the coordinator's current version is more than this ahead of the group's ``min_version``
    (None: no bound)."""
    group_id: str
    prompt: List[int]
    num_samples: int
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    priority: int = 0  # higher first; equal priority: oldest admission first
    max_policy_lag: Optional[int] = None
    min_version: int = 0
    metadata: dict = dataclasses.field(default_factory=dict)  # e.g. the task's answer

    def validate(self):
        if not isinstance(self.group_id, str) or not self.group_id:
            raise RLError("group_id must be a non-empty string")
        if not self.prompt or not all(isinstance(t, int) and t >= 0 for t in self.prompt):
            raise RLError(f"group {self.group_id}: prompt must be a non-empty list of token ids")
        if self.num_samples <= 0:
            raise RLError(f"group {self.group_id}: num_samples must be positive")
        self.sampling.validate()

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d["sampling"] = _fields(SamplingParams, d.get("sampling", {}))
        return _fields(cls, d)


@dataclasses.dataclass
class Progress:
    """A sample's output so far: generated tokens, their behaviour log-probs and the policy
    version of each (equal lengths), plus optionally the routed experts per token
    ([token][layer][k] expert ids, for routing replay)."""
    tokens: List[int] = dataclasses.field(default_factory=list)
    logprobs: List[float] = dataclasses.field(default_factory=list)
    versions: List[int] = dataclasses.field(default_factory=list)
    routed_experts: Optional[List[List[List[int]]]] = None

    def validate(self):
        n = len(self.tokens)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise RLError(f"progress: {n} tokens, {len(self.logprobs)} logprobs, {len(self.versions)} versions")
        if self.routed_experts is not None and len(self.routed_experts) != n:
            raise RLError(f"progress: {n} tokens but routed experts for {len(self.routed_experts)}")

    def extend(self, other):
        self.tokens += other.tokens
        self.logprobs += other.logprobs
        self.versions += other.versions
        if other.routed_experts is not None:
            self.routed_experts = (self.routed_experts or []) + other.routed_experts

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        return _fields(cls, dict(d))


@dataclasses.dataclass
class Lease:
    """One sample's next stretch, held by ``worker_id`` until ``deadline`` (seconds since the
    epoch; heartbeats move it). ``prefix``: what earlier attempts produced (the worker continues
    after prompt + prefix.tokens). ``attempt`` counts from 1."""
    lease_id: str
    group_id: str
    sample_index: int
    worker_id: str
    prompt: List[int]
    prefix: Progress
    sampling: SamplingParams
    token_budget: int
    deadline: float
    attempt: int
    version_started: int

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d["prefix"] = Progress.from_dict(d["prefix"])
        d["sampling"] = _fields(SamplingParams, d["sampling"])
        return _fields(cls, d)


@dataclasses.dataclass
class Sample:
    """A finished sample: the full output (prefix included) and why it ended
    (``"stop"``: the stop token, ``"length"``: max_new_tokens)."""
    group_id: str
    sample_index: int
    prompt: List[int]
    output: Progress
    finish_reason: str
    attempts: int

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d["output"] = Progress.from_dict(d["output"])
        return _fields(cls, d)


@dataclasses.dataclass
class CompletedGroup:
    spec: GroupSpec
    samples: List[Sample]  # by sample_index
    admitted_at: float  # when submit() accepted it

    def to_dict(self):
        return {"spec": self.spec.to_dict(), "samples": [s.to_dict() for s in self.samples],
                "admitted_at": self.admitted_at}

    @classmethod
    def from_dict(cls, d):
        return cls(GroupSpec.from_dict(d["spec"]), [Sample.from_dict(s) for s in d["samples"]], d["admitted_at"])
