"""What the trainer's rank 0 hosts in a GRPO run (loop.py): the coordinator (an
embedded MemoryCoordinator served on loopback to the workers, or a Redis one they reach
directly), the experience buffer, the controller thread (controller.py) and the weight
publisher (weights/publisher.py). ``start`` publishes the current version (so every worker, early
or late, gets it on joining) and writes ``endpoints.json`` in the run directory: where workers
find the coordinator and the publisher. With a Redis coordinator the publisher's address is also
announced in the store (roles/discovery.py), for workers on other machines.

On resume the pool (coordinator snapshot) and the buffer come back from the same checkpoint, so
what was in flight then is reissued once and nothing completed after it is counted.

A Redis coordinator is reached through RetryingCoordinator: a redis-server restart (the
supervisor restarts its own) is an outage of a second or so, which the controller thread and the
trainer ride out instead of failing the run.
"""

import dataclasses
import json
import logging
import os
import time

from ..coordinator.protocol import RLError
from .controller import Controller
from .experience import ExperienceBuffer
from .tasks import AdditionTask

log = logging.getLogger("proxyep.rl.train")


@dataclasses.dataclass
class PublishAddress:
    """Where the weight publisher listens (``bind``, ``port``; 0: any free one) and the host name
    it advertises to workers (``advertise``; None: the bind address). On Kubernetes it binds
    0.0.0.0 and advertises the pod's stable DNS name, which workers can resolve."""
    bind: str = "127.0.0.1"
    port: int = 0
    advertise: str = None

    def advertised(self, bound_port):
        return f"{self.advertise or self.bind}:{bound_port}"


def write_json_atomic(path, value):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _unreachable(error):
    """True when ``error`` (an RLError from RedisCoordinator) is the server being away: refused
    or dropped connections, timeouts, a server still loading its append-only file."""
    import redis

    return isinstance(error.__cause__, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError))


class RetryingCoordinator:
    """A coordinator whose calls are retried while its server is unreachable, for at most
    ``window_s`` from the first failure of a call; then the call fails naming the coordinator and
    the call. Any other error is raised at once.

    A retry is safe for every call rank 0 makes: reads, set_version (the same version again),
    abort(None), and submit, whose retry after a lost reply is refused as a duplicate: the first
    try landed, which is what a duplicate there means. take_completed is the exception: a reply
    lost after the server applied the take (killed between its fsync and its answer) would leave
    those groups taken and uncollected; the window is one reply's write."""

    def __init__(self, inner, where, window_s, poll_s=0.2):
        self.inner, self.where, self.window_s, self.poll_s = inner, where, window_s, poll_s
        self.outages = 0  # calls that had to wait for the server at least once

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr) or name == "close":
            return attr

        def call(*args, **kwargs):
            return self._call(name, attr, args, kwargs)
        return call

    def _call(self, name, fn, args, kwargs):
        from ..coordinator.memory import duplicate_group

        deadline = None
        while True:
            try:
                return fn(*args, **kwargs)
            except RLError as e:
                if (deadline is not None and name == "submit"
                        and str(e) == str(duplicate_group(args[0].group_id))):
                    return None  # the try whose reply was lost did land
                if not _unreachable(e):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.window_s
                    self.outages += 1
                    log.warning("coordinator %s unreachable (%s); retrying for up to %.0f s", self.where, name,
                                self.window_s)
                if now >= deadline:
                    raise RLError(f"coordinator {self.where} unreachable for {self.window_s:g} s "
                                  f"(call {name}): {e}") from e
                time.sleep(min(self.poll_s, max(0.0, deadline - now)))


