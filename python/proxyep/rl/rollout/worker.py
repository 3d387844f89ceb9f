"""``python3 -m proxyep.rl.rollout.worker``: a rollout worker process, run on every rank of a
``proxyep launch -n N`` job (N ranks = one EP group, its own gloo process group):

    proxyep launch -n 2 -- python3 -m proxyep.rl.rollout.worker --coordinator tcp://10.0.0.5:7000 \\
        --model-config model.json --worker-id spot-17 [--capacity 4] [--report-every 4] \\
        [--notice-file PATH] [--notice-url URL] [--drain-budget-s 30] [--seed S] [--weights FILE]

The coordinator URL is opened with open_coordinator ("tcp://host:port" with the key in
PROXYEP_RL_AUTHKEY, "redis://..."; ``--coordinator-options`` gives a redis store's own options,
lease_timeout_s and the rest, which every client of it must share: ``proxyep rl run`` passes the
run's). The worker serves leases until told to stop: SIGTERM to any
rank, ``--notice-file`` appearing, or ``--notice-url`` answering 200 (spot.py); it then releases
what it holds as interrupted and exits 0. Exit 1: an error (the message names the phase and the
peer: e.g. the coordinator's address); 2: bad arguments. SIGTERM to the launcher reaches every
rank too, but the launcher then exits 143 and SIGKILLs the ranks after its ``--grace-ms``
(3 s by default): give it more than ``--drain-budget-s``.

``--weights-from HOST:PORT``: each rank subscribes to the trainer's weight publisher
(weights/subscriber.py; key in PROXYEP_RL_AUTHKEY), starts from the version it is sent on joining
(the latest committed) and applies every later one between decode steps, all ranks at the same
step. ``--weights-from coordinator``: the address the trainer announced in the (redis://)
coordinator's store (roles/discovery.py), looked up by rank 0 and handed to the others. A worker
that starts before the trainer waits for the announcement and for the publisher to accept, at
most ``--wait-for-weights-s`` (default: ``--group-timeout-s``). ``--exchange a2a``: the baseline, every MoE exchange through all_to_all_single (gloo)
instead of deep_ep's low-latency mode.

``--weights FILE``: a ``torch.save`` of {"version": int, "state": {name: full tensor}} (dense
reference names, every expert): loaded at start and again whenever the file is replaced (write
a new file and rename it over the old one); each rank takes its own expert rows.
"""

import argparse
import datetime
import json
import logging
import math
import os
import sys
import time

import torch
import torch.distributed as dist

from ..coordinator.protocol import RLError
from ..model_config import ModelConfig, build_a2a_model, build_ep_model, local_expert_state
from .generation import BatchGenerator, make_ll_buffer
from .loop import RolloutWorker, WorkerError
from .spot import StopNotice

log = logging.getLogger("proxyep.rl.worker")


