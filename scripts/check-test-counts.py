#!/usr/bin/python3
"""Checks that a test part ran every suite it should: per ctest label, the number of tests that
ran (passed or failed, not skipped) must be at least what tests/expected-test-counts.json says for
that part. A suite that stopped registering (a dependency gone, a CMake condition turned false)
or started skipping then fails the run instead of leaving it green and smaller. Excused: tests
that skip because the machine lacks what they need and that no install can give (the testbed's
without CAP_NET_ADMIN, e.g. in a container; a root-only case for another user).

Usage (scripts/test.sh runs it after each full test part):
  check-test-counts.py --build build/release --junit FILE --part release
  check-test-counts.py ... --update    # write this run's counts as the part's expected ones
                                       # (after adding or removing tests; commit the file)
"""
import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent.parent / "tests" / "expected-test-counts.json"


def labels_by_test(build):
    """{test name: [labels]} from ctest's own listing of the build's tests."""
    listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                             capture_output=True, text=True).stdout
    labels = {}
    for test in json.loads(listing)["tests"]:
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        labels[test["name"]] = props.get("LABELS", []) or ["(no label)"]
    return labels


def has_net_admin():
    """Whether this process has CAP_NET_ADMIN (bit 12 of CapEff), which the testbed needs."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 12 & 1)
    return False


def excused(name, labels):
    """Why a skipped test may count as run: it needs what this machine lacks and says so by
    skipping (a container without CAP_NET_ADMIN, a user who is not root). "" when not excused."""
    if "testbed" in labels and not has_net_admin():
        return "no CAP_NET_ADMIN"
    if name == "daemon.other_uid_refused" and os.geteuid() != 0:
        return "not root"
    return ""


def ran_and_skipped(junit):
    """(names of the tests that ran, names of those that were skipped) in ctest's JUnit file."""
    ran, skipped = [], []
    for case in ET.parse(junit).getroot().iter("testcase"):
        (ran if case.get("status") in ("run", "fail") else skipped).append(case.get("name"))
    return ran, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--junit", required=True)
    parser.add_argument("--part", required=True)
    parser.add_argument("--update", action="store_true")
    args = parser.parse_args()

    labels = labels_by_test(args.build)
    ran, skipped = ran_and_skipped(args.junit)
    for name in list(skipped):
        why = excused(name, labels.get(name, []))
        if why and not args.update:
            print(f"check-test-counts: {name} skipped ({why} here): counted as run", file=sys.stderr)
            skipped.remove(name)
            ran.append(name)
    counts = Counter(label for name in ran for label in labels.get(name, ["(no label)"]))
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    if args.update:
        manifest[args.part] = dict(sorted(counts.items()))
        MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        print(f"check-test-counts: {MANIFEST.name}: {args.part} = {manifest[args.part]}")
        return 0
    expected = manifest.get(args.part)
    if expected is None:
        print(f"check-test-counts: no counts for part {args.part} in {MANIFEST}: run with --update",
              file=sys.stderr)
        return 1
    short = {label: (n, counts.get(label, 0)) for label, n in expected.items()
             if counts.get(label, 0) < n}
    for label, (n, got) in sorted(short.items()):
        missing = sorted(name for name in skipped if label in labels.get(name, []))
        print(f"check-test-counts: {args.part}: label {label} ran {got} test(s), expected at least "
              f"{n}" + (f"; skipped: {', '.join(missing)}" if missing else
                        "; the others are no longer registered (see the configure's output)"),
              file=sys.stderr)
    if short:
        return 1
    summary = ", ".join(f"{label} {counts.get(label, 0)}" for label in sorted(expected))
    print(f"check-test-counts: {args.part}: every label ran its tests ({summary})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
