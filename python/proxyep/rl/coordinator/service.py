"""Any Coordinator served to other processes (rollout workers reach the embedded one this way).

Transport: ``multiprocessing.connection`` framing over TCP with its HMAC challenge in both
directions (``authkey``: 32 random bytes from ``secrets`` unless given). Each message is one JSON
document, never a pickle, so an authenticated peer still cannot make the other side run code:
a request ``{"call": name, "args": {...}}`` with the protocol's values as their ``to_dict`` forms,
a reply ``{"result": ...}`` or ``{"error": {"type": "StaleLease", "message": ...}}``, raised on
the client as the same RLError subclass with the same text.

Deadlines: the server gives a connecting peer ``handshake_timeout_s`` to authenticate (a thread
per connection, so a stalled peer delays nobody). The client bounds every call by ``timeout_s``:
connecting and authenticating, sending (SO_SNDTIMEO) and waiting for the reply (poll, then
SO_RCVTIMEO for the rest of a message). A call that fails on the connection raises RLError naming
the coordinator's address and the call, and drops the connection; the next call reconnects. A
call is never retried by the client: whether a lost ``complete`` was applied is unknowable, and
a retry of one that was would be refused as stale anyway.
"""

import json
import os
import secrets
import socket
import struct
import threading
import time
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge

from .interface import Coordinator
from .protocol import CompletedGroup, GroupSpec, GroupState, Lease, Progress, ReleaseReason, RLError, StaleLease, \
    UnknownLease

_ERRORS = {cls.__name__: cls for cls in (RLError, StaleLease, UnknownLease)}


