"""The RPC service beyond the shared suite: deadlines against a dead or stopped server, the
authentication, concurrent callers on one client, the service's errors being the coordinator's,
and open_coordinator's URLs."""

import json
import os
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

import pytest

from coordinator_fixtures import ServiceProcess, SharedClock, _context, redis_server  # noqa: F401
from proxyep.rl import GroupSpec, GroupState, Progress, ReleaseReason, RLError, SamplingParams, StaleLease
from proxyep.rl.coordinator.memory import MemoryCoordinator
from proxyep.rl.coordinator.open import open_coordinator
from proxyep.rl.coordinator.service import CoordinatorClient, CoordinatorServer


@pytest.fixture
def service():
    ctx = _context()
    s = ServiceProcess(ctx, {}, SharedClock(ctx))
    yield s
    if s.process.is_alive():
        os.kill(s.process.pid, signal.SIGCONT)  # in case a test left it stopped
    s.stop()


@pytest.fixture
def server():
    s = CoordinatorServer(MemoryCoordinator())
    yield s
    s.close()


def where(address):
    return f"{address[0]}:{address[1]}"


def stop(pid, timeout_s=30):
    """SIGSTOP, and wait until every thread of the process has stopped (the signal is delivered
    asynchronously: a thread running on another core can still answer meanwhile)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass  # a thread that ended meanwhile
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {timeout_s} s")


def test_a_killed_server_gives_an_error_naming_it_and_the_call(service):
    c = CoordinatorClient(service.address, service.authkey, timeout_s=30)
    c.submit(GroupSpec("g", [1], 1))
    service.kill()
    with pytest.raises(RLError, match=f"coordinator at {where(service.address)}: lease: "):
        c.lease("w", 1)
    with pytest.raises(RLError, match=f"coordinator at {where(service.address)}: version: cannot connect"):
        c.version()
    c.close()


def test_a_stopped_server_gives_an_error_within_the_deadline(service):
    c = CoordinatorClient(service.address, service.authkey, timeout_s=1)
    c.submit(GroupSpec("g", [1], 1))
    stop(service.process.pid)
    with pytest.raises(RLError, match=f"{where(service.address)}: lease: no reply within 1 s"):
        c.lease("w", 1)
    fresh = CoordinatorClient(service.address, service.authkey, timeout_s=1)
    with pytest.raises(RLError, match=f"{where(service.address)}: stats: authenticating: no answer"):
        fresh.stats()
    os.kill(service.process.pid, signal.SIGCONT)
    # The connection that timed out was dropped; the next call reconnects and sees the state.
    c.timeout_s = fresh.timeout_s = 30
    assert c.group_state("g") is GroupState.pending and fresh.stats()["submitted"] == 1
    c.close()
    fresh.close()


def test_authentication(server):
    bad = CoordinatorClient(server.address, b"not the key", timeout_s=10)
    with pytest.raises(RLError, match="authentication failed"):
        bad.version()
    good = CoordinatorClient(server.address, server.authkey.hex(), timeout_s=10)
    assert good.version() == 0
    good.close()


def test_a_stalled_peer_delays_nobody(server):
    with socket.create_connection(server.address) as stalled:  # connects, never answers the challenge
        c = CoordinatorClient(server.address, server.authkey, timeout_s=10)
        c.set_version(1)
        assert c.version() == 1
        c.close()
        assert stalled.fileno() >= 0


def test_errors_are_the_coordinators_own(server):
    local = MemoryCoordinator()
    remote = CoordinatorClient(server.address, server.authkey)
    for c in (local, remote):
        c.submit(GroupSpec("g", [1], 1, SamplingParams(max_new_tokens=2)))
    texts = []
    for c in (local, remote):
        [lease] = c.lease("w", 1)
        c.release(lease.lease_id, "w", ReleaseReason.interrupted)
        errors = []
        for call in (lambda: c.complete(lease.lease_id, "w", Progress(), "stop"),
                     lambda: c.complete("L77", "w", Progress(), "stop"),
                     lambda: c.submit(GroupSpec("g", [1], 1)),
                     lambda: c.lease("w", 0),
                     lambda: c.release(lease.lease_id, "w", "vanished")):
            with pytest.raises(RLError) as e:
                call()
            errors.append((type(e.value), str(e.value)))
        texts.append(errors)
    assert texts[0] == texts[1]
    assert texts[0][0][0] is StaleLease
    remote.close()


def test_malformed_requests_are_refused(server):
    sock = socket.create_connection(server.address)
    conn = Connection(sock.detach())
    answer_challenge(conn, server.authkey)
    deliver_challenge(conn, server.authkey)
    for request in (b"not json", json.dumps({"call": "nope", "args": {}}).encode(),
                    json.dumps({"call": "lease", "args": {"worker_id": "w"}}).encode(),
                    json.dumps({"call": "submit", "args": {"group": {"group_id": "g", "bogus": 1}}}).encode()):
        conn.send_bytes(request)
        assert conn.poll(10)
        reply = json.loads(conn.recv_bytes())
        assert reply["error"]["type"] == "RLError", reply
    conn.send_bytes(json.dumps({"call": "version", "args": {}}).encode())
    assert conn.poll(10) and json.loads(conn.recv_bytes()) == {"result": 0}
    conn.close()


def test_one_client_many_threads(server):
    """Rollout workers heartbeat from a thread while the main thread reports and completes."""
    c = CoordinatorClient(server.address, server.authkey)
    threads, errors, per_thread = 8, [], 10
    for t in range(threads):
        c.submit(GroupSpec(f"g{t}", [1], per_thread, SamplingParams(max_new_tokens=4)))

    def work(t):
        try:
            worker = f"w{t}"
            for _ in range(per_thread):
                [lease] = c.lease(worker, 1)
                c.report_partial(lease.lease_id, worker, Progress([t], [0.0], [0]))
                assert c.heartbeat(worker, [lease.lease_id]) == [lease.lease_id]
                c.complete(lease.lease_id, worker, Progress([t, t], [0.0, 0.0], [0, 0]), "length")
        except Exception as e:  # reported below: the assertion runs in the main thread
            errors.append(e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(60)
    assert not errors and not any(th.is_alive() for th in pool)
    done = c.take_completed()
    assert len(done) == threads
    assert all(len(s.output.tokens) == 3 for g in done for s in g.samples)
    s = c.stats()
    assert (s["samples_completed"], s["leases_issued"], s["tokens_reported"]) == (80, 80, 240)
    c.close()


def test_open_coordinator(server, redis_server, monkeypatch):
    m = open_coordinator("memory", lease_timeout_s=5, max_attempts=1)
    assert isinstance(m, MemoryCoordinator)
    server.coordinator.set_version(7)
    assert open_coordinator(f"tcp://{where(server.address)}", authkey=server.authkey).version() == 7
    monkeypatch.setenv("PROXYEP_RL_AUTHKEY", server.authkey.hex())
    assert open_coordinator(f"tcp://{where(server.address)}", timeout_s=5).version() == 7
    monkeypatch.delenv("PROXYEP_RL_AUTHKEY")
    with pytest.raises(RLError, match="PROXYEP_RL_AUTHKEY"):
        open_coordinator(f"tcp://{where(server.address)}")
    r = open_coordinator(redis_server.url, prefix="test:open", lease_timeout_s=5)
    r.submit(GroupSpec("g", [1], 1))
    assert open_coordinator(redis_server.url, prefix="test:open").group_state("g") is GroupState.pending
    assert open_coordinator(redis_server.url, prefix="test:other").stats()["submitted"] == 0
    for url, match in (("http://x:1", "unknown scheme"), ("tcp://nohost", "tcp://host:port"),
                       ("memory", "unknown options")):
        with pytest.raises(RLError, match=match):
            open_coordinator(url, **({"prefix": "p"} if url == "memory" else {"authkey": b"k"}))
    with pytest.raises(RLError, match="lease_timeout_s"):
        open_coordinator("memory", lease_timeout_s=0)
