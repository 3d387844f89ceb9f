"""A private redis-server (Debian's /usr/bin/redis-server) as a child process on loopback: the
Redis coordinator's store for tests and for ``proxyep rl run``.

The whole configuration is on the command line (no config file to leave behind): ``--port``,
``--bind 127.0.0.1``, ``--dir``, ``--appendonly`` with ``--appendfsync`` (``always``: every write
is on disk before it is acknowledged, what a test that SIGKILLs the server needs; ``everysec``:
at most a second lost), ``--save ""`` (no RDB snapshots: the append-only file is the durable
state). The log goes to ``redis.log`` in ``dir``; its tail is in the error when the server fails
to start.

``stop()`` is SIGTERM (redis flushes the AOF and exits), then SIGKILL after a deadline; ``kill()``
is SIGKILL (a crash, for tests); ``start()`` again runs a new server on the same port and
directory, which reloads the AOF.

``bind``: loopback by default; ``python3 -m proxyep.rl coordinator`` (roles/coordinator.py) binds
another address for a cluster, and then turns redis's protected mode off (which otherwise
refuses every non-loopback client of a server without a password): the network around it (a
Kubernetes Service, a NetworkPolicy) decides who reaches it. ``advertise``: the host name in
``url`` (default: the bind address, or 127.0.0.1 for a wildcard bind).
"""

import os
import signal
import socket
import subprocess
import time

from .protocol import RLError

REDIS_SERVER = "/usr/bin/redis-server"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOOPBACK = "127.0.0.1"
_WILDCARDS = ("0.0.0.0", "::", "*")


def _command(port, command, timeout_s, host=LOOPBACK):
    """One inline command's reply (bytes), or None when nothing answers on the port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(command + b"\r\n")
            reply = s.recv(65536)
            if reply.startswith(b"$"):  # a bulk string: read all of it
                size = int(reply[1:reply.index(b"\r\n")])
                while len(reply) < reply.index(b"\r\n") + 2 + size:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
            return reply
    except (OSError, ValueError):
        return None


def _answers(port, pid, timeout_s, host=LOOPBACK):
    """True when the server on ``port`` is the process ``pid`` (not another one that holds the
    port) and answers PING (not while it is still loading the AOF)."""
    info = _command(port, b"INFO server", timeout_s, host)
    if info is None or f"process_id:{pid}\r\n".encode() not in info:
        return False
    return (_command(port, b"PING", timeout_s, host) or b"").startswith(b"+PONG")


class RedisServer:
    def __init__(self, dir, port=0, appendonly=True, appendfsync="everysec", executable=REDIS_SERVER,
                 start_timeout_s=30.0, stop_timeout_s=10.0, bind=LOOPBACK, advertise=None):
        if appendfsync not in ("always", "everysec", "no"):
            raise RLError(f"appendfsync must be always, everysec or no, got {appendfsync!r}")
        if not os.path.isdir(dir):
            raise RLError(f"redis server: directory {dir!r} does not exist")
        if not os.access(executable, os.X_OK):
            raise RLError(f"redis server: {executable} is not installed (Debian package redis-server)")
        self.dir, self.appendonly, self.appendfsync = os.path.abspath(dir), appendonly, appendfsync
        self.executable, self.start_timeout_s, self.stop_timeout_s = executable, start_timeout_s, stop_timeout_s
        self._fixed_port = port
        self.bind = bind
        # Where this process checks the server: a wildcard bind includes loopback.
        self._probe_host = LOOPBACK if bind in _WILDCARDS else bind
        self.advertise = advertise or self._probe_host
        self.port = None
        self.process = None
        self.start()

    @property
    def url(self):
        return f"redis://{self.advertise}:{self.port}/0"

    @property
    def log_path(self):
        return os.path.join(self.dir, "redis.log")

    def _log_tail(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def start(self):
        """Starts the server (on the port it had before, if it ran already) and waits until it
        answers PING; RLError with the log's tail when it does not within start_timeout_s."""
        if self.process is not None and self.process.poll() is None:
            raise RLError(f"redis server on port {self.port} is already running (pid {self.process.pid})")
        # A free port picked here can be taken by someone else before redis binds it: then retry
        # on another (only when the caller did not ask for a port, and not after a first run).
        tries = 3 if not self._fixed_port and self.port is None else 1
        for attempt in range(tries):
            port = self._fixed_port or self.port or _free_port()
            try:
                self._start_on(port)
                self.port = port
                return
            except RLError:
                if attempt == tries - 1:
                    raise

    def _start_on(self, port):
        args = [self.executable, "--port", str(port), "--bind", self.bind, "--dir", self.dir,
                "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
                "--save", "", "--daemonize", "no", "--logfile", self.log_path]
        if self.bind != LOOPBACK:
            args += ["--protected-mode", "no"]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if _answers(port, self.process.pid, 1.0, self._probe_host):
                return
            try:  # waits a little, and returns at once if the server exited
                self.process.wait(0.05)
            except subprocess.TimeoutExpired:
                continue
            raise RLError(f"redis server on port {port} exited with {self.process.returncode} while starting: "
                          f"{self._log_tail()}")
        self.kill()
        raise RLError(f"redis server on port {port}: no PONG within {self.start_timeout_s:g} s: {self._log_tail()}")

    def _signal(self, sig):
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def stop(self):
        """SIGTERM (the AOF is flushed), SIGKILL after stop_timeout_s."""
        if self.process is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        """SIGKILL: a crash (what was not yet on disk is lost, as appendfsync allows)."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        self.process.wait(self.stop_timeout_s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
