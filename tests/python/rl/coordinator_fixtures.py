"""Shared fixtures of the coordinator tests: one suite runs against every way of holding the
state: ``memory`` (MemoryCoordinator in this process), ``redis`` (RedisCoordinator on a real
redis-server the fixture starts in a temporary directory) and ``service`` (a MemoryCoordinator
in another process, reached through CoordinatorServer/CoordinatorClient).

Time is injected: each coordinator reads a clock the test advances, so lease expiry is driven
without sleeping. The service's coordinator lives in another process, so its clock is a
shared-memory double (multiprocessing.Value) the test writes.
"""

import multiprocessing
import os
import uuid

import pytest

from proxyep.rl.coordinator.memory import MemoryCoordinator
from proxyep.rl.coordinator.service import CoordinatorClient, CoordinatorServer

STORES = ("memory", "redis", "service")
START = 1_700_000_000.0  # the clock's start (seconds since the epoch, as a real clock)


def _context():
    # forkserver: children forked from a clean server that imported the package once (not from
    # this process with its threads, and without a fresh interpreter's seconds of imports each).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["proxyep.rl.coordinator.service", "coordinator_fixtures"])
    return ctx


class FakeClock:
    def __init__(self, t=START):
        self.t = t

    def __call__(self):
        return self.t

    def advance(self, dt):
        self.t += dt


class SharedClock:
    """A clock in shared memory, read by a coordinator in another process."""

    def __init__(self, ctx, t=START):
        self.value = ctx.Value("d", t, lock=False)

    def __call__(self):
        return self.value.value

    def advance(self, dt):
        self.value.value += dt


def serve_memory_coordinator(options, clock_value, pipe):
    """The service process: a MemoryCoordinator on the shared clock behind a CoordinatorServer,
    until the test says stop (or goes away)."""
    coordinator = MemoryCoordinator(clock=lambda: clock_value.value, **options)
    server = CoordinatorServer(coordinator)
    pipe.send((server.address, server.authkey))
    try:
        pipe.recv()
    except EOFError:
        pass
    server.close()


def serve_redis_coordinator(url, prefix, pipe):
    """A coordinator process on Redis (the server's clock) behind a CoordinatorServer."""
    from proxyep.rl.coordinator.redis import RedisCoordinator
    coordinator = RedisCoordinator(url, prefix=prefix)
    server = CoordinatorServer(coordinator)
    pipe.send((server.address, server.authkey))
    try:
        pipe.recv()
    except EOFError:
        pass
    server.close()
    coordinator.close()


class ServiceProcess:
    """A coordinator service in a child process: a MemoryCoordinator on ``clock`` (a
    SharedClock), or ``target(*args, pipe)``."""

    def __init__(self, ctx, options=None, clock=None, target=None, args=()):
        self.pipe, child = ctx.Pipe()
        if target is None:
            target, args = serve_memory_coordinator, (options, clock.value)
        self.process = ctx.Process(target=target, args=tuple(args) + (child,), daemon=True)
        self.process.start()
        child.close()
        if not self.pipe.poll(60):
            self.kill()
            raise RuntimeError("service process: no address within 60 s")
        self.address, self.authkey = self.pipe.recv()

    def stop(self):
        try:
            self.pipe.send("stop")
        except OSError:
            pass
        self.process.join(20)
        if self.process.is_alive():
            self.kill()

    def kill(self):
        if self.process.is_alive():
            os.kill(self.process.pid, 9)
        self.process.join(20)


class Stores:
    """Makes coordinators of any kind; closes them (and stops their servers) at teardown."""

    def __init__(self, kind, redis_url):
        self.kind, self.redis_url = kind, redis_url
        self._ctx = _context() if kind == "service" else None
        self.clock = SharedClock(self._ctx) if kind == "service" else FakeClock()
        self._opened, self._services = [], []

    def make(self, kind=None, **options):
        kind = kind or self.kind
        if kind == "memory":
            c = MemoryCoordinator(clock=self.clock, **options)
        elif kind == "redis":
            from proxyep.rl.coordinator.redis import RedisCoordinator
            c = RedisCoordinator(self.redis_url, prefix=f"test:{uuid.uuid4().hex}", clock=self.clock, **options)
            c.options = options
        elif kind == "service":
            if self._ctx is None:
                raise ValueError("service coordinators need the service fixture (a shared clock)")
            service = ServiceProcess(self._ctx, options, self.clock)
            self._services.append(service)
            c = CoordinatorClient(service.address, service.authkey, timeout_s=30)
            c.service = service
        else:
            raise ValueError(kind)
        self._opened.append(c)
        return c

    def another(self, c):
        """A second handle on the same state as ``c`` (its own connection where there is one)."""
        if isinstance(c, MemoryCoordinator):
            return c
        if isinstance(c, CoordinatorClient):
            other = CoordinatorClient(c.address, c.service.authkey, timeout_s=30)
        else:
            from proxyep.rl.coordinator.redis import RedisCoordinator
            other = RedisCoordinator(self.redis_url, prefix=c.prefix, clock=self.clock, **c.options)
        self._opened.append(other)
        return other

    def close(self):
        for c in self._opened:
            c.close()
        for s in self._services:
            s.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    from proxyep.rl.coordinator.redis_server import RedisServer
    server = RedisServer(str(tmp_path_factory.mktemp("redis")), appendonly=False)
    yield server
    server.stop()


@pytest.fixture(params=STORES)
def stores(request):
    s = Stores(request.param, request.getfixturevalue("redis_server").url)
    yield s
    s.close()
