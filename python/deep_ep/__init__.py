"""DeepEP's Python API on ProxyEP: ``import deep_ep`` runs DeepEP code unchanged.

``Buffer`` is DeepEP V1's (``deep_ep.buffers.legacy``); ``ElasticBuffer`` and ``EPHandle`` are
DeepEP 2.1's V2 API (``deep_ep.buffers.elastic``), built over the V1 Buffer for now. See the
repository's docs/PYTHON.md for what is supported and how it differs (CPU tensors, and CUDA
tensors in a build with CUDA; FP8 as uint8 on torch without float8 dtypes).
"""

import torch

from proxyep import Config, ProxyEPError  # noqa: F401
from proxyep import get_low_latency_rdma_size_hint as _ll_hint

from .buffers.elastic import ElasticBuffer, EPHandle  # noqa: F401
from .buffers.legacy import Buffer  # noqa: F401
from .utils.envs import get_logical_domain_size, get_physical_domain_size  # noqa: F401
from .utils.event import EventHandle, EventOverlap  # noqa: F401

#: DeepEP's top-k index dtype.
topk_idx_t = torch.int64

#: DeepEP 2.1's. Code checks it to pick the V2 API: ElasticBuffer matches DeepEP's numerics and
#: layouts with CPU and device tensors (docs/plans/ELASTIC_BUFFER.md); what it refuses it refuses
#: by name, on every device alike.
__version__ = "2.1.0"


def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
    return _ll_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)


def is_sm90_compiled():
    """DeepEP's flag for its FP8/TMA kernels; ProxyEP's FP8 paths exist on every build."""
    return True


__all__ = [
    "Buffer",
    "Config",
    "EPHandle",
    "ElasticBuffer",
    "EventHandle",
    "EventOverlap",
    "ProxyEPError",
    "get_logical_domain_size",
    "get_low_latency_rdma_size_hint",
    "get_physical_domain_size",
    "is_sm90_compiled",
    "topk_idx_t",
]
