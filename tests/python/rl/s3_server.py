"""A real S3-compatible server for the checkpoint tests (test_checkpoint.py): s3rver (the npm
package, pinned by s3/package-lock.json beside this file and installed by scripts/install-deps.sh
with ``npm ci``) run by node as a child process on loopback, so S3Store
(proxyep/rl/train/object_store.py) is exercised against an actual HTTP S3 API rather than a mock.

``S3Server(directory, port=0, buckets=("proxyep",))`` starts it (port 0: a free port, which
s3rver reports on its first output line), waits (with a deadline) until it answers HTTP, and
exposes ``endpoint_url`` and ``client_options`` (s3rver's fixed credentials S3RVER/S3RVER) for
``S3Store(bucket, prefix, **server.client_options)``. ``stop()`` (SIGTERM, then SIGKILL after a
grace period) and ``kill()`` act on the child's pid only. A context manager.
"""

import collections
import http.client
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

ACCESS_KEY = SECRET_KEY = "S3RVER"  # the credentials s3rver accepts
_LISTENING = re.compile(r"S3rver listening on (\S+):(\d+)")


class S3ServerError(RuntimeError):
    """s3rver could not be found, did not start, or stopped answering."""


def default_cli():
    """s3rver's CLI as ``npm ci --prefix tests/python/rl/s3`` installs it ($PROXYEP_RL_S3RVER
    overrides), or None when it is not installed."""
    override = os.environ.get("PROXYEP_RL_S3RVER")
    if override:
        return override if os.path.exists(override) else None
    # This file is tests/python/rl/s3_server.py, beside the npm project s3/.
    cli = Path(__file__).resolve().parent / "s3" / "node_modules" / ".bin" / "s3rver"
    return str(cli) if cli.exists() else None


class S3Server:
    """s3rver serving ``directory`` on ``host``:``port`` (0: a free one) with ``buckets`` created
    at startup. Raises S3ServerError (with the server's output) if it does not answer within
    ``startup_timeout_s``, after killing it."""

    def __init__(self, directory, port=0, buckets=("proxyep",), host="127.0.0.1", cli=None, node=None,
                 startup_timeout_s=60.0):
        self.directory = os.path.abspath(os.fspath(directory))
        self.host = host
        cli = cli or default_cli()
        if cli is None:
            raise S3ServerError("s3rver is not installed (run scripts/install-deps.sh, which runs "
                                "npm ci --prefix tests/python/rl/s3)")
        node = node or shutil.which("node")
        if node is None:
            raise S3ServerError("node is not in PATH (scripts/install-deps.sh installs nodejs)")
        os.makedirs(self.directory, exist_ok=True)
        command = [node, os.path.realpath(cli), "--directory", self.directory, "--address", host,
                   "--port", str(port), "--silent"]
        # If this process dies without stop() (a test runner killed on timeout), the kernel sends
        # the server SIGKILL instead of leaving it orphaned. setpriv (util-linux) sets that and
        # execs node, so the pid stays node's. Tied to the thread that starts the server: start it
        # from a thread that outlives it.
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            command = [setpriv, "--pdeathsig", "KILL", "--"] + command
        for bucket in buckets:
            command += ["--configure-bucket", bucket]
        self._output = collections.deque(maxlen=200)  # s3rver's last lines, for error messages
        self._listening = threading.Event()
        self.port = None
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
        self.pid = self._process.pid
        # Drains the pipe for the server's whole life (a full pipe would block it) and spots the
        # line that reports the bound port.
        self._reader = threading.Thread(target=self._read_output, name=f"s3rver-{self.pid}", daemon=True)
        self._reader.start()
        try:
            self._wait_ready(startup_timeout_s)
        except BaseException:
            self.kill()
            raise

    def _read_output(self):
        for line in self._process.stdout:
            self._output.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and self.port is None:
                self.port = int(match.group(2))
                self._listening.set()
        self._listening.set()  # EOF: the process ended; the waiter looks at why

    def _wait_ready(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        if not self._listening.wait(timeout_s) or self.port is None:
            if self._listening.is_set():  # its output ended: it is exiting; collect the status
                try:
                    self._process.wait(max(0.0, min(10.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
            raise S3ServerError(self._why("did not report its port", timeout_s))
        # It printed its port once listening; one HTTP exchange proves it serves requests.
        last = None
        while time.monotonic() < deadline and self._process.poll() is None:
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=max(1.0, deadline - time.monotonic()))
                try:
                    conn.request("GET", "/")
                    conn.getresponse().read()
                    return
                finally:
                    conn.close()
            except OSError as e:
                last = e
                # The socket is listening already; a refused connection here is transient.
                time.sleep(0.05)
        raise S3ServerError(self._why(f"did not answer HTTP on port {self.port} ({last})", timeout_s))

    def _why(self, what, timeout_s):
        code = self._process.poll()
        state = f"exited with {code}" if code is not None else f"still running after {timeout_s:.0f} s"
        tail = "\n".join(list(self._output)[-20:])
        return f"s3rver (pid {self.pid}) {what}; {state}; output:\n{tail}"

    @property
    def endpoint_url(self):
        return f"http://{self.host}:{self.port}"

    @property
    def client_options(self):
        """Keyword arguments for S3Store / boto3.client reaching this server."""
        return {"endpoint_url": self.endpoint_url, "aws_access_key_id": ACCESS_KEY,
                "aws_secret_access_key": SECRET_KEY, "region_name": "us-east-1"}

    def running(self):
        return self._process.poll() is None

    def stop(self, timeout_s=10.0):
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; returns the exit code."""
        if self._process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                return self._finish(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def kill(self, timeout_s=10.0):
        """SIGKILL; returns the exit code."""
        if self._process.poll() is None:
            self._signal(signal.SIGKILL)
        return self._finish(timeout_s)

    def _signal(self, sig):
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def _finish(self, timeout_s):
        code = self._process.wait(timeout_s)
        self._reader.join(timeout_s)
        if not self._reader.is_alive():  # never close the pipe under a reading thread
            self._process.stdout.close()
        return code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
