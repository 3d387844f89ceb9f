"""The control channel of weight publication: JSON messages over multiprocessing.connection
on TCP, authenticated with a shared key (the HMAC challenge of multiprocessing.connection, both
ways). The bulk bytes never go here: they move over the fabric (RmaSender/RmaReceiver); this
channel carries the handshake, the manifests and the two-phase stage/commit votes.

Every read and write has a deadline: reads wait with ``Connection.poll(timeout)``, and the
socket's SO_RCVTIMEO/SO_SNDTIMEO bound each system call, so a peer that stops half way through a
message (or a stranger that connects and never speaks) costs a timeout, never a hang.
"""

import json
import multiprocessing.connection as mpc
import socket
import struct

from .manifest import WeightError

MAX_MESSAGE = 256 << 20  # a manifest of a very large model is still far below this


def _bound_syscalls(sock, timeout_s):
    tv = struct.pack("ll", int(timeout_s), int((timeout_s % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _connection(sock, timeout_s):
    sock.settimeout(None)  # blocking fd: multiprocessing reads it with os.read
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _bound_syscalls(sock, timeout_s)
    return mpc.Connection(sock.detach())


def listen(host, port):
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


def accept(sock, authkey, timeout_s):
    """The authenticated connection of a socket ``sock.accept()`` gave (closes it on failure)."""
    conn = _connection(sock, timeout_s)
    try:
        mpc.deliver_challenge(conn, authkey)  # its read of the answer is bounded by SO_RCVTIMEO
        if not conn.poll(timeout_s):
            raise WeightError(f"weights.join: the peer did not answer the challenge within {timeout_s} s")
        mpc.answer_challenge(conn, authkey)
    except mpc.AuthenticationError as e:
        conn.close()
        raise WeightError(f"weights.join: authentication failed: {e}") from None
    except (OSError, EOFError) as e:
        conn.close()
        raise WeightError(f"weights.join: handshake failed: {e}") from None
    except WeightError:
        conn.close()
        raise
    return conn


class PublisherUnreachable(WeightError):
    """Nothing accepted the connection: the publisher is not up (yet), as opposed to one that
    answered and refused; a worker that starts before the trainer retries only this."""


def dial(address, authkey, timeout_s):
    """An authenticated connection to the publisher at ``address`` (host, port)."""
    host, port = address
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as e:
        raise PublisherUnreachable(f"weights.join: cannot reach the publisher at {host}:{port}: {e}") from None
    conn = _connection(sock, timeout_s)
    try:
        if not conn.poll(timeout_s):
            raise WeightError(f"weights.join: the publisher at {host}:{port} sent no challenge within {timeout_s} s")
        mpc.answer_challenge(conn, authkey)
        mpc.deliver_challenge(conn, authkey)
    except mpc.AuthenticationError as e:
        conn.close()
        raise WeightError(f"weights.join: the publisher at {host}:{port} refused the key: {e}") from None
    except (OSError, EOFError) as e:
        conn.close()
        raise WeightError(f"weights.join: handshake with the publisher at {host}:{port} failed: {e}") from None
    except WeightError:
        conn.close()
        raise
    return conn


class PeerGone(WeightError):
    """The other end closed the connection or it broke."""


def send(conn, message, phase, peer):
    try:
        conn.send_bytes(json.dumps(message).encode())
    except (OSError, ValueError) as e:
        raise PeerGone(f"{phase}: cannot send to {peer}: {e}") from None


def recv(conn, timeout_s, phase, peer):
    """The next message (a dict with "op"); PeerGone on EOF, WeightError on timeout."""
    try:
        if not conn.poll(timeout_s):
            raise WeightError(f"{phase}: no message from {peer} within {timeout_s:.1f} s")
        raw = conn.recv_bytes(MAX_MESSAGE)
    except (EOFError, OSError) as e:
        raise PeerGone(f"{phase}: {peer} closed the connection ({type(e).__name__}: {e})") from None
    try:
        message = json.loads(raw)
    except ValueError as e:
        raise WeightError(f"{phase}: {peer} sent a message that is not JSON: {e}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise WeightError(f"{phase}: {peer} sent a message without an op: {str(message)[:200]}")
    return message
