"""proxyep.rl: the MoE RL substrate (docs/RL.md): a rollout coordinator with leases and
Spot-safe requeue (coordinator*.py), rollout workers serving the tiny MoE with low-latency EP
(rollout_worker.py), the staleness-bounded experience buffer (experience.py), versioned
EP-aware weight publication over ProxyEP's fabric (weights.py) and checkpoints to a directory
or an S3-compatible store (checkpoint.py)."""

from .coordinator import Coordinator
from .protocol import (CompletedGroup, GroupSpec, GroupState, Lease, Progress, ReleaseReason, RLError, Sample,
                       SamplingParams, StaleLease, UnknownLease)

__all__ = ["CompletedGroup", "Coordinator", "GroupSpec", "GroupState", "Lease", "Progress", "RLError",
           "ReleaseReason", "Sample", "SamplingParams", "StaleLease", "UnknownLease"]
