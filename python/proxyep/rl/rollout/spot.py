"""Telling a rollout worker to stop (docs/RL.md section 3, Spot): a :class:`StopNotice` is set by
SIGTERM (or any signal given) to the process, by a notice file appearing, or by an HTTP endpoint
answering 200: the stand-ins for the cloud's interruption notice (on EC2 the instance-metadata
path ``/latest/meta-data/spot/instance-action`` answers 404 until the two-minute notice, then 200
with the action and its time), which a node agent or the worker itself polls.

The worker checks ``is_set()`` between steps and then drains: it stops leasing, flushes the
tokens it has not reported and releases its leases as ``interrupted`` within its budget.
The notice only records *why*; it never stops anything by itself (no exit from a handler).
"""

import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request

log = logging.getLogger("proxyep.rl.spot")

class StopNotice:
    """``notice_file``: a path whose existence means "stop"; ``notice_url``: polled with GET
    (200: stop; 404 or no answer: not yet); ``poll_s``: how often both are looked at. ``set``
    may also be called directly (e.g. by a node agent in the same process)."""

    def __init__(self, notice_file=None, notice_url=None, poll_s=0.2, http_timeout_s=1.0):
        if poll_s <= 0:
            raise ValueError(f"poll_s must be positive, got {poll_s}")
        self.notice_file, self.notice_url = notice_file, notice_url
        self.poll_s, self.http_timeout_s = poll_s, http_timeout_s
        self._event = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.reason = None
        self.noticed_at = None  # time.monotonic() when first set
        self._previous = {}
        self._thread = None

    def set(self, reason):
        """Records the first reason only (later ones change nothing)."""
        with self._lock:
            if self.reason is None:
                self.reason, self.noticed_at = reason, time.monotonic()
        self._event.set()

    def is_set(self):
        return self._event.is_set()

    def wait(self, timeout):
        """True once set; waits at most ``timeout`` seconds (an idle worker sleeps here, so a
        notice wakes it at once)."""
        return self._event.wait(timeout)

    def install_signals(self, signals=(signal.SIGTERM,)):
        """Handlers that set the notice (main thread only). The process keeps running: it is the
        worker's job to drain and return."""
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, _frame):
        self.set(signal.Signals(signum).name)

    def start(self):
        """Starts polling the file and the URL (if any) from a daemon thread."""
        if (self.notice_file or self.notice_url) and self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="stop-notice", daemon=True)
            self._thread.start()
        return self

    def check_now(self):
        """One look at the file and the URL; sets the notice when either says stop."""
        if self.notice_file and os.path.exists(self.notice_file):
            self.set(f"notice file {self.notice_file}")
        elif self.notice_url and self._url_says_stop():
            self.set(f"notice from {self.notice_url}")
        return self.is_set()

    def _url_says_stop(self):
        try:
            with urllib.request.urlopen(self.notice_url, timeout=self.http_timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            # 404 (no notice yet, an HTTPError) or nothing listening: not a notice.
            return False

    def _poll(self):
        while not self._closed.is_set():
            if self.check_now():
                # Logged here, never from a signal handler (which may interrupt a log call).
                log.warning("stop notice: %s", self.reason)
                return
            self._closed.wait(self.poll_s)

    def close(self):
        """Stops the polling thread and restores the previous signal handlers."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=self.http_timeout_s + self.poll_s + 1)
            self._thread = None
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
