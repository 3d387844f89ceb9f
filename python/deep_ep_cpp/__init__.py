"""DeepEP's C extension module name, for callers that import from it directly."""

from deep_ep import Config, EventHandle, get_low_latency_rdma_size_hint, is_sm90_compiled  # noqa: F401
from deep_ep.buffer import Buffer  # noqa: F401
