"""``python3 -m proxyep.rl COMMAND`` (and ``proxyep rl COMMAND``, which hands over to it):

- ``run``: a GRPO run on this machine, supervised (run.py);
- ``coordinator``: the coordinator's Redis store of a run across machines (roles/coordinator.py);
- ``trainer``: one rank of the trainer (roles/trainer.py);
- ``worker``: one rollout worker, on every rank of its EP group (roles/worker.py).

``run`` starts its trainer and workers through the ``trainer`` and ``worker`` commands."""

import sys

COMMANDS = {"run": "proxyep.rl.run", "coordinator": "proxyep.rl.roles.coordinator",
            "trainer": "proxyep.rl.roles.trainer", "worker": "proxyep.rl.roles.worker"}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python3 -m proxyep.rl {{{','.join(COMMANDS)}}} [options] (--help for each)", file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
