#!/usr/bin/env python3
"""Reads TensorBoard event files with TensorBoard's own reader and prints their scalars as JSON.

Usage: read_tensorboard.py DIR_OR_FILE. Every events.out.tfevents.* file (in name order) is read
with tensorboard.backend.event_processing.event_file_loader.EventFileLoader, which checks each
record's framing and CRC-32C and migrates each simple_value into the scalar plugin's tensor form
(as TensorBoard's scalar dashboard reads it). Output: one JSON object, {"file_version": ...,
"events": [{"step": N, "wall_time": T, "scalars": {tag: value}}]} (events with no summary values
are left out; a value is the 32-bit float that was written).
"""
import json
import os
import sys

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util


def scalar(value) -> float:
    """A summary value's number: the scalar plugin's rank-0 tensor (or a legacy simple_value)."""
    if value.HasField("tensor"):
        if value.metadata.plugin_data.plugin_name != "scalars":
            sys.exit(f"tag {value.tag}: not a scalar summary")
        return float(tensor_util.make_ndarray(value.tensor).item())
    return float(value.simple_value)


def main() -> None:
    target = sys.argv[1]
    if os.path.isdir(target):
        files = sorted(os.path.join(target, f) for f in os.listdir(target)
                       if f.startswith("events.out.tfevents."))
    else:
        files = [target]
    if not files:
        sys.exit(f"no events.out.tfevents.* file in {target}")
    out = {"file_version": None, "events": []}
    for path in files:
        for event in event_file_loader.EventFileLoader(path).Load():
            if event.file_version:
                out["file_version"] = event.file_version
            values = event.summary.value
            if values:
                out["events"].append({
                    "step": event.step,
                    "wall_time": event.wall_time,
                    "scalars": {v.tag: scalar(v) for v in values},
                })
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
