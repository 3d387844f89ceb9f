"""``python3 -m proxyep.rl trainer`` (``proxyep rl trainer``): one rank of a GRPO run's trainer,
under torchrun, ``proxyep launch`` or a Kubernetes indexed Job (one rank per pod: RANK comes from
JOB_COMPLETION_INDEX, WORLD_SIZE from the config, MASTER_ADDR/MASTER_PORT from the deployment).

    proxyep rl trainer --config run.json --run-dir /var/run/proxyep-rl \\
        --coordinator redis://redis-0.proxyep-rl-redis:6379/0 --checkpoints s3://bucket/prefix \\
        --publish trainer-0.proxyep-rl-trainer:29600 --publish-bind 0.0.0.0

Rank 0 hosts the run's state (train/host.py): it leases through the coordinator, publishes
weights from ``--publish`` and announces that address in the coordinator's store, where workers
find it (roles/discovery.py). A trainer that (re)starts resumes from the newest complete
checkpoint when there is one (``--fresh``: ignore them; what ``proxyep rl run`` without
``--resume`` does) and publishes that version before training on. PROXYEP_RL_AUTHKEY (hex) is
the key the publisher and the workers share.

Exit 0: every iteration ran; 1: an error (logged, naming the phase and the peer); 2: bad
arguments or configuration.
"""

import argparse
import os
import socket
import sys
import urllib.parse

from ..coordinator.protocol import RLError
from ..run_config import RunConfig
from .environment import require_authkey, trainer_rank_environment

PROG = "python3 -m proxyep.rl trainer"


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a JSON file or inline JSON (RunConfig)")
    p.add_argument("--run-dir", required=True, help="local logs and metrics (metrics.jsonl, endpoints.json)")
    p.add_argument("--coordinator", help="redis://host:port/db (default: the config's coordinator)")
    p.add_argument("--checkpoints", help="s3://bucket/prefix or a directory (default: the config's)")
    p.add_argument("--publish", help="HOST:PORT the weight publisher advertises (and listens on, unless "
                                     "--publish-bind); default 127.0.0.1 on a free port")
    p.add_argument("--publish-bind", help="the address the publisher listens on, e.g. 0.0.0.0")
    p.add_argument("--fresh", action="store_true", help="start from version 0 even if checkpoints exist")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return p


def apply_addresses(config, coordinator=None, checkpoints=None):
    """The config with the deployment's addresses in place of its own (validated again)."""
    if coordinator is not None:
        if not coordinator.startswith("redis://"):
            raise RLError(f"--coordinator {coordinator!r}: expected redis://host:port/db (a trainer on its own "
                          "machine can embed one: leave --coordinator out with \"coordinator\": \"memory\")")
        config.coordinator = coordinator
    if checkpoints is not None:
        if checkpoints.startswith("s3://"):
            parts = urllib.parse.urlsplit(checkpoints)
            if not parts.netloc:
                raise RLError(f"--checkpoints {checkpoints!r}: expected s3://bucket/prefix")
            # The config's own S3 options (endpoint_url, region, ...) stay; bucket and prefix change.
            config.checkpoint_s3 = dict(config.checkpoint_s3 or {}, bucket=parts.netloc,
                                        prefix=parts.path.lstrip("/"))
            config.checkpoint_dir = None
        else:
            config.checkpoint_dir, config.checkpoint_s3 = checkpoints, None
    return config.validate()


def publish_address(publish, bind):
    from ..train.host import PublishAddress

    if publish is None:
        # A wildcard bind is no address to hand out: advertise this host's name instead.
        wildcard = bind in ("0.0.0.0", "::")
        return PublishAddress(bind=bind or "127.0.0.1", advertise=socket.gethostname() if wildcard else None)
    host, _, port = publish.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise RLError(f"--publish {publish!r}: expected HOST:PORT")
    return PublishAddress(bind=bind or host, port=int(port), advertise=host)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        config = apply_addresses(RunConfig.load(args.config), args.coordinator, args.checkpoints)
        publish = publish_address(args.publish, args.publish_bind)
        require_authkey("trainer")
        os.environ.update(trainer_rank_environment(os.environ, config.trainer.ranks))
        os.makedirs(args.run_dir, exist_ok=True)
    except (RLError, OSError) as e:
        print(f"rl trainer: {e}", file=sys.stderr)
        return 2
    from ..train.job import run_trainer  # torch only once the arguments are good

    return run_trainer(config, args.run_dir, resume=not args.fresh, threads=args.threads, publish=publish)
