"""Weight publication (docs/RL.md section 5): versioned, EP-aware, two-phase, from the trainer's
rank 0 to the rollout workers' ranks over ProxyEP's fabric: manifest.py (schema, layout, manifests),
publisher.py (WeightPublisher), subscriber.py (WeightSubscriber), wire.py (the authenticated control
channel). The public names are re-exported here; typical use is in publisher.py's docstring."""

from .manifest import (Chunk, Layout, TensorSpec, WeightError, WeightManifest, landing_plan, plan_manifest,
                       schema_of, source_offsets)
from .publisher import PublishResult, WeightPublisher
from .subscriber import CommittedWeights, SubscriberStats, WeightSubscriber, expected_tensors

__all__ = ["Chunk", "CommittedWeights", "Layout", "PublishResult", "SubscriberStats", "TensorSpec", "WeightError",
           "WeightManifest", "WeightPublisher", "WeightSubscriber", "expected_tensors", "landing_plan",
           "plan_manifest", "schema_of", "source_offsets"]
