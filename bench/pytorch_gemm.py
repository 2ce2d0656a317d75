"""PyTorch side of `lattice bench gemm`: a Linear's forward, torch.nn.functional.linear(x, w) with
x [M, K] and w [N, K] in fp32 or bf16 (no bias), at each of the given shapes, with the given number
of threads; each shape's rate is its best over at least 8 timed runs spread over at least 0.2 s
of them, as Lattice's side times its own (train/metrics.hpp's best_seconds). With --cold, 256 MiB
are read and written before each timed run (untimed), so that the operands come from memory
rather than from the cache their previous run left them in.
Prints one JSON line: {"gflops": [...], "torch": version, "blas": the BLAS and oneDNN it ran on}.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_train import blas_report  # noqa: E402

COLD_BYTES = 256 << 20


def parse_shapes(text):
    shapes = []
    for item in text.split(";"):
        parts = item.split(",")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            sys.exit(f"--shapes: '{item}' is not M,K,N with three positive integers")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def linear_gflops(m, k, n, dtype, flush):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(m, k, generator=generator).to(dtype)
    w = (0.02 * torch.randn(n, k, generator=generator)).to(dtype)
    F.linear(x, w)  # first call: oneDNN creates its primitive
    best, runs, spent = float("inf"), 0, 0.0
    while runs < 8 or spent < 0.2:
        if flush is not None:
            flush.add_(1)
        begin = time.perf_counter()
        F.linear(x, w)
        seconds = time.perf_counter() - begin
        best, spent, runs = min(best, seconds), spent + seconds, runs + 1
    return 2.0 * m * k * n / best / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", required=True, help="M,K,N;M,K,N;...")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=0, help="threads (0: torch's default)")
    parser.add_argument("--cold", action="store_true", help="flush the caches between runs")
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    blas = blas_report()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    flush = torch.zeros(COLD_BYTES // 4, dtype=torch.int32) if args.cold else None
    try:
        rates = [linear_gflops(m, k, n, dtype, flush) for m, k, n in shapes]
    except Exception as error:  # noqa: BLE001 (reported to the caller as JSON)
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
        sys.exit(1)
    print(json.dumps({"gflops": rates, "torch": torch.__version__, "blas": blas}))


if __name__ == "__main__":
    main()
