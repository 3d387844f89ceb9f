"""python.bench_weights.smoke: ``python3 -m proxyep.bench weights`` on a tiny TinyMoELM (3
processes: the publisher and 2 receivers), once with EP-1 receivers (each gets the whole model)
and once with one EP-2 worker (each rank gets the dense tensors and half the experts): the JSON
has both paths' percentiles, the bytes each receiver got match the layout, every receiver
verified checksums, and the run says it is verified (first and last versions bit-exact)."""

import json
import subprocess
import sys

base = [sys.executable, "-m", "proxyep.bench", "weights", "--hidden", "64", "--heads", "2", "--layers", "1",
        "--experts", "4", "--ffn-hidden", "16", "--vocab", "32", "--max-seq", "16", "--iters", "3", "--warmup", "1",
        "--chunk-bytes", "8192", "--timeout", "60", "--json"]
docs = {}
for layout in ("ep1", "ep2"):
    out = subprocess.run(base + ["--layout", layout], capture_output=True, text=True, timeout=100)
    sys.stderr.write(out.stderr[-3000:])
    if out.returncode != 0:
        sys.exit(f"{layout}: exit {out.returncode}: {out.stdout[-2000:]}")
    doc = docs[layout] = json.loads(out.stdout)
    for path in ("proxyep", "gloo"):
        us = doc[path]["us"]
        assert set(us) >= {"p50", "p95", "p99", "min", "max"} and 0 < us["min"] <= us["p50"] <= us["max"], (layout, us)
    assert set(doc["proxyep_phases_us_p50"]) == {"copy", "stage", "commit", "recover"}, doc["proxyep_phases_us_p50"]
    assert doc["verified"] is True and doc["speedup_vs_gloo"] > 0, layout
    assert all(n > 0 for n in doc["chunks_verified"]) and len(doc["chunks_verified"]) == 2, doc["chunks_verified"]
    sent = doc["bytes_per_receiver"]
    assert len(sent) == 2, sent
    if layout == "ep1":  # each receiver: the whole model
        assert all(n == doc["model_bytes"] for n in sent.values()), sent
    else:  # each EP-2 rank: less than the whole model, and together more than it (dense twice)
        assert all(n < doc["model_bytes"] for n in sent.values()) and sum(sent.values()) > doc["model_bytes"], sent
print(f"ok: weights bench, proxyep/gloo p50 ratio ep1 {docs['ep1']['speedup_vs_gloo']:.2f}x, "
      f"ep2 {docs['ep2']['speedup_vs_gloo']:.2f}x")
