"""ProxyEP's Python API.

The native module binds ``proxyep::Buffer`` (normal and low-latency modes) over torch tensor
views; ``deep_ep`` (the DeepEP drop-in) is built on this package. Tensors are CPU tensors, or CUDA
tensors where the build has CUDA (``to_device``/``to_host`` move tensors to and from a Device,
the simulated one included); FP8 travels as ``torch.float8_e4m3fn`` where torch has it, else as
``torch.uint8`` tensors of e4m3 bytes.

Errors raised by the runtime are :class:`ProxyEPError` (a ``RuntimeError``) with the runtime's
message, which names the phase and, for peer failures, the rank.
"""

import os as _os
import signal as _signal
import threading as _threading

# Debian's libfabric loads the PSM libraries, whose load-time constructors take SIGINT, SIGTERM
# and the crash signals and answer them with exit(1): Ctrl-C would end Python with status 1 and
# no KeyboardInterrupt, SIGTERM would run the interpreter's exit with the runtime's threads still
# working. These keep them off; set before the native module, and with it libfabric, is loaded.
for _name in ("IPATH_NO_BACKTRACE", "HFI_NO_BACKTRACE"):
    _os.environ.setdefault(_name, "1")

from ._proxyep import (  # noqa: F401, E402
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
from ._proxyep import restore_signals_taken_by_libraries as _restore_signals  # noqa: E402

# Where libfabric was loaded before this package (its libraries took the signals already), the
# default actions come back, and Python's own handler for SIGINT.
_taken = _restore_signals()
if _signal.SIGINT in _taken and _threading.current_thread() is _threading.main_thread():
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)

from ._group import rendezvous  # noqa: F401, E402
from ._tensors import FP8_DTYPE, tensor, to_device, to_host, view  # noqa: F401, E402

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
