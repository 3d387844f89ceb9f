"""DeepEP's event helpers (``from deep_ep.utils import EventHandle, EventOverlap``, as Megatron
imports them).

On CPU tensors there are no streams: work that ProxyEP finishes on the calling thread is complete
when the call returns, and an ``EventHandle`` made then (``EventHandle()``, ``Buffer.capture()``)
is already complete. A call made with ``async_finish=True`` that ProxyEP finishes in the
background (low-latency mode) returns an ``EventHandle`` over that work: ``current_stream_wait()``
waits for it (the GIL released) and raises the call's error, if any.
"""


class EventHandle:
    """A point in ProxyEP's work; ``current_stream_wait()`` returns once it is reached."""

    def __init__(self, native=None):
        self._native = native  # _proxyep.CallEvent, or None for work already complete

    def current_stream_wait(self):
        native, self._native = self._native, None
        if native is not None:
            native.wait()

    def is_complete(self):
        return self._native is None


class EventOverlap:
    """DeepEP's EventOverlap: an optional event plus tensors to keep alive until it is waited
    for; usable as a context manager (leaving it waits)."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self):
        assert self.event is not None
        self.event.current_stream_wait()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if self.event is not None:
            self.event.current_stream_wait()
