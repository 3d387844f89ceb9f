"""python.bench_moe.smoke: ``python3 -m proxyep.bench moe`` at tiny sizes (2 ranks, one node); the
JSON document has the training and decode figures of both variants (ProxyEP and the
all_to_all_single baseline), their losses are identical (the default tolerance, 0) and the run says
it is verified."""

import json
import subprocess
import sys

cmd = [sys.executable, "-m", "proxyep.bench", "moe", "--hidden", "128", "--heads", "4", "--layers", "1",
       "--experts", "4", "--topk", "2", "--tokens", "32", "--seq", "8", "--vocab", "64", "--steps", "3",
       "--warmup", "1", "--decode-tokens", "3", "--decode-batch", "2", "--prompt", "2", "--decode-rounds", "1",
       "--json"]
out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
sys.stderr.write(out.stderr)
if out.returncode != 0:
    sys.exit(f"exit {out.returncode}: {out.stdout[-2000:]}")
doc = json.loads(out.stdout)
for key in ("model", "workload", "train", "losses", "max_loss_diff", "train_speedup", "decode", "decode_speedup"):
    assert key in doc, key
for v in ("proxyep", "a2a"):
    t = doc["train"][v]
    for key in ("step_ms", "exchange_ms", "allreduce_ms", "compute_ms"):
        assert set(t[key]) >= {"p50", "p95", "p99"} and t[key]["p50"] >= 0, (v, key)
    assert len(t["step_samples_ms"]) == 3 and t["tokens_per_s"] > 0 and t["exchange_ms"]["p50"] > 0, v
    assert len(doc["losses"][v]) == 4, v
for name in ("proxyep_ll", "proxyep_normal", "a2a"):
    d = doc["decode"][name]
    assert d["tokens_per_s"] > 0 and d["exchange_ms"]["p50"] > 0 and "p99" in d["step_ms"], name
assert doc["losses_match"] and doc["max_loss_diff"] == 0 and doc["verified"] is True, doc["max_loss_diff"]
print(f"ok: train speedup {doc['train_speedup']:.2f}x, decode {doc['decode_speedup']}, "
      f"max loss diff {doc['max_loss_diff']:.1e}")
