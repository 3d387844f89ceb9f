"""``python3 -m proxyep.rl.train.job``: the trainer of a GRPO run, on every rank of a
``proxyep launch -n T`` job. ``python3 -m proxyep.rl trainer`` (roles/trainer.py, which ``proxyep rl
run`` starts) is the same with the run's addresses on its command line; both call run_trainer. The ranks form the
expert-parallel trainer group; rank 0 also hosts the loop's state (host.py). The loop
itself is loop.py. Exit 0 when every iteration ran, 1 on an error (logged, naming the
phase and the peer).
"""

import argparse
import datetime
import logging
import os
import sys

import torch
import torch.distributed as dist

from ..coordinator.protocol import RLError
from ..run_config import RunConfig

log = logging.getLogger("proxyep.rl.train")


def run_trainer(config, run_dir, resume, threads=1, publish=None):
    """One rank of the trainer: joins the trainer's group (torch's env:// rendezvous: RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and runs the loop. ``publish``: where rank 0's weight
    publisher listens and what it advertises (host.PublishAddress; None: loopback, any port).
    Returns the exit code."""
    from .loop import TrainerRun

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"proxyep.rl.train rank {os.environ.get('RANK', '0')}: %(message)s")
    torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=max(180, config.grpo.pop_timeout_s + 60)))
    try:
        return TrainerRun(config, run_dir, resume, publish=publish).run()
    except (RLError, RuntimeError) as e:
        log.error("%s", e)
        return 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m proxyep.rl.train.job")
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    return run_trainer(RunConfig.load(args.config), args.run_dir, args.resume, args.threads)


if __name__ == "__main__":
    sys.exit(main())
