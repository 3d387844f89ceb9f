"""What both benchmarks share: rank processes, timing, percentiles, the C++ bench run."""

import json
import os
import socket
import subprocess
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import proxyep


def percentiles(samples_us):
    s = sorted(samples_us)

    def at(q):
        return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "min": s[0], "max": s[-1]}


def timed_pair(dispatch, combine, warmup, iters, barrier=None):
    """The C++ benches' protocol: per iteration a barrier (`barrier`, else gloo's), then
    dispatch and combine back to back; microseconds of each and of both, the slowest rank's per
    iteration."""
    return timed_pairs_interleaved({"only": (dispatch, combine)}, warmup, iters, barrier)["only"]


def timed_pairs_interleaved(pairs, warmup, iters, barrier=None):
    """timed_pair of every (dispatch, combine) in `pairs` (name -> pair), their iterations
    interleaved, the order rotating each iteration: a drift of this shared machine's speed then
    falls on every path alike, so their ratios compare like with like."""
    names = list(pairs)
    samples = {name: [] for name in names}
    for i in range(warmup + iters):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            dispatch, combine = pairs[name]
            (barrier or dist.barrier)()
            t0 = time.perf_counter()
            dispatch()
            t1 = time.perf_counter()
            combine()
            t2 = time.perf_counter()
            if i >= warmup:
                samples[name].append([(t1 - t0) * 1e6, (t2 - t1) * 1e6, (t2 - t0) * 1e6])
    result = {}
    for name in names:
        mine = torch.tensor(samples[name], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        result[name] = {kind: {"us": percentiles(mine[:, i].tolist()), "samples_us": mine[:, i].tolist()}
                        for i, kind in enumerate(("dispatch", "combine", "total"))}
    return result


def time_paths(args, barrier, proxyep_calls, gloo_calls, extra=None):
    """timed_pair of ProxyEP's (dispatch, combine) and, with --baseline gloo, gloo's; the paths of
    `extra` (name -> (dispatch, combine): a comparison, as V2 against V1) timed together,
    interleaved. Each path called once first (untimed), all timed from `barrier`."""
    result = {}
    paths = [("proxyep", proxyep_calls), ("gloo", gloo_calls)]
    for name, (dispatch, combine) in paths:
        if name == "gloo" and args.baseline != "gloo":
            continue
        dispatch()
        result[name] = timed_pair(dispatch, combine, args.warmup, args.iters, barrier)
    if extra:
        for dispatch, _ in extra.values():
            dispatch()
        result.update(timed_pairs_interleaved(extra, args.warmup, args.iters, barrier))
    return result


def all_ranks_pass(diffs, tolerance):
    """Whether every rank's calc_diff values are below `tolerance` (collective)."""
    ok = torch.tensor([max(diffs) < tolerance], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(local_rank, body, args, port, ranks, per_node, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      WORLD_SIZE=str(ranks), LOCAL_RANK=str(local_rank % per_node),
                      LOCAL_WORLD_SIZE=str(per_node))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        result = body(args)
        if local_rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def run_ranks(body, args):
    """body(args) on every rank (spawned here unless a launcher already started this process as
    one); returns rank 0's result in rank 0 (None elsewhere)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # The launcher's job is the shape: its ranks, and its nodes unless given.
        args.ranks = int(os.environ["WORLD_SIZE"])
        if args.ranks_per_node is None and os.environ.get("LOCAL_WORLD_SIZE"):
            args.ranks_per_node = int(os.environ["LOCAL_WORLD_SIZE"])
        torch.set_num_threads(1)
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return body(args)
    per_node = args.ranks_per_node or args.ranks
    queue = mp.get_context("spawn").SimpleQueue()
    ranks = mp.start_processes(_rank_main, args=(body, args, _free_port(), args.ranks, per_node, queue),
                               nprocs=args.ranks, join=False, start_method="spawn")
    # Rank 0's result is read before the join: a result larger than the pipe's buffer would
    # otherwise block rank 0 in put() while this process waits for it to exit.
    result = None
    while result is None:
        if not queue.empty():
            result = queue.get()
        elif ranks.join(timeout=0.1):  # every rank exited (a failed one raises here)
            result = queue.get() if not queue.empty() else None
            break
    while not ranks.join():
        pass
    return result


def cpp_bench(args, kind, extra):
    """The C++ bench of the same shape (proxyep bench <kind> --json), or None when not found."""
    binary = args.cpp_bench
    if binary is None:
        here = os.path.dirname(os.path.abspath(__file__))
        candidate = os.path.normpath(os.path.join(here, "..", "..", "..", "tools", "proxyep"))
        binary = candidate if os.path.exists(candidate) else None
    if binary is None or args.no_cpp:
        return None
    cmd = [binary, "bench", kind, "--ranks", str(args.ranks), "--tokens", str(args.tokens), "--hidden",
           str(args.hidden), "--topk", str(args.topk), "--experts", str(args.experts), "--warmup",
           str(args.warmup), "--iters", str(args.iters), "--seed", str(args.seed), "--json"] + extra
    if args.ranks_per_node:
        cmd += ["--ranks-per-node", str(args.ranks_per_node)]
    env = dict(os.environ, PROXYEP_LOG_LEVEL="warn")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.cpp_timeout)
    if out.returncode != 0:
        return {"error": out.stderr[-2000:], "command": cmd}
    doc = json.loads(out.stdout)
    doc["command"] = " ".join(cmd)
    return doc


def placement(buffer):
    """(put, get): a host tensor to the Buffer's device and back (identity without a device)."""
    if buffer.device is None:
        return (lambda t: t), (lambda t: t)
    if buffer.device.kind == "cuda":
        return (lambda t: t.cuda()), (lambda t: t.cpu())
    return (lambda t: proxyep.to_device(buffer.device, t)), (lambda t: proxyep.to_host(buffer.device, t))


def sum_over_ranks(value):
    total = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total)


def calc_diff(x, y):
    x, y = x.double() + 1, y.double() + 1
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def print_table(title, rows, reference=None):
    """rows: name -> {'us': percentiles}; the last column is the p50 over `reference`'s p50."""
    print(title)
    print(f"  {'':34s}{'p50 us':>10s}{'p95 us':>10s}{'p99 us':>10s}{'vs ' + (reference or '-'):>18s}")
    base = rows.get(reference, {}).get("us", {}).get("p50") if reference else None
    for name, row in rows.items():
        us = row["us"]
        ratio = f"{us['p50'] / base:.2f}x" if base else "-"
        print(f"  {name:34s}{us['p50']:10.1f}{us['p95']:10.1f}{us['p99']:10.1f}{ratio:>18s}")


def add_shape_arguments(p):
    """TinyMoELM's shape for bench moe and bench weights (defaults: bench moe's, a
    shape whose step the exchange weighs on)."""
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--ffn-hidden", type=int, default=16)
    p.add_argument("--vocab", type=int, default=64)
