"""A trainer rank 0 for test_weights.py's publisher-death test: a WeightPublisher in its own
process, driven by JSON lines on stdin ({"publish": v}, or {"publish": v, "die_at": i}: the
publisher SIGKILLs itself, as a crash would, just before writing chunk i of that version to a
receiver, so the transfer is torn; "die_at": "commit": after every receiver staged, before any
is told to commit), reporting JSON lines on stdout (address, published)."""

import json
import logging
import os
import signal
import sys

from proxyep.rl.weights import WeightPublisher
from weights_helpers import CHUNK_BYTES, state_for


def emit(**event):
    print(json.dumps(event), flush=True)


def main():
    logging.basicConfig(level=logging.WARNING)
    die = {}

    def hook(event, **info):
        if event == "chunk" and die.get(info["version"]) == info["index"]:
            os.kill(os.getpid(), signal.SIGKILL)
        if event == "commit" and die.get(info["version"]) == "commit":
            os.kill(os.getpid(), signal.SIGKILL)
        return None

    dense, rows = state_for(1)
    pub = WeightPublisher.for_state(dense, rows, chunk_bytes=CHUNK_BYTES, fault_hook=hook, control_timeout_s=20.0,
                                    stage_timeout_s=30.0)
    emit(event="address", address=f"{pub.address[0]}:{pub.address[1]}", authkey=pub.authkey.hex())
    for line in sys.stdin:
        command = json.loads(line)
        if "wait_receivers" in command:
            pub.wait_receivers(command["wait_receivers"], 60)
            emit(event="receivers", names=sorted(pub.receivers()))
            continue
        version = command["publish"]
        if command.get("die_at") is not None:
            die[version] = command["die_at"]
        result = pub.publish(version, *state_for(version))
        emit(event="published", version=version, committed=result.committed, dropped=result.dropped)
    pub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
