"""``python3 -m proxyep.rl worker`` (``proxyep rl worker``): one rollout worker of a GRPO run, on
every rank of its own EP group (``proxyep launch -n R -- proxyep rl worker ...``; never a member
of the trainer's group).

    proxyep rl worker --config run.json --coordinator redis://redis-0.proxyep-rl-redis:6379/0 \\
        [--weights-from HOST:PORT] [--wait-for-weights-s 600] [--worker-id ID]

The run config gives the model, the worker's capacity, reporting, drain budget, exchange and (for
a Redis store, whose clients hold the leasing options) lease timeout, token budget and attempts:
the same for every worker of the run. The trainer's publisher is ``--weights-from``, else the one
the trainer announced in the coordinator's store (roles/discovery.py); a worker that starts first
waits for it up to ``--wait-for-weights-s`` and then fails naming what it waited for.

Stopping: SIGTERM (on Kubernetes, the pod's eviction when the node drains on a Spot interruption)
is the notice, as a notice file or URL is: the worker stops leasing, flushes and releases its
leases as interrupted within the config's ``rollout.drain_budget_s`` and exits 0. The process
that receives the pod's SIGTERM (``proxyep launch``) must give its ranks longer than that
(``--grace-ms``), and the pod's terminationGracePeriodSeconds longer still.

This builds the command line of rollout/worker.py, which does the work.
"""

import argparse
import json
import sys

from ..coordinator.protocol import RLError
from ..run_config import RunConfig

PROG = "python3 -m proxyep.rl worker"


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a JSON file or inline JSON (RunConfig)")
    p.add_argument("--coordinator", help="redis://host:port/db or tcp://host:port (default: the config's, "
                                         "when it is a redis:// URL)")
    p.add_argument("--weights-from", help="HOST:PORT of the trainer's publisher (default: as announced in the "
                                          "coordinator's store)")
    p.add_argument("--wait-for-weights-s", type=float, default=None,
                   help="how long to wait for the trainer's publisher (default: the worker's group timeout, 60 s)")
    p.add_argument("--worker-id", help="default: the pod's or host's name and the launcher's pid")
    p.add_argument("--notice-file", help="a file whose appearance means: stop (besides SIGTERM)")
    p.add_argument("--notice-url", help="polled with GET; 200 means: stop (e.g. EC2's spot/instance-action)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: the config's seed)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    return p


def worker_argv(config, args):
    """rollout/worker.py's arguments for this role's."""
    r = config.rollout
    coordinator = args.coordinator or config.coordinator
    if not coordinator.startswith(("redis://", "tcp://")):
        raise RLError(f"worker: no coordinator address (the config says {config.coordinator!r}): give "
                      "--coordinator redis://host:port/db")
    argv = ["--coordinator", coordinator, "--model-config", config.model.to_json(),
            "--capacity", str(r.capacity), "--report-every", str(r.report_every),
            "--drain-budget-s", str(r.drain_budget_s), "--exchange", r.exchange,
            "--seed", str(config.seed if args.seed is None else args.seed), "--threads", str(args.threads)]
    if coordinator.startswith("redis://"):
        # Every client of the store leases with the run's options (the tcp coordinator's server
        # holds them itself); else a worker's leases would outlive the run's timeout.
        argv += ["--coordinator-options", json.dumps({"lease_timeout_s": r.lease_timeout_s,
                                                      "lease_tokens": r.lease_tokens,
                                                      "max_attempts": r.max_attempts})]
    if args.weights_from:
        argv += ["--weights-from", args.weights_from]
    elif coordinator.startswith("redis://"):
        argv += ["--weights-from", "coordinator"]
    else:
        raise RLError("worker: a tcp:// coordinator announces no publisher: give --weights-from HOST:PORT")
    for flag, value in (("--wait-for-weights-s", args.wait_for_weights_s), ("--worker-id", args.worker_id),
                        ("--notice-file", args.notice_file), ("--notice-url", args.notice_url)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        config = RunConfig.load(args.config)
        if args.wait_for_weights_s is not None and not args.wait_for_weights_s > 0:
            raise RLError("--wait-for-weights-s must be positive")
        forwarded = worker_argv(config, args)
    except RLError as e:
        print(f"rl worker: {e}", file=sys.stderr)
        return 2
    from ..rollout.worker import main as rollout_worker_main  # torch only once the arguments are good

    return rollout_worker_main(forwarded)
