"""The configuration of a GRPO run (``proxyep rl run --config FILE``): one JSON object whose
sections say what is trained on what (model, task, GRPO), who runs it (trainer group, rollout
pool), where its state lives (coordinator store, checkpoints) and which faults to inject
(preemption). Every field has a default, so ``{}`` is the reference configuration; unknown keys
are refused so a typo is an error, not a silently ignored setting.
"""

import dataclasses
import json
from typing import List, Optional

from .coordinator.protocol import RLError
from .model_config import ModelConfig, json_argument
from .train.grpo import LossConfig


@dataclasses.dataclass
class TaskConfig:
    name: str = "add"  # train.tasks.AdditionTask
    digits: int = 1
    seed: int = 0


@dataclasses.dataclass
class GRPOConfig:
    group_size: int = 8  # G samples per prompt
    batch_groups: int = 4  # B groups per training step
    iterations: int = 40
    lr: float = 3e-3
    temperature: float = 1.0
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    staleness: int = 0  # eta: 0 is synchronous (on-policy)
    max_in_flight: Optional[int] = None  # groups submitted and not yet scored (None: (eta + 1) * B)
    dapo_filter: bool = False  # drop all-equal groups and refill (off: a tiny model's early groups are often all 0)
    pop_timeout_s: float = 120.0  # the trainer's wait for one batch, at most


@dataclasses.dataclass
class TrainerConfig:
    ranks: int = 2
    ranks_per_node: int = 2
    exchange: str = "proxyep"  # or "a2a": all_to_all_single over gloo (the baseline of bench rl)


@dataclasses.dataclass
class RolloutConfig:
    workers: int = 2
    ranks: int = 2  # EP size of each worker
    ranks_per_node: int = 1  # 1: each worker's ranks are separate "nodes" (fabric path)
    capacity: int = 16  # samples one worker holds at once
    report_every: int = 4
    lease_timeout_s: float = 10.0
    lease_tokens: Optional[int] = None  # a lease's token budget (None: the whole sample)
    max_attempts: int = 3
    drain_budget_s: float = 30.0
    exchange: str = "proxyep"  # or "a2a"


PREEMPT_KINDS = ("notice", "kill")


@dataclasses.dataclass
class PreemptConfig:
    rate: float = 0.0  # Spot notices per worker per minute (Poisson), 0: none
    # [[at, worker], ...] or [[at, worker, kind], ...]: kind "notice" (the default: the Spot
    # notice, a drain) or "kill" (SIGKILL to the worker's ranks and launcher: a lost machine).
    schedule: List[list] = dataclasses.field(default_factory=list)
    schedule_unit: str = "seconds"  # `at` counts seconds since the run started, or "iterations" trained
    restart_delay_s: float = 1.0  # before an interrupted worker rejoins
    seed: int = 0


