"""A rank waiting in the Buffer's rendezvous gives Python's signal handlers their turn: Ctrl-C
(KeyboardInterrupt) and a SIGTERM handler that exits end the wait within a second, instead of at
bootstrap.timeout_ms (60 s here). Rank 1 of a world whose rank 0 never comes, and rank 0 of a
world whose rank 1 never comes, each in a child process built directly on the native module (no
torch.distributed group: nobody else joins). Run with plain pytest, not under `proxyep launch`."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

CHILD = r"""
import signal, sys
from proxyep import _proxyep
if sys.argv[2] == "exit_on_term":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
g = _proxyep.GroupRendezvous()
g.master_addr, g.master_port = "127.0.0.1", int(sys.argv[3])
g.rank, g.world_size, g.ranks_per_node = int(sys.argv[1]), 2, 1
g.job_id, g.secret = "signals-test", b""
try:
    print("waiting", flush=True)
    _proxyep.Buffer(g, _proxyep.BufferOptions(num_nvl_bytes=1 << 20, num_rdma_bytes=1 << 20,
                                              num_qps_per_rank=1, explicitly_destroy=True))
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(5)
print("joined?!", flush=True)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("how", ["sigint", "exit_on_term"])
def test_signal_ends_the_rendezvous_wait(rank, how):
    env = dict(os.environ, PROXYEP_BOOTSTRAP_TIMEOUT_MS="60000")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(rank), how, str(free_port())],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # inside the native wait by now
        sent = time.monotonic()
        child.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
        out, err = child.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    expected = 5 if how == "sigint" else 7
    assert child.returncode == expected, (child.returncode, out, err)
    assert took < 2.0, f"the rank took {took:.2f} s to act on the signal"