class TrainHost:
    """What only rank 0 holds: the coordinator and its server, buffer, controller, publisher."""

    def __init__(self, config, run_dir, state, resume_parts, publish=None):
        from ..coordinator.memory import MemoryCoordinator
        from ..coordinator.service import CoordinatorServer
        from ..coordinator.open import open_coordinator

        self.config, self.run_dir = config, run_dir
        r, g = config.rollout, config.grpo
        authkey = bytes.fromhex(os.environ["PROXYEP_RL_AUTHKEY"])
        options = dict(lease_timeout_s=r.lease_timeout_s, lease_tokens=r.lease_tokens, max_attempts=r.max_attempts)
        self.server = None
        if config.coordinator == "memory":
            self.coordinator = MemoryCoordinator(**options)
            self.server = CoordinatorServer(self.coordinator, authkey=authkey)
            coordinator_url = f"tcp://{self.server.address[0]}:{self.server.address[1]}"
        else:
            coordinator_url = os.environ.get("PROXYEP_RL_REDIS_URL", config.coordinator)
            if not coordinator_url.startswith("redis://"):
                raise RLError("coordinator 'redis' needs PROXYEP_RL_REDIS_URL (the supervisor sets it to the "
                              "redis-server it starts)")
            self.coordinator = RetryingCoordinator(open_coordinator(coordinator_url, **options), coordinator_url,
                                                   config.coordinator_retry_s)
        max_in_flight = g.max_in_flight or (g.staleness + 1) * g.batch_groups
        self.buffer = ExperienceBuffer(g.batch_groups, g.staleness, max_in_flight, dapo_filter=g.dapo_filter)
        self.task = AdditionTask(config.task.digits, config.task.seed)
        if resume_parts is not None:
            # The pool and the buffer come back from the same moment, so what was in flight at the
            # checkpoint is reissued once and nothing completed after it is counted.
            self.coordinator.restore(resume_parts["pool"])
            self.buffer.restore(resume_parts["buffer"], version=state["version"])
            self.coordinator.set_version(max(state["version"], self.coordinator.version()))
        elif config.coordinator != "memory" and self.coordinator.stats().get("submitted", 0):
            raise RLError(f"coordinator {coordinator_url} already holds a run's state; start a fresh store or "
                          "resume from a checkpoint")
        self.buffer.set_version(state["version"])
        self.controller = Controller(config, self.coordinator, self.buffer, self.task, config.trainer.ranks,
                                     next_prompt=state["next_prompt"])
        if resume_parts is not None:
            self.controller.in_flight = dict(resume_parts["controller"]["in_flight"])
            self.controller.restore_totals(resume_parts["controller"].get("totals", {}))
        self.version = state["version"]
        self.publisher = None
        self.coordinator_url = coordinator_url
        self.publish = publish or PublishAddress()
        self.announcement = None  # what discovery.announce_publisher wrote (a Redis coordinator)

    def start(self, dense, experts):
        from ..weights.publisher import WeightPublisher

        self.publisher = WeightPublisher.for_state(dense, experts, host=self.publish.bind, port=self.publish.port,
                                                        authkey=bytes.fromhex(os.environ["PROXYEP_RL_AUTHKEY"]))
        result = self.publisher.publish(self.version, dense, experts)  # late joiners get this one
        log.info("published v%d (initial) to %d receivers", self.version, len(result.committed))
        advertised = self.publish.advertised(self.publisher.address[1])
        host, _, port = advertised.rpartition(":")
        write_json_atomic(os.path.join(self.run_dir, "endpoints.json"), {
            "coordinator": self.coordinator_url,
            "publisher": [host, int(port)],
            "version": self.version,
            "pid": os.getpid()})
        if self.coordinator_url.startswith("redis://"):
            # Workers on other machines find the publisher here (roles/discovery.py).
            from ..roles.discovery import announce_publisher

            self.announcement = announce_publisher(self.coordinator_url, advertised, self.version)
            log.info("announced the publisher %s in %s", advertised, self.coordinator_url)
        self.controller.start()

    def summary(self, consumed_ids):
        """The run's accounting once it is over (written to summary.json): every group submitted
        ends complete, failed or aborted in the pool; every complete one was collected; every
        collected one was consumed by the trainer, is still in the buffer, or was filtered or
        evicted. ``lost`` and ``duplicated`` must be 0."""
        self.controller.stop()
        self.controller.step(submit=False)  # what completed before the final abort
        pool = self.coordinator.stats()
        buffer = self.buffer.metrics()
        totals = dict(self.controller.totals)
        ended = pool.get("completed_groups", 0) + pool.get("failed_groups", 0) + pool.get("aborted_groups", 0)
        placed = len(consumed_ids) + buffer.get("depth", 0) + totals["filtered"] + buffer.get("evicted", 0)
        return {"pool": pool, "buffer": buffer, "controller": totals, "consumed_groups": len(consumed_ids),
                "lost": (pool.get("submitted", 0) - ended) + (totals["collected"] - placed)
                + (pool.get("completed_groups", 0) - totals["collected"]),
                "duplicated": len(consumed_ids) - len(set(consumed_ids))}

    def wait_for_workers(self, timeout_s):
        """The run is over: says so (``trainer-done`` in the run directory) and keeps the
        coordinator and the publisher up until the supervisor says the workers have drained
        (``workers-stopped``), so none of them fails on a vanished coordinator; at most
        ``timeout_s``."""
        write_json_atomic(os.path.join(self.run_dir, "trainer-done"), {"version": self.buffer.version})
        stopped = os.path.join(self.run_dir, "workers-stopped")
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(stopped) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not os.path.exists(stopped):
            log.warning("workers did not stop within %.0f s of the run's end", timeout_s)

    def close(self):
        self.controller.stop()
        if self.announcement is not None:
            from ..roles.discovery import withdraw_publisher

            withdraw_publisher(self.coordinator_url, self.announcement)
        if self.publisher is not None:
            self.publisher.close()
        if self.server is not None:
            self.server.close()
        self.coordinator.close()
