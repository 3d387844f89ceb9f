"""DeepEP's event helpers (``deep_ep.utils.event``; ``from deep_ep.utils import EventHandle,
EventOverlap`` as Megatron imports them).

With CUDA, an ``EventHandle()`` marks the current end of torch's current stream (a
``torch.cuda.Event`` recorded there, as DeepEP's does), and ``current_stream_wait()`` makes the
current stream wait for it. A call made with ``async_finish=True`` that ProxyEP finishes in the
background returns an ``EventHandle`` over that work. ``current_stream_wait()`` waits on the host
(the GIL released) and raises the call's error, if any; its outputs are complete then. With CUDA
tensors and ``PROXYEP_EP_ASYNC_WAIT=device`` it makes the current stream wait for the call's device
point instead (reached once the call ended; its outputs are complete there) and returns at once, as
DeepEP's does; a failure of the call is then raised by the Buffer's next call (docs/PYTHON.md says
why that is not the default). On
CPU tensors there are no streams: work that ProxyEP finishes on the calling thread is complete
when the call returns, and an ``EventHandle()`` without CUDA is already complete.
"""

import torch

_CUDA = None


def cuda_available():
    """Whether torch has a usable GPU (asked once: torch.cuda.is_available() is not free)."""
    global _CUDA
    if _CUDA is None:
        _CUDA = bool(torch.cuda.is_available())
    return _CUDA


class EventHandle:
    """A point in the caller's stream or in ProxyEP's work; ``current_stream_wait()`` makes the
    caller wait for it."""

    def __init__(self, native=None, device=None):
        self._native = native  # _proxyep.CallEvent, or None
        # A Buffer's _proxyep.Device with streams of the caller's (CUDA): a device call's event
        # is waited for there (its device_point), not on the host.
        self._device = device
        # The point torch's current stream reached, when no ProxyEP work is being marked.
        self.torch_event = None
        if native is None and cuda_available():
            self.torch_event = torch.cuda.Event()
            self.torch_event.record()

    def current_stream_wait(self):
        native, self._native = self._native, None
        if native is not None:
            point = native.device_point
            if point is None or self._device is None or not self._device.stream_wait(
                    point, torch.cuda.current_stream().cuda_stream):
                native.wait()
        if self.torch_event is not None:
            torch.cuda.current_stream().wait_event(self.torch_event)

    def is_complete(self):
        return self._native is None and (self.torch_event is None or self.torch_event.query())


class EventOverlap:
    """DeepEP's EventOverlap: an optional event plus tensors to keep alive until it is waited
    for; usable as a context manager (leaving it waits). As in DeepEP 2.x, a hook registered with
    ``register_hook_after_wait`` runs once, right after the wait (ElasticBuffer finishes a
    dispatch's handle there), and ``with event(release_handle=True):`` drops the event after
    waiting."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors
        self.hook_after_wait = None
        self._release_handle_by_call = False

    def current_stream_wait(self, release_handle=False):
        assert self.event is not None
        self.event.current_stream_wait()
        hook, self.hook_after_wait = self.hook_after_wait, None
        if hook is not None:
            hook()
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait):
        assert self.hook_after_wait is None, "A hook is already registered on this `EventOverlap`"
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle=False):
        """``with event(release_handle=True):``: the same object, set to drop its event on exit."""
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False
