"""``python3 -m proxyep.rl COMMAND``: ``run`` (a GRPO run, run.py). Rollout workers and the
trainer have their own entry points (``python3 -m proxyep.rl.rollout.worker``, ``python3 -m
proxyep.rl.train.job``), which ``run`` starts."""

import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    commands = {"run": "proxyep.rl.run"}
    if not argv or argv[0] not in commands:
        print(f"usage: python3 -m proxyep.rl {{{','.join(commands)}}} [options] (--help for each)", file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(commands[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