def _set_timeouts(sock, seconds):
    """Bounds each blocking read/write on the socket (also through the Connection's os.read on
    a dup of its descriptor); 0: no bound."""
    usec = max(int(seconds * 1e6), 1) if seconds else 0
    tv = struct.pack("ll", usec // 1000000, usec % 1000000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _authkey(authkey):
    if isinstance(authkey, str):
        try:
            return bytes.fromhex(authkey)
        except ValueError:
            raise RLError("authkey must be bytes or a hex string") from None
    if not isinstance(authkey, bytes) or not authkey:
        raise RLError("authkey must be non-empty bytes or a hex string")
    return authkey


def _address(address):
    """(host, port) from a tuple or "host:port"."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise RLError(f"coordinator address must be host:port, got {address!r}")
        address = (host, int(port))
    if not (isinstance(address, (tuple, list)) and len(address) == 2 and isinstance(address[0], str)
            and isinstance(address[1], int) and 0 < address[1] < 65536):
        raise RLError(f"coordinator address must be (host, port), got {address!r}")
    return (address[0], address[1])


# ---- server ---------------------------------------------------------------------------------------

def _dispatch(coordinator, call, args):
    """Runs one decoded request on ``coordinator``; returns the JSON-able result."""
    c = coordinator
    if call == "submit":
        return c.submit(GroupSpec.from_dict(args["group"]))
    if call == "lease":
        return [lease.to_dict() for lease in c.lease(args["worker_id"], args["capacity"])]
    if call == "heartbeat":
        return c.heartbeat(args["worker_id"], args["lease_ids"])
    if call == "report_partial":
        return c.report_partial(args["lease_id"], args["worker_id"], Progress.from_dict(args["progress"]))
    if call == "complete":
        return c.complete(args["lease_id"], args["worker_id"], Progress.from_dict(args["progress"]),
                          args["finish_reason"])
    if call == "release":
        progress = None if args["progress"] is None else Progress.from_dict(args["progress"])
        return c.release(args["lease_id"], args["worker_id"], args["reason"], progress)
    if call == "abort":
        return c.abort(args["group_id"])
    if call == "reap":
        return c.reap()
    if call == "take_completed":
        return [g.to_dict() for g in c.take_completed(args["max_groups"])]
    if call == "group_state":
        return c.group_state(args["group_id"]).value
    if call == "set_version":
        return c.set_version(args["version"])
    if call == "version":
        return c.version()
    if call == "stats":
        return c.stats()
    if call == "snapshot":
        return c.snapshot()
    if call == "restore":
        return c.restore(args["state"])
    raise RLError(f"unknown call {call!r}")


class CoordinatorServer:
    """Serves ``coordinator`` on ``host:port`` (0: a free port) until ``close()``; a thread per
    connection. ``.address`` (host, port) and ``.authkey`` (bytes) are what clients need. The
    coordinator is not closed with the server (its owner closes it)."""

    def __init__(self, coordinator, host="127.0.0.1", port=0, authkey=None, handshake_timeout_s=10.0):
        if not isinstance(coordinator, Coordinator):
            raise RLError(f"CoordinatorServer serves a Coordinator, got {type(coordinator).__name__}")
        self.coordinator = coordinator
        self.authkey = secrets.token_bytes(32) if authkey is None else _authkey(authkey)
        self._handshake_timeout = float(handshake_timeout_s)
        self._listener = socket.create_server((host, port))
        self.address = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._closed = False
        self._peers = {}  # thread -> socket, for close()
        self._accepter = threading.Thread(target=self._accept_loop, name=f"coordinator-server:{self.address[1]}",
                                          daemon=True)
        self._accepter.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _accept_loop(self):
        while True:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return  # the listener was shut down by close()
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True,
                                      name=f"coordinator-peer:{peer[0]}:{peer[1]}")
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._peers[thread] = sock
            thread.start()

    def _serve(self, sock):
        conn = None
        try:
            _set_timeouts(sock, self._handshake_timeout)
            conn = Connection(os.dup(sock.fileno()))
            try:
                deliver_challenge(conn, self.authkey)
                answer_challenge(conn, self.authkey)
            except (AuthenticationError, OSError, EOFError, AssertionError):
                return  # a peer without the key, or one that stalled: dropped
            _set_timeouts(sock, 0)  # an idle client may wait any time between calls
            while True:
                try:
                    request = conn.recv_bytes()
                except (OSError, EOFError):
                    return
                reply = self._handle(request)
                try:
                    conn.send_bytes(reply)
                except OSError:
                    return
        finally:
            if conn is not None:
                conn.close()
            sock.close()
            with self._lock:
                self._peers.pop(threading.current_thread(), None)

    def _handle(self, request):
        try:
            try:
                message = json.loads(request)
                call, args = message["call"], message["args"]
                if not isinstance(call, str) or not isinstance(args, dict):
                    raise RLError("malformed request")
            except (ValueError, KeyError, TypeError) as e:
                raise RLError(f"malformed request ({e})") from e
            try:
                result = _dispatch(self.coordinator, call, args)
            except RLError:
                raise
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                # Arguments of the wrong shape: refused before the coordinator changed anything.
                raise RLError(f"{call}: bad arguments ({type(e).__name__}: {e})") from e
            return json.dumps({"result": result}).encode()
        except RLError as e:
            return json.dumps({"error": {"type": type(e).__name__, "message": str(e)}}).encode()
        except Exception as e:  # a fault in the coordinator itself: the client gets its text
            return json.dumps({"error": {"type": "RLError",
                                         "message": f"coordinator failed: {type(e).__name__}: {e}"}}).encode()

    def close(self, timeout_s=10.0):
        """Stops accepting, disconnects every client and waits (bounded) for their threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            peers = dict(self._peers)
        for sock in [self._listener] + list(peers.values()):
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept()/recv() on Linux
            except OSError:
                pass
        self._listener.close()
        deadline = time.monotonic() + timeout_s
        for thread in [self._accepter] + list(peers):
            thread.join(max(0.0, deadline - time.monotonic()))


# ---- client ---------------------------------------------------------------------------------------

class CoordinatorClient(Coordinator):
    """``Coordinator`` by RPC to a CoordinatorServer at ``address`` ((host, port) or "host:port").
    Safe to call from several threads (one connection, one call at a time). ``timeout_s`` (an
    attribute too) bounds each call."""

    def __init__(self, address, authkey, timeout_s=10.0):
        self.address = _address(address)
        self._authkey = _authkey(authkey)
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise RLError(f"timeout_s must be positive, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._conn = None
        self._sock = None

    def _where(self):
        return f"coordinator at {self.address[0]}:{self.address[1]}"

    def _drop(self):
        if self._conn is not None:
            self._conn.close()
            self._sock.close()
        self._conn = self._sock = None

    def _connect(self, call, deadline):
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection(self.address, timeout=max(remaining, 0.001))
        except OSError as e:
            raise RLError(f"{self._where()}: {call}: cannot connect ({e})") from e
        sock.settimeout(None)
        _set_timeouts(sock, max(deadline - time.monotonic(), 0.001))
        conn = Connection(os.dup(sock.fileno()))
        try:
            answer_challenge(conn, self._authkey)
            deliver_challenge(conn, self._authkey)
        except AuthenticationError as e:
            conn.close()
            sock.close()
            raise RLError(f"{self._where()}: {call}: authentication failed ({e}; wrong authkey?)") from e
        except (OSError, EOFError, AssertionError) as e:
            conn.close()
            sock.close()
            what = "no answer within the deadline" if isinstance(e, BlockingIOError) else f"connection lost ({e!r})"
            raise RLError(f"{self._where()}: {call}: authenticating: {what}") from e
        _set_timeouts(sock, self.timeout_s)
        self._conn, self._sock = conn, sock

    def _call(self, call, **args):
        try:
            request = json.dumps({"call": call, "args": args}).encode()
        except (TypeError, ValueError) as e:
            raise RLError(f"{call}: arguments are not JSON-serialisable ({e})") from e
        with self._lock:
            deadline = time.monotonic() + self.timeout_s
            if self._conn is not None and self._conn.poll(0):
                self._drop()  # the server never speaks first: this is EOF from a closed peer
            if self._conn is None:
                self._connect(call, deadline)
            try:
                self._conn.send_bytes(request)
                if not self._conn.poll(max(0.0, deadline - time.monotonic())):
                    self._drop()
                    raise RLError(f"{self._where()}: {call}: no reply within {self.timeout_s:g} s")
                reply = self._conn.recv_bytes()
            except BlockingIOError as e:
                self._drop()
                raise RLError(f"{self._where()}: {call}: no reply within {self.timeout_s:g} s") from e
            except (OSError, EOFError) as e:
                self._drop()
                raise RLError(f"{self._where()}: {call}: connection lost ({e!r})") from e
        reply = json.loads(reply)
        if "error" in reply:
            raise _ERRORS.get(reply["error"]["type"], RLError)(reply["error"]["message"])
        return reply["result"]

    # -- the interface: protocol values as their dicts --

    def submit(self, group):
        if not isinstance(group, GroupSpec):
            raise RLError(f"submit takes a GroupSpec, got {type(group).__name__}")
        self._call("submit", group=group.to_dict())

    def lease(self, worker_id, capacity):
        return [Lease.from_dict(d) for d in self._call("lease", worker_id=worker_id, capacity=capacity)]

    def heartbeat(self, worker_id, lease_ids):
        return self._call("heartbeat", worker_id=worker_id,
                          lease_ids=list(lease_ids) if isinstance(lease_ids, (list, tuple)) else lease_ids)

    @staticmethod
    def _progress(progress):
        if not isinstance(progress, Progress):
            raise RLError(f"progress must be a Progress, got {type(progress).__name__}")
        return progress.to_dict()

    def report_partial(self, lease_id, worker_id, progress):
        self._call("report_partial", lease_id=lease_id, worker_id=worker_id, progress=self._progress(progress))

    def complete(self, lease_id, worker_id, progress, finish_reason):
        self._call("complete", lease_id=lease_id, worker_id=worker_id, progress=self._progress(progress),
                   finish_reason=finish_reason)

    def release(self, lease_id, worker_id, reason, progress=None):
        if isinstance(reason, ReleaseReason):
            reason = reason.value
        self._call("release", lease_id=lease_id, worker_id=worker_id, reason=reason,
                   progress=None if progress is None else self._progress(progress))

    def abort(self, group_id=None):
        return self._call("abort", group_id=group_id)

    def reap(self):
        return self._call("reap")

    def take_completed(self, max_groups=None):
        return [CompletedGroup.from_dict(d) for d in self._call("take_completed", max_groups=max_groups)]

    def group_state(self, group_id):
        return GroupState(self._call("group_state", group_id=group_id))

    def set_version(self, version):
        self._call("set_version", version=version)

    def version(self):
        return self._call("version")

    def stats(self):
        return self._call("stats")

    def snapshot(self):
        return self._call("snapshot")

    def restore(self, state):
        self._call("restore", state=state)

    def close(self):
        with self._lock:
            self._drop()
