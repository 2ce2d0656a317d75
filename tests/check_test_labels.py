#!/usr/bin/env python3
"""Checks that every test ctest knows in a build carries exactly one of the labels unit, cli and mpi
(tests/test_labels.cmake), so `ctest -L unit`, `-L cli` and `-L mpi` together run the whole suite
once. Usage: check_test_labels.py <ctest> <build directory>."""
import json
import subprocess
import sys

LABELS = {"unit", "cli", "mpi"}


def main():
    ctest, build = sys.argv[1], sys.argv[2]
    listing = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, capture_output=True,
                             text=True, check=True)
    tests = json.loads(listing.stdout)["tests"]
    problems = []
    counts = {label: 0 for label in LABELS}
    for test in tests:
        labels = set()
        for prop in test.get("properties", []):
            if prop["name"] == "LABELS":
                labels.update(prop["value"])
        ours = labels & LABELS
        if len(ours) != 1:
            problems.append(f"{test['name']}: labels {sorted(labels) or 'none'}")
        for label in ours:
            counts[label] += 1
    print(f"{len(tests)} tests: " + ", ".join(f"{counts[l]} {l}" for l in sorted(LABELS)))
    if not tests:
        problems.append("ctest lists no tests (run it in a configured build directory)")
    for label in sorted(LABELS):
        if counts[label] == 0:
            problems.append(f"no test carries the label {label}: its patterns catch nothing")
    if problems:
        for problem in problems:
            print("error: " + problem + " (each test needs exactly one of unit, cli, mpi: "
                  "see tests/test_labels.cmake)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
