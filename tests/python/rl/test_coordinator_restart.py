"""Restarts around the Redis coordinator: the coordinator (a RedisCoordinator object, and a whole
coordinator process behind the RPC service) replaced mid-run, and the redis-server itself
SIGKILLed and restarted from its append-only file (appendfsync always). Workers keep their lease
ids across every restart and nothing acknowledged is lost. These run on the Redis server's clock
(TIME), with lease timeouts far longer than the tests."""

import os

import pytest

from coordinator_fixtures import ServiceProcess, _context, serve_redis_coordinator
from proxyep.rl import GroupSpec, Progress, RLError, SamplingParams
from proxyep.rl.coordinator.redis import RedisCoordinator
from proxyep.rl.coordinator.redis_server import RedisServer
from proxyep.rl.coordinator.service import CoordinatorClient


def prog(tokens):
    return Progress(list(tokens), [-t / 16 for t in tokens], [0] * len(tokens))


def submit_all(c, groups=4, samples=2):
    for g in range(groups):
        c.submit(GroupSpec(f"g{g}", [g + 1], samples, SamplingParams(max_new_tokens=4), metadata={"g": g}))


def out(lease):
    """The tokens a sample ends with (its first two reported before the restart, then two more)."""
    base = 10 * int(lease.group_id[1:]) + lease.sample_index
    return [base, base + 1, base + 2, base + 3]


@pytest.fixture
def server(tmp_path):
    s = RedisServer(str(tmp_path), appendfsync="always")
    yield s
    s.stop()


def check_everything_done(c, groups=4, samples=2):
    done = c.take_completed()
    assert [g.spec.group_id for g in done] == [f"g{g}" for g in range(groups)]
    for g in done:
        assert g.spec.metadata == {"g": int(g.spec.group_id[1:])}
        for s in g.samples:
            base = 10 * int(g.spec.group_id[1:]) + s.sample_index
            assert s.output == prog([base, base + 1, base + 2, base + 3]) and s.attempts == 1
    stats = c.stats()
    assert (stats["completed_groups"], stats["samples_completed"], stats["leases_issued"]) == (
        groups, groups * samples, groups * samples)
    assert (stats["expired"], stats["requeued"], stats["running"], stats["queued"]) == (0, 0, 0, 0)
    assert stats["tokens_reported"] == groups * samples * 4


def test_a_new_coordinator_object_continues(server):
    old = RedisCoordinator(server.url, prefix="run")
    submit_all(old)
    old.set_version(3)
    leases = old.lease("w", 8)
    for lease in leases:
        old.report_partial(lease.lease_id, "w", prog(out(lease)[:2]))
    for lease in leases[:3]:
        old.complete(lease.lease_id, "w", prog(out(lease)[2:]), "length")
    del old  # dropped mid-run, never closed

    new = RedisCoordinator(server.url, prefix="run")
    assert new.version() == 3 and new.stats()["running"] == 5
    assert new.heartbeat("w", [l.lease_id for l in leases]) == [l.lease_id for l in leases[3:]]
    for lease in leases[3:]:
        new.complete(lease.lease_id, "w", prog(out(lease)[2:]), "length")
    assert new.lease("w", 1) == []
    check_everything_done(new)
    new.close()


def test_a_restarted_coordinator_process_continues(server):
    """The coordinator process (RedisCoordinator behind the RPC service) SIGKILLed and replaced:
    the worker's client reaches the new one with the same lease ids."""
    ctx = _context()
    first = ServiceProcess(ctx, target=serve_redis_coordinator, args=(server.url, "svc"))
    c = CoordinatorClient(first.address, first.authkey, timeout_s=30)
    submit_all(c)
    leases = c.lease("w", 8)
    for lease in leases:
        c.report_partial(lease.lease_id, "w", prog(out(lease)[:2]))
    c.complete(leases[0].lease_id, "w", prog(out(leases[0])[2:]), "length")
    first.kill()
    with pytest.raises(RLError, match=f"{first.address[1]}: complete"):
        c.complete(leases[1].lease_id, "w", prog(out(leases[1])[2:]), "length")

    second = ServiceProcess(ctx, target=serve_redis_coordinator, args=(server.url, "svc"))
    try:
        c2 = CoordinatorClient(second.address, second.authkey, timeout_s=30)
        for lease in leases[1:]:
            c2.complete(lease.lease_id, "w", prog(out(lease)[2:]), "length")
        check_everything_done(c2)
        c2.close()
    finally:
        second.stop()
    c.close()


def test_a_killed_redis_server_loses_nothing_acknowledged(server):
    c = RedisCoordinator(server.url, prefix="crash", timeout_s=10)
    submit_all(c)
    leases = c.lease("w", 8)
    for lease in leases:
        c.report_partial(lease.lease_id, "w", prog(out(lease)[:2]))
    for lease in leases[:5]:
        c.complete(lease.lease_id, "w", prog(out(lease)[2:]), "length")
    before = c.snapshot()

    server.kill()  # SIGKILL: only what the AOF has survives
    with pytest.raises(RLError, match=f"redis coordinator at {server.url} \\(prefix crash\\): stats"):
        c.stats()
    server.start()

    assert c.snapshot() == before  # the same client reconnects; every acknowledged call is there
    assert c.heartbeat("w", [l.lease_id for l in leases]) == [l.lease_id for l in leases[5:]]
    for lease in leases[5:]:
        c.complete(lease.lease_id, "w", prog(out(lease)[2:]), "length")
    server.stop()  # and a clean stop and start keeps it too
    server.start()
    check_everything_done(RedisCoordinator(server.url, prefix="crash"))
    c.close()


def test_without_the_append_only_file_a_crash_loses_the_state(tmp_path):
    """The control for the test above: the same crash with appendonly off loses everything."""
    server = RedisServer(str(tmp_path), appendonly=False)
    try:
        c = RedisCoordinator(server.url, prefix="crash")
        submit_all(c)
        server.kill()
        server.start()
        assert c.stats()["submitted"] == 0
        with pytest.raises(RLError, match="unknown group"):
            c.group_state("g0")
        c.close()
    finally:
        server.stop()


def test_redis_server_lifecycle(tmp_path):
    server = RedisServer(str(tmp_path))
    try:
        with pytest.raises(RLError, match="already running"):
            server.start()
        with pytest.raises(RLError, match=f"port {server.port}"):
            RedisServer(str(tmp_path), port=server.port)  # the port is taken: it cannot start
        pid = server.process.pid
        server.stop()
        assert server.process.returncode == 0  # SIGTERM: a clean exit
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        server.start()
        assert RedisCoordinator(server.url).version() == 0
    finally:
        server.stop()
    with pytest.raises(RLError, match="does not exist"):
        RedisServer(str(tmp_path / "missing"))
