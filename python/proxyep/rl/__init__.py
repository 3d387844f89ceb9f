"""proxyep.rl: the MoE RL substrate (docs/RL.md), in four sub-packages: coordinator/ (the rollout
pool's lease protocol and its stores: memory, Redis, served over RPC), rollout/ (rollout workers
serving the tiny MoE with low-latency EP), train/ (GRPO, the EP train step, the experience buffer,
the controller and checkpoints: everything the trainer job runs) and weights/ (versioned EP-aware
weight publication over ProxyEP's fabric). At the top: the GRPO run's supervisor (run.py,
``python3 -m proxyep.rl run``), its configuration (run_config.py), the model's shape shared by
both sides (model_config.py) and the benchmark (bench_rl.py, ``python3 -m proxyep.bench rl``).
The lease protocol's names are re-exported here."""

from .coordinator.interface import Coordinator
from .coordinator.protocol import (CompletedGroup, GroupSpec, GroupState, Lease, Progress, ReleaseReason, RLError,
                                   Sample, SamplingParams, StaleLease, UnknownLease)

__all__ = ["CompletedGroup", "Coordinator", "GroupSpec", "GroupState", "Lease", "Progress", "RLError",
           "ReleaseReason", "Sample", "SamplingParams", "StaleLease", "UnknownLease"]
