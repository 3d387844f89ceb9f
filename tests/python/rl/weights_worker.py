"""A rollout worker rank for test_weights.py: subscribes to the publisher (WEIGHTS_ADDRESS
host:port, WEIGHTS_AUTHKEY hex), applies every committed version it gets to its model between
(notional) decode steps, saves the model's parameters per version (OUT dir) and prints one JSON
event per line: joined / refused / committed / error / done.

Alone it is an EP-1 worker (the dense model, all experts); under `proxyep launch -n 2` each rank
is one rank of an EP-2 worker: TinyMoELM over the job's own gloo group (its own process group,
never the trainer's), rank r owning experts [r * E/2, (r + 1) * E/2).

Options: --worker-id, --until V (exit 0 after committing V; default: serve until the publisher
closes), --wrong {experts,shape} (declare a layout or tensor the model does not have, to be
refused), --timeout seconds per wait, --stage-timeout seconds a transfer may take.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from proxyep.rl.model_config import build_dense_reference, build_ep_model
from proxyep.rl.weights import Layout, WeightError, WeightSubscriber, expected_tensors
from weights_helpers import CONFIG


def emit(**event):
    print(json.dumps(event), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker-id", required=True)
    p.add_argument("--until", type=int, default=None)
    p.add_argument("--wrong", choices=["experts", "shape"], default=None)
    p.add_argument("--timeout", type=float, default=90.0)
    p.add_argument("--stage-timeout", type=float, default=30.0, help="how long a transfer may take here")
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        model = build_ep_model(CONFIG, None, None)  # the worker's own group; the exchange is not used here
    else:
        model = build_dense_reference(CONFIG)
    layout = Layout.contiguous(world, CONFIG.num_experts)
    expected = expected_tensors(model.named_parameters())
    if args.wrong == "experts":
        layout = Layout.contiguous(world, 2 * CONFIG.num_experts)
    elif args.wrong == "shape":
        name = next(iter(expected))
        dtype, shape = expected[name]
        expected[name] = (dtype, (shape[0] + 1,) + tuple(shape[1:]))
    host, port = os.environ["WEIGHTS_ADDRESS"].rsplit(":", 1)
    try:
        sub = WeightSubscriber((host, int(port)), bytes.fromhex(os.environ["WEIGHTS_AUTHKEY"]), args.worker_id, rank,
                               layout, expected, control_timeout_s=20.0, stage_timeout_s=args.stage_timeout)
    except WeightError as e:
        emit(event="refused", error=str(e))
        return 3
    emit(event="joined", pid=os.getpid(), committed=sub.committed_version)
    out = os.environ["OUT"]
    params = dict(model.named_parameters())
    version = 0
    while args.until is None or version < args.until:
        try:
            version, state = sub.wait_committed(version + 1, args.timeout)
        except WeightError as e:
            emit(event="error", error=str(e), latest=sub.committed_version, stats=vars(sub.stats),
                 events=sub.events)
            sub.close()
            return 0 if "closed" in str(e) and args.until is None else 4
        with torch.no_grad():  # the quiesced apply: every parameter of this rank's model
            for name, value in state.items():
                params[name].copy_(value)
        path = os.path.join(out, f"{args.worker_id}-r{rank}-v{version}.pt")
        torch.save({n: t.detach().clone() for n, t in params.items()}, path)
        emit(event="committed", version=version, path=path, stats=vars(sub.stats), events=sub.events,
             reorder=sub.link_stats())
    emit(event="done", stats=vars(sub.stats))
    sub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
