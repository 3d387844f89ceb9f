#!/usr/bin/python3
"""Prints, for each failed test in a ctest JUnit file, the lines that say why it failed.

test.sh prints this after its summary: a CI log is often shown only by its beginning and end,
and a failing test's own output sits in the middle of a long run, so without the digest at the
end the reason of a failure (often a flaky one) is lost with the middle.

Usage: failed-test-digest.py PART JUNIT.xml
"""

import re
import sys
import xml.etree.ElementTree as ElementTree

# Lines that state a failure in the frameworks and scripts the tests use: doctest ("ERROR:",
# "CHECK( ... ) is NOT correct!", "TEST CASE:"), pytest ("E   ", "FAILED"), Python tracebacks,
# our check scripts ("FAIL"), sanitizers, ctest's own timeout note. Log lines at error level
# are many in tests that provoke errors on purpose, so they count only when nothing else does.
_REASON = re.compile(
    r"ERROR|TEST CASE:|is NOT correct|values: |^E\s|FAILED|FAIL\b|Traceback|AssertionError|"
    r"Sanitizer|Timeout|timed out|[1-9][0-9]* failed")
_WEAK_REASON = re.compile(r"[Ee]rror|[Ff]ail|[Aa]ssert")
_MAX_REASON_LINES = 24
_TAIL_LINES = 8
_MAX_TESTS = 6


def digest(part, junit):
    try:
        root = ElementTree.parse(junit).getroot()
    except (OSError, ElementTree.ParseError) as e:
        print(f"  {part}: cannot read {junit}: {e}")
        return
    failed = [case for case in root.iter("testcase")
              if case.get("status") == "fail" or case.find("failure") is not None]
    for case in failed[:_MAX_TESTS]:
        out = case.findtext("system-out") or ""
        lines = [line.rstrip() for line in out.splitlines() if line.strip()]
        reasons = [line for line in lines if _REASON.search(line)][:_MAX_REASON_LINES]
        if not reasons:
            reasons = [line for line in lines if _WEAK_REASON.search(line)][:_MAX_REASON_LINES]
        tail = [line for line in lines[-_TAIL_LINES:] if line not in reasons]
        print(f"--- {part}: {case.get('name')} ({case.get('time', '?')} s)")
        for line in reasons + (["  [last lines]"] + tail if tail else []):
            print("  " + line[:300])
    if len(failed) > _MAX_TESTS:
        print(f"--- {part}: {len(failed) - _MAX_TESTS} more failed tests (see the log above)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: failed-test-digest.py PART JUNIT.xml")
    digest(sys.argv[1], sys.argv[2])
