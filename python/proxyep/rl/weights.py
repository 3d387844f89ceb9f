"""Versioned, EP-aware weight publication over ProxyEP's fabric (docs/RL.md section 5): the
trainer's rank 0 publishes policy versions to rollout workers, which are separate jobs with
their own EP layouts, each expert going only to the ranks that own it, two-phase (stage on every
receiver, commit when they have verified every checksum), so no worker ever serves a torn
version.

- weights_manifest.py: the schema, the rollout layout, the per-version manifest (JSON);
- weight_publisher.py: :class:`WeightPublisher` (trainer rank 0, after gather_ep_state);
- weight_subscriber.py: :class:`WeightSubscriber` (each rollout worker rank);
- weights_wire.py: the authenticated control channel; the bytes go over RMA links
  (integrations/rma_link.hpp, ``_proxyep.RmaSender``/``RmaReceiver``).

Typical use::

    # trainer, every rank: dense, rows = gather_ep_state(model, group)  (collective)
    # trainer rank 0:
    pub = WeightPublisher.for_state(dense, rows, host="0.0.0.0", authkey=key)
    result = pub.publish(step, dense, rows)          # PublishResult: committed, recovered, dropped

    # rollout worker rank r of an EP-n worker:
    sub = WeightSubscriber(pub_address, key, "worker-7", r, Layout.contiguous(n, num_experts),
                           expected_tensors(model.named_parameters()))
    update = sub.poll()                               # between decode steps
    if update is not None:
        version, state = update                       # this rank's tensors, verified and committed
"""

from .weight_publisher import PublishResult, WeightPublisher
from .weight_subscriber import CommittedWeights, SubscriberStats, WeightSubscriber, expected_tensors
from .weights_manifest import (Chunk, Layout, TensorSpec, WeightError, WeightManifest, landing_plan, plan_manifest,
                               schema_of, source_offsets)

__all__ = ["Chunk", "CommittedWeights", "Layout", "PublishResult", "SubscriberStats", "TensorSpec", "WeightError",
           "WeightManifest", "WeightPublisher", "WeightSubscriber", "expected_tensors", "landing_plan",
           "plan_manifest", "schema_of", "source_offsets"]
