#!/usr/bin/env python3
"""Compares two folders written by scripts/bitwise_matrix.sh: for every run in both, the losses and
gradient norms of metrics.jsonl and every tensor of the final checkpoint's .safetensors files must be
bit-identical. Prints one line per run and a summary; exits non-zero on any difference.
    python3 scripts/compare_runs.py BASELINE_DIR CANDIDATE_DIR"""
import json
import struct
import sys
from pathlib import Path


def metrics(run):
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            rows.append((row.get("step"), row["loss"], row.get("grad_norm")))
    return rows


def tensors(run):
    latest = sorted((run / "checkpoints").glob("step_*"))
    if not latest:
        return {}
    found = {}
    for path in sorted(latest[-1].rglob("*.safetensors")):
        data = path.read_bytes()
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + size])
        body = data[8 + size:]
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            found[f"{path.relative_to(latest[-1])}:{name}"] = body[begin:end]
    return found


def main():
    base, cand = Path(sys.argv[1]), Path(sys.argv[2])
    runs = sorted(p.name for p in base.iterdir() if (p / "metrics.jsonl").exists())
    differing = 0
    for name in runs:
        other = cand / name
        if not (other / "metrics.jsonl").exists():
            print(f"{name}: missing in {cand}")
            differing += 1
            continue
        problems = []
        a, b = metrics(base / name), metrics(other)
        if not a:
            problems.append("no losses")
        if a != b:
            problems.append(f"metrics differ ({len(a)} vs {len(b)} rows)")
        ta, tb = tensors(base / name), tensors(other)
        if not ta:
            problems.append("no checkpoint tensors")
        if ta.keys() != tb.keys():
            problems.append("checkpoint tensor names differ")
        else:
            bad = [k for k in ta if ta[k] != tb[k]]
            if bad:
                problems.append(f"{len(bad)} checkpoint tensors differ (first {bad[0]})")
        print(f"{name}: {'IDENTICAL' if not problems else '; '.join(problems)}"
              f" ({len(a)} steps, {len(ta)} tensors)")
        differing += bool(problems)
    print("ALL IDENTICAL" if differing == 0 else f"{differing} of {len(runs)} runs differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