@dataclasses.dataclass
class RunConfig:
    model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig(
        vocab=14, hidden=128, layers=1, heads=4, num_experts=4, topk=2, ffn_hidden=64, max_seq=16, seed=1))
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    preempt: PreemptConfig = dataclasses.field(default_factory=PreemptConfig)
    coordinator: str = "memory"  # "memory" (embedded in the trainer's rank 0), "redis" (start one), redis://...
    checkpoint_dir: Optional[str] = None  # default: <run dir>/checkpoints
    checkpoint_s3: Optional[dict] = None  # {"bucket", "prefix", "endpoint_url", ...}: S3Store instead
    checkpoint_every: int = 10  # iterations; 0: never
    # coordinator "redis": the supervisor's own redis-server (<run dir>/redis). "always": every
    # write is on disk before it is acknowledged, so a server crash loses no transition.
    redis_appendfsync: str = "always"
    # How long the trainer's rank 0 keeps retrying a Redis coordinator it cannot reach (a server
    # restart) before the run fails.
    coordinator_retry_s: float = 30.0
    seed: int = 0

    def validate(self):
        self.model.validate()
        g, r, t = self.grpo, self.rollout, self.trainer
        for name, value in (("grpo.group_size", g.group_size), ("grpo.batch_groups", g.batch_groups),
                            ("grpo.iterations", g.iterations), ("trainer.ranks", t.ranks),
                            ("trainer.ranks_per_node", t.ranks_per_node), ("rollout.workers", r.workers),
                            ("rollout.ranks", r.ranks), ("rollout.ranks_per_node", r.ranks_per_node),
                            ("rollout.capacity", r.capacity), ("rollout.report_every", r.report_every),
                            ("rollout.max_attempts", r.max_attempts)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RLError(f"run config: {name} must be a positive integer, got {value!r}")
        if g.staleness < 0:
            raise RLError(f"run config: grpo.staleness must be >= 0, got {g.staleness}")
        for name, ranks in (("trainer", t.ranks), ("rollout", r.ranks)):
            if self.model.num_experts % ranks:
                raise RLError(f"run config: model.num_experts {self.model.num_experts} is not a multiple of "
                              f"{name}.ranks {ranks}")
        for name, value in (("trainer.exchange", t.exchange), ("rollout.exchange", r.exchange)):
            if value not in ("proxyep", "a2a"):
                raise RLError(f"run config: {name} must be 'proxyep' or 'a2a', got {value!r}")
        if self.task.name != "add":
            raise RLError(f"run config: unknown task {self.task.name!r} (known: add)")
        if self.model.vocab < 14:
            raise RLError(f"run config: the add task needs model.vocab >= 14, got {self.model.vocab}")
        longest = 1 + 2 * self.task.digits + 2 + self.task.digits + 2
        if self.model.max_seq < longest:
            raise RLError(f"run config: model.max_seq {self.model.max_seq} < {longest} (prompt + answer of "
                          f"{self.task.digits}-digit additions)")
        if self.preempt.rate < 0:
            raise RLError("run config: preempt.rate must be >= 0")
        if self.preempt.schedule_unit not in ("seconds", "iterations"):
            raise RLError(f"run config: preempt.schedule_unit must be 'seconds' or 'iterations', "
                          f"got {self.preempt.schedule_unit!r}")
        for item in self.preempt.schedule:
            if (not isinstance(item, (list, tuple)) or len(item) not in (2, 3)
                    or not isinstance(item[0], (int, float)) or isinstance(item[0], bool) or not item[0] >= 0
                    or not isinstance(item[1], int) or isinstance(item[1], bool) or not 0 <= item[1] < r.workers
                    or (len(item) == 3 and item[2] not in PREEMPT_KINDS)):
                raise RLError(f"run config: preempt.schedule entries are [at, worker index] or [at, worker index, "
                              f"kind] (kind in {list(PREEMPT_KINDS)}, worker index < {r.workers}), got {item!r}")
        if not (self.coordinator in ("memory", "redis") or str(self.coordinator).startswith("redis://")):
            raise RLError(f"run config: coordinator must be 'memory', 'redis' or a redis:// URL, "
                          f"got {self.coordinator!r}")
        if self.redis_appendfsync not in ("always", "everysec", "no"):
            raise RLError(f"run config: redis_appendfsync must be always, everysec or no, "
                          f"got {self.redis_appendfsync!r}")
        if not self.coordinator_retry_s >= 0:
            raise RLError(f"run config: coordinator_retry_s must be >= 0, got {self.coordinator_retry_s!r}")
        g.loss.validate()
        return self

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d):
        return _build(cls, d, "run config").validate()

    @classmethod
    def load(cls, path_or_json):
        """From a file, or an inline JSON object (starting with '{')."""
        text = json_argument(path_or_json, "run config")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise RLError(f"run config: not JSON ({e})") from e
        return cls.from_dict(d)


def _build(cls, d, where):
    """A dataclass from a dict, recursively, refusing unknown keys."""
    if not isinstance(d, dict):
        raise RLError(f"{where}: expected an object, got {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise RLError(f"{where}: unknown keys {unknown} (known: {sorted(fields)})")
    kwargs = {}
    defaults = cls()
    for name, value in d.items():
        current = getattr(defaults, name)
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            merged = dataclasses.asdict(current)
            if not isinstance(value, dict):
                raise RLError(f"{where}.{name}: expected an object")
            merged.update(value)
            kwargs[name] = _build(type(current), merged, f"{where}.{name}")
        else:
            kwargs[name] = value
    return dataclasses.replace(defaults, **kwargs)
