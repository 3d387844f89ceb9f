"""python.bench_{ep,ll}*.smoke: runs ``python3 -m proxyep.bench`` with the arguments given and
checks what the test's name claims: exit code 0, a JSON document whose Python half and C++ half
(``--cpp-bench``) each verified, no ``cpp_error``, and figures for both halves. Matching the text
``"verified": true`` let a failed C++ half pass."""

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
