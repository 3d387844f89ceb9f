"""python3 -m proxyep.bench ep|ll|moe [options]: see proxyep/bench/__init__.py (moe: its own
options, proxyep/bench/moe.py)."""

import argparse
import json
import sys

from . import ep, ll
from .harness import cpp_bench, print_table, run_ranks


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m proxyep.bench", description=__doc__)
    p.add_argument("kind", choices=["ep", "ll"], help="(or moe: python3 -m proxyep.bench moe --help)")
    p.add_argument("--ranks", type=int, default=2, help="ranks to start when run alone")
    p.add_argument("--ranks-per-node", type=int, default=None, help="default: all on one node")
    p.add_argument("--tokens", type=int, default=None, help="tokens per rank (ep 4096, ll 128)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--bf16", action="store_true", help="ll: dispatch BF16 (default FP8)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", "--iterations", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--baseline", choices=["none", "gloo"], default="gloo",
                   help="also time torch.distributed.all_to_all_single over gloo (default)")
    p.add_argument("--cpp-bench", default=None, help="the proxyep CLI (default: the build's)")
    p.add_argument("--no-cpp", action="store_true", help="skip the C++ bench of the same shape")
    p.add_argument("--cpp-timeout", type=int, default=600)
    p.add_argument("--device", choices=["host", "simulated", "cuda"], default="host",
                   help="ep: where the tensors live (deep_ep.Buffer's device=; the C++ bench gets the same); "
                        "simulated runs the device path checked, its times are not a GPU's")
    p.add_argument("--api", choices=["v1", "v2"], default="v1",
                   help="ep: v2 also times deep_ep.ElasticBuffer (DeepEP V2) against V1 calls of the same "
                        "shape that compute their layout inside the loop, as V2's dispatch does (v2_over_v1)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    if args.device != "host" and args.kind != "ep":
        p.error("--device: ep only")
    if args.api != "v1" and args.kind != "ep":
        p.error("--api: ep only")
    if args.api == "v2" and args.device == "simulated":
        p.error("--api v2: deep_ep.ElasticBuffer does not run on the simulated device yet")
    if args.tokens is None:
        args.tokens = 4096 if args.kind == "ep" else 128
    for name in ("ranks", "tokens", "hidden", "topk", "experts", "iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.experts % args.ranks:
        p.error("--experts must be divisible by --ranks")
    if args.ranks_per_node is not None and (args.ranks_per_node < 1 or args.ranks % args.ranks_per_node):
        p.error("--ranks-per-node must divide --ranks")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["moe"]:
        from . import moe
        return moe.main(argv[1:])
    if argv[:1] == ["weights"]:  # its own options: proxyep/bench/weights.py
        from . import weights
        return weights.main(argv[1:])
    if argv[:1] == ["rl"]:  # the GRPO run as a benchmark: proxyep/rl/bench_rl.py
        from proxyep.rl import bench_rl
        return bench_rl.main(argv[1:])
    args = parse(argv)
    body = ep.body if args.kind == "ep" else ll.body
    result = run_ranks(body, args)
    if result is None:  # not rank 0 under a launcher
        return 0
    extra = ["--bf16"] if args.kind == "ll" and args.bf16 else []
    if args.device != "host":
        extra += ["--device", args.device]
    cpp = cpp_bench(args, args.kind, extra)
    doc = {"benchmark": args.kind, "ranks": args.ranks, "ranks_per_node": args.ranks_per_node or args.ranks,
           "workload": {k: getattr(args, k) for k in ("tokens", "hidden", "topk", "experts", "warmup", "iters",
                                                     "seed", "device")},
           "python": result.get("proxyep"), "gloo": result.get("gloo"), "verified": result["verified"]}
    if "device" in result:
        doc["device"] = {"kind": result["device"], "device_writes": result["device_writes"]}
    if "v2_over_v1" in result:
        doc["api"] = "v2"
        doc["v2"], doc["v1_with_layout"] = result["v2"], result["v1_with_layout"]
        doc["v2_over_v1"] = result["v2_over_v1"]
        doc["fabric_bytes"] = result["fabric_bytes"]
    if args.kind == "ll":
        doc["workload"]["fp8"] = not args.bf16
    total = result["proxyep"]["total"]["us"]["p50"]
    if "gloo" in result:
        doc["speedup_vs_gloo"] = result["gloo"]["total"]["us"]["p50"] / total
    # Each half's own verdict, and the run's: verified only when every half that ran verified (a
    # C++ bench that was asked for and failed fails the run, it is not just left out).
    doc["python_verified"] = result["verified"]
    if cpp and "proxyep" in cpp:
        key = "total"
        cpp_total = cpp["proxyep"][key]["us"]["p50"]
        doc["cpp"] = {k: cpp["proxyep"][k]["us"] for k in ("dispatch", "combine", "total")}
        doc["cpp_command"] = cpp["command"]
        doc["cpp_verified"] = cpp.get("verified") is True
        doc["python_over_cpp"] = total / cpp_total
        doc["python_minus_cpp_us"] = total - cpp_total
    elif cpp:
        doc["cpp_error"] = cpp.get("error")
        doc["cpp_verified"] = False
    doc["verified"] = doc["python_verified"] and doc.get("cpp_verified", True)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        rows = {f"python {k}": v for k, v in result["proxyep"].items()}
        if cpp and "proxyep" in cpp:
            rows.update({f"c++ {k}": {"us": v} for k, v in doc["cpp"].items()})
        for path in ("v1_with_layout", "v2"):
            if path in result:
                rows.update({f"{path} {k}": v for k, v in result[path].items()})
        if "gloo" in result:
            rows.update({f"gloo all_to_all_single {k}": v for k, v in result["gloo"].items()})
        print_table(f"proxyep.bench {args.kind}: {args.ranks} ranks, {doc['ranks_per_node']} per node, "
                    f"{args.tokens} x {args.hidden}, top-{args.topk} of {args.experts}; slowest rank per "
                    f"iteration, {args.iters} iterations", rows, "python total")
        if "python_over_cpp" in doc:
            print(f"python / c++ total p50: {doc['python_over_cpp']:.3f}x ({doc['python_minus_cpp_us']:+.1f} us)")
        if "v2_over_v1" in doc:
            print("v2 / v1 (layout in the loop), p50: " +
                  ", ".join(f"{k} {v:.3f}x" for k, v in doc["v2_over_v1"].items()))
            print("fabric bytes per call, all ranks: " + "; ".join(
                f"{api} dispatch {b['dispatch']}, combine {b['combine']}" for api, b in doc["fabric_bytes"].items()))
        if "speedup_vs_gloo" in doc:
            print(f"speedup over gloo all_to_all_single (total p50): {doc['speedup_vs_gloo']:.2f}x")
        print(f"verified: {'yes' if doc['verified'] else 'NO'}")
    return 0 if doc["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