class FileWeightSource:
    """New weights from a file replaced atomically: ``poll()`` returns (version, this rank's
    state) when the file is new or changed since the last poll, else None."""

    def __init__(self, path, config, rank, world):
        self.path, self.config, self.rank, self.world = path, config, rank, world
        self._seen = None

    def poll(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._seen:
            return None
        self._seen = key
        blob = torch.load(self.path, weights_only=True)  # tensors and plain values only: no pickled code
        if not isinstance(blob, dict) or set(blob) != {"version", "state"}:
            raise RLError(f"{self.path}: expected {{'version': int, 'state': {{name: tensor}}}}")
        return blob["version"], local_expert_state(self.config, blob["state"], self.rank, self.world)


class PublisherWeightSource:
    """New weights from the trainer's publisher: ``poll()`` returns (version, this rank's state)
    once per newly committed version, else None (weight_subscriber.WeightSubscriber)."""

    def __init__(self, address, worker_id, model, config, rank, world, timeout_s):
        from ..weights.subscriber import WeightSubscriber, expected_tensors
        from ..weights.manifest import Layout
        from ..weights.wire import PublisherUnreachable

        host, _, port = address.rpartition(":")
        authkey = bytes.fromhex(os.environ.get("PROXYEP_RL_AUTHKEY", ""))
        self.path = f"the publisher at {address}"
        deadline = time.monotonic() + timeout_s
        while True:
            # The trainer may not listen yet (a worker started first, or the trainer restarts):
            # only "nothing accepted" is retried; a publisher that answered and refused is final.
            try:
                self.subscriber = WeightSubscriber((host, int(port)), authkey, worker_id, rank,
                                                   Layout.contiguous(world, config.num_experts),
                                                   expected_tensors(model.named_parameters()),
                                                   connect_timeout_s=timeout_s)
                break
            except PublisherUnreachable as e:
                if time.monotonic() >= deadline:
                    raise RLError(f"waiting for weights: {e} (for {timeout_s:g} s)") from e
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        self.timeout_s = timeout_s

    def poll(self):
        return self.subscriber.poll()

    def first(self):
        """The version committed on joining (waits for it)."""
        return self.subscriber.wait_committed(0, self.timeout_s)

    def close(self):
        self.subscriber.close()


def _json_object(text):
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m proxyep.rl.rollout.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--coordinator", required=True, help="tcp://host:port, redis://..., as open_coordinator takes")
    p.add_argument("--model-config", required=True, help="a JSON file or inline JSON (ModelConfig)")
    p.add_argument("--worker-id", help="default: the pod's or host's name and the launcher's pid")
    p.add_argument("--capacity", type=int, default=4, help="samples held by the whole worker at once")
    p.add_argument("--report-every", type=int, default=4, help="tokens per report_partial")
    p.add_argument("--notice-file", help="a file whose appearance means: stop (spot notice stand-in)")
    p.add_argument("--notice-url", help="polled with GET; 200 means: stop (e.g. EC2's spot/instance-action)")
    p.add_argument("--notice-poll-s", type=float, default=0.2)
    p.add_argument("--drain-budget-s", type=float, default=30.0, help="from the notice to the last release")
    p.add_argument("--heartbeat-s", type=float, default=None, help="default: a third of the lease timeout")
    p.add_argument("--lease-poll-s", type=float, default=0.05, help="how often to ask for work when there is room")
    p.add_argument("--coordinator-timeout-s", type=float, default=10.0, help="deadline of each coordinator call")
    p.add_argument("--coordinator-options", type=_json_object, default={},
                   help="JSON object of the coordinator's own options where the client holds them "
                        "(redis://: lease_timeout_s, lease_tokens, max_attempts, prefix), as the run's")
    p.add_argument("--group-timeout-s", type=float, default=60.0, help="deadline of the worker's own collectives")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (with group id, sample index, prefix length)")
    p.add_argument("--weights", help="policy weights file (see above); default: the seeded initial weights, v0")
    p.add_argument("--weights-from", help="HOST:PORT of the trainer's weight publisher, or 'coordinator': "
                                          "as announced in the coordinator's store")
    p.add_argument("--wait-for-weights-s", type=float, default=None,
                   help="how long to wait for the publisher (default: --group-timeout-s)")
    p.add_argument("--exchange", choices=("proxyep", "a2a"), default="proxyep",
                   help="MoE exchange of decode: deep_ep low-latency (default) or all_to_all_single (baseline)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    args = p.parse_args(argv)
    for name in ("capacity", "report_every", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("drain_budget_s", "notice_poll_s", "lease_poll_s", "coordinator_timeout_s", "group_timeout_s",
                 "wait_for_weights_s"):
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.heartbeat_s is not None and not args.heartbeat_s > 0:
        p.error("--heartbeat-s must be positive")
    if args.weights and args.weights_from:
        p.error("--weights and --weights-from exclude each other")
    if args.weights_from == "coordinator" and not args.coordinator.startswith("redis://"):
        p.error("--weights-from coordinator needs a redis:// coordinator (where the trainer announces it)")
    if args.worker_id is None:
        from ..roles.environment import default_worker_id

        args.worker_id = default_worker_id()
    if args.wait_for_weights_s is None:
        args.wait_for_weights_s = args.group_timeout_s
    return args


def _broadcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _open_coordinator(args):
    from ..coordinator.open import open_coordinator

    return open_coordinator(args.coordinator, timeout_s=args.coordinator_timeout_s, **args.coordinator_options)


def _initial_published(source, generator):
    """Every rank starts from the same published version: each takes the one it is sent on
    joining; if a publish landed in between (ranks differ), all wait for the newest. Each rank
    applies the version agreed, never whatever was committed on it since: a later publish may
    reach one rank first, and ranks serving different weights would run one EP model with two
    policies and tag tokens with a version the others did not use (a group then looks staler
    than it is, and is off-policy at eta = 0). A version committed after the agreed one stays
    unhanded, so poll() reports it on every rank and it is applied through the worker's loop."""
    update = source.first()
    while True:
        versions = [None] * dist.get_world_size()
        dist.all_gather_object(versions, update.version)
        if len(set(versions)) == 1:
            break
        update = source.subscriber.wait_committed(max(versions), source.timeout_s)
    if update.version != generator.version:  # version 0 is the seeded initial model, here already
        generator.apply_weights(update.version, update.tensors)


def _initial_weights(source, generator):
    """Applies the weights file, if present, on every rank before any lease; the ranks must
    have read the same version."""
    update = source.poll()
    version = update[0] if update is not None else None
    versions = [None] * dist.get_world_size()
    dist.all_gather_object(versions, version)
    if len(set(versions)) != 1:
        raise RLError(f"the ranks read different weights versions from {source.path}: {versions}")
    if update is not None:
        generator.apply_weights(*update)


def _discover_publisher(args, rank, notice):
    """Replaces ``args.weights_from`` by the address announced in the coordinator's store, the
    same on every rank (rank 0 looks, the others hear it); returns an error or None. Rank 0 waits
    in slices (at most 2 s and half the group's timeout) and says "still waiting" after each, so
    the others' broadcast never outlasts that timeout however long ``--wait-for-weights-s`` is,
    and a SIGTERM meanwhile is seen within a slice. A stop notice
    meanwhile ends the wait with neither (``args.weights_from`` stays "coordinator")."""
    from ..roles.discovery import DEFAULT_PREFIX, wait_for_publisher

    deadline = time.monotonic() + args.wait_for_weights_s
    while True:
        outcome = None
        if rank == 0 and notice.is_set():
            outcome = ("stopped", None)
        elif rank == 0:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                outcome = ("found", wait_for_publisher(
                    args.coordinator, min(remaining, args.group_timeout_s / 2, 2.0),
                    prefix=args.coordinator_options.get("prefix", DEFAULT_PREFIX), budget_s=args.wait_for_weights_s))
            except RLError as e:
                outcome = ("error", str(e)) if time.monotonic() >= deadline else ("waiting", None)
        kind, value = _broadcast(outcome)
        if kind == "found":
            args.weights_from = value
            log.info("weights from %s (announced in %s)", value, args.coordinator)
            return None
        if kind in ("error", "stopped"):
            return value


def main(argv=None):
    args = parse(argv)
    rank_env = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"proxyep.rl.worker {args.worker_id} rank {rank_env}: %(message)s")
    try:
        config = ModelConfig.load(args.model_config)
    except RLError as e:
        log.error("%s", e)
        return 2
    # Signals first: a SIGTERM during start-up is a stop request too, not a crash.
    notice = StopNotice(args.notice_file, args.notice_url, poll_s=args.notice_poll_s).install_signals().start()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.group_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    coordinator, error = None, None
    if rank == 0:
        try:
            coordinator = _open_coordinator(args)
            coordinator.version()  # reachable and answering, before anything else starts
            log.info("coordinator %s%s", args.coordinator,
                     f" with {args.coordinator_options}" if args.coordinator_options else "")
        except Exception as e:  # noqa: BLE001 - the message goes to every rank
            error = f"cannot reach coordinator {args.coordinator}: {type(e).__name__}: {e}"
    error = _broadcast(error)
    if error is None and args.weights_from == "coordinator":
        error = _discover_publisher(args, rank, notice)
        if error is None and args.weights_from == "coordinator":  # stopped while waiting: nothing to drain
            log.info("stopped (%s) before any weights were published", notice.reason)
            notice.close()
            if coordinator is not None:
                coordinator.close()
            dist.destroy_process_group()
            return 0
    if error:
        log.error("%s", error)
        notice.close()
        return 1
    max_step_tokens = math.ceil(args.capacity / world) * config.max_seq
    buffer = make_ll_buffer(config, dist.group.WORLD, max_step_tokens) if args.exchange == "proxyep" else None
    code = 1
    source = None
    try:
        if buffer is not None:
            model = build_ep_model(config, dist.group.WORLD, buffer)
            model.set_low_latency(buffer, max_step_tokens)
        else:
            model = build_a2a_model(config, dist.group.WORLD)
        generator = BatchGenerator(model, version=0, max_step_tokens=max_step_tokens)
        if args.weights:
            source = FileWeightSource(args.weights, config, rank, world)
            _initial_weights(source, generator)
        elif args.weights_from:
            source = PublisherWeightSource(args.weights_from, args.worker_id, model, config, rank, world,
                                           args.wait_for_weights_s)
            _initial_published(source, generator)
        worker = RolloutWorker(generator, args.worker_id, coordinator=coordinator, coordinator_name=args.coordinator,
                               capacity=args.capacity, report_every=args.report_every, notice=notice,
                               drain_budget_s=args.drain_budget_s, heartbeat_s=args.heartbeat_s,
                               lease_poll_s=args.lease_poll_s, seed=args.seed, weight_source=source)
        stats = worker.run()
        log.info("stopped (%s): %d leases, %d completed, %d released in %.3f s, %d stale, %d steps",
                 stats.stop_reason, stats.leases, stats.completed, stats.released, stats.drain_s, stats.stale,
                 generator.steps)
        code = 0
    except (WorkerError, RLError) as e:
        log.error("%s", e)
    finally:
        notice.close()
        if coordinator is not None:
            coordinator.close()
        if source is not None and hasattr(source, "close"):
            source.close()
    if code == 0:
        # Collective: only when every rank got here the same way.
        if buffer is not None:
            buffer.destroy()
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
