"""python.bench_{ep,ll}*.smoke: runs ``python3 -m proxyep.bench`` with the arguments given and
checks what the test's name claims: exit code 0, a JSON document whose Python half and C++ half
(``--cpp-bench``) each verified, no ``cpp_error``, and figures for both halves. Matching the text
``"verified": true`` let a failed C++ half pass. With ``--api v2``: V2's calls and the V1 calls
they are compared with timed, and their ratio reported."""

import json
import subprocess
import sys

cmd = [sys.executable, "-m", "proxyep.bench"] + sys.argv[1:] + ["--json"]
out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
sys.stderr.write(out.stderr[-4000:])
if out.returncode != 0:
    sys.exit(f"exit {out.returncode}: {out.stdout[-2000:]}")
doc = json.loads(out.stdout)
assert "cpp_error" not in doc, f"the C++ half failed: {doc['cpp_error']}"
assert doc["python_verified"] is True, "the Python half did not verify"
assert doc.get("cpp_verified") is True, "the C++ half did not run or did not verify"
assert doc["verified"] is True, doc
assert doc["python"]["total"]["us"]["p50"] > 0 and doc["cpp"]["total"]["p50"] > 0, doc
print(f"ok: both halves verified; python/c++ total p50 {doc['python_over_cpp']:.2f}x")
if "--api" in sys.argv and sys.argv[sys.argv.index("--api") + 1] == "v2":
    assert doc["api"] == "v2" and doc["v2"]["total"]["us"]["p50"] > 0, doc
    assert doc["v1_with_layout"]["total"]["us"]["p50"] > 0, doc
    assert set(doc["v2_over_v1"]) == {"dispatch", "combine", "total"}, doc
    assert all(v > 0 for v in doc["v2_over_v1"].values()), doc
    print(f"ok: v2 / v1 total p50 {doc['v2_over_v1']['total']:.2f}x")
