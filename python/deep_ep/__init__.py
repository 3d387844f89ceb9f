"""DeepEP V1's Python API on ProxyEP: ``import deep_ep`` runs DeepEP code unchanged.

See the repository's docs/PYTHON.md for what is supported and how it differs (CPU tensors, and CUDA
tensors in a build with CUDA; FP8 as uint8 on torch without float8 dtypes).
"""

import torch

from proxyep import Config, ProxyEPError  # noqa: F401
from proxyep import get_low_latency_rdma_size_hint as _ll_hint

from .buffer import Buffer  # noqa: F401
from .utils import EventHandle, EventOverlap  # noqa: F401

#: DeepEP's top-k index dtype.
topk_idx_t = torch.int64


def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
    return _ll_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)


def is_sm90_compiled():
    """DeepEP's flag for its FP8/TMA kernels; ProxyEP's FP8 paths exist on every build."""
    return True


__all__ = [
    "Buffer",
    "Config",
    "EventHandle",
    "EventOverlap",
    "ProxyEPError",
    "get_low_latency_rdma_size_hint",
    "is_sm90_compiled",
    "topk_idx_t",
]
