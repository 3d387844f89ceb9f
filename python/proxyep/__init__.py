"""ProxyEP's Python API.

The native module binds ``proxyep::Buffer`` (normal and low-latency modes) over torch tensor
views; ``deep_ep`` (the DeepEP drop-in) is built on this package. Tensors are CPU tensors, or CUDA
tensors where the build has CUDA (``to_device``/``to_host`` move tensors to and from a Device,
the simulated one included); FP8 travels as ``torch.float8_e4m3fn`` where torch has it, else as
``torch.uint8`` tensors of e4m3 bytes.

Errors raised by the runtime are :class:`ProxyEPError` (a ``RuntimeError``) with the runtime's
message, which names the phase and, for peer failures, the rank.
"""

from ._proxyep import (  # noqa: F401
    Config,
    ProxyEPError,
    get_combine_config,
    get_dispatch_config,
    get_low_latency_rdma_size_hint,
    get_num_sms,
    nvl_bytes_hint,
    rdma_bytes_hint,
    set_num_sms,
)
from ._group import rendezvous  # noqa: F401
from ._tensors import FP8_DTYPE, tensor, to_device, to_host, view  # noqa: F401

__all__ = [
    "Config",
    "FP8_DTYPE",
    "ProxyEPError",
    "get_combine_config",
    "get_dispatch_config",
    "get_low_latency_rdma_size_hint",
    "get_num_sms",
    "nvl_bytes_hint",
    "rdma_bytes_hint",
    "rendezvous",
    "set_num_sms",
    "tensor",
    "to_device",
    "to_host",
    "view",
]
