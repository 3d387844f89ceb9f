"""``python3 -m proxyep.rl coordinator`` (``proxyep rl coordinator``): the coordinator's store of
a GRPO run across machines: a redis-server (coordinator/redis_server.py) with append-only
persistence in ``--dir``, in the foreground.

    proxyep rl coordinator --dir /data --port 6379 --bind 0.0.0.0 --advertise redis-0.proxyep-rl-redis

It prints the URL clients use (``redis://ADVERTISE:PORT/0``; also written to ``--url-file``) once
the server answers, then stays until SIGTERM or SIGINT, on which it stops the server (redis
flushes its append-only file) and exits 0. A server that dies by itself ends the role with 1, so
whatever supervises it (a Kubernetes StatefulSet, systemd) restarts both; a restart on the same
directory reloads the file, and the run goes on where it was.

A stock redis image serves as well (``redis-server --appendonly yes --appendfsync everysec --save
"" --dir /data``): this role only adds the project's choice of options and a clean foreground
process. The run config's ``redis_appendfsync`` is the default for ``--appendfsync``.
"""

import argparse
import os
import signal
import sys
import threading

from ..coordinator.protocol import RLError

PROG = "python3 -m proxyep.rl coordinator"


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="where the append-only file lives (a persistent volume)")
    p.add_argument("--port", type=int, default=6379, help="0: a free port (tests)")
    p.add_argument("--bind", default="127.0.0.1", help="the address redis listens on (0.0.0.0 in a pod)")
    p.add_argument("--advertise", help="the host name in the printed URL (default: the bind address)")
    p.add_argument("--config", help="the run config (JSON file or inline): its redis_appendfsync")
    p.add_argument("--appendfsync", choices=("always", "everysec", "no"),
                   help="default: the config's redis_appendfsync, else everysec")
    p.add_argument("--url-file", help="also write the URL here (atomically), for whoever starts the clients")
    p.add_argument("--start-timeout-s", type=float, default=60.0,
                   help="how long the server may take to answer (it replays the append-only file first)")
    return p


def _appendfsync(args):
    if args.appendfsync:
        return args.appendfsync
    if args.config:
        from ..run_config import RunConfig

        return RunConfig.load(args.config).redis_appendfsync
    return "everysec"


def _write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    from ..coordinator.redis_server import RedisServer

    args = build_parser().parse_args(argv)
    stop = threading.Event()
    stopped_by = []

    def on_signal(signum, _frame):
        # Only recorded here: the main thread stops the server (no work in a handler).
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = None
    try:
        os.makedirs(args.dir, exist_ok=True)
        server = RedisServer(args.dir, port=args.port, appendfsync=_appendfsync(args), bind=args.bind,
                             advertise=args.advertise, start_timeout_s=args.start_timeout_s)
        if args.url_file:
            _write_atomic(args.url_file, server.url + "\n")
        print(server.url, flush=True)
        # Wakes twice a second to notice a server that died; a signal wakes it at once.
        while not stop.wait(0.5):
            if server.process.poll() is not None:
                raise RLError(f"redis server on port {server.port} exited with {server.process.returncode} "
                              f"(its log: {server.log_path})")
        print(f"rl coordinator: {stopped_by[0]}: stopping the redis server on port {server.port}", file=sys.stderr,
              flush=True)
        return 0
    except (RLError, OSError) as e:
        print(f"rl coordinator: {e}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
