#!/usr/bin/env python3
"""PyTorch side of `lattice bench train`: trains the same model on the same batch shape with
torch.optim.AdamW (fp32, or bf16 autocast) and prints one JSON line with its throughput. With
--ranks N > 1 it runs DistributedDataParallel over gloo in N processes of threads / N threads each,
each with batch / N sequences (rendezvous through a file in a temporary directory; no network).

Uses the PyTorch twins of Lattice's models in tests/reference/lattice_torch.py. Run with Debian's
python3 (python3-torch): /usr/bin/python3 bench/pytorch_train.py --family gpt2 --layers 4 ...
"""

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time

# OpenBLAS's cores with AVX-512 kernels (its DYNAMIC_ARCH names, lower case).
AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}


def openblas_core():
    """The core OpenBLAS (PyTorch's fp32 BLAS on Debian) chose for this CPU, or None when the
    BLAS loaded as libopenblas.so.0 is not OpenBLAS."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return None


def cpu_has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return all(flag in flags for flag in ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"))


def openblas_tuned_for_this_cpu():
    """PyTorch's best fp32 setup: Debian 12's OpenBLAS 0.3.21 does not know some AVX-512 CPUs
    (Emerald Rapids, family 6 model 207) and falls back to its generic "Prescott" core, SSE3
    kernels at a quarter of the GEMM rate. Then this script runs itself again with
    OPENBLAS_CORETYPE=SkylakeX (OpenBLAS reads it when it loads, before torch is imported), as a
    user tuning PyTorch would. An OPENBLAS_CORETYPE already in the environment is kept. Returns
    the line that names the BLAS PyTorch runs on."""
    chosen = os.environ.get("OPENBLAS_CORETYPE")
    detected = os.environ.get("LATTICE_BENCH_OPENBLAS_DETECTED")
    core = openblas_core()
    if core is None:
        return "not OpenBLAS (libopenblas.so.0 not loadable)"
    if chosen is None and core.lower() not in AVX512_CORES and cpu_has_avx512():
        env = dict(os.environ, OPENBLAS_CORETYPE="SkylakeX", LATTICE_BENCH_OPENBLAS_DETECTED=core)
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    if detected is not None:
        return (f"OpenBLAS {core} (OPENBLAS_CORETYPE=SkylakeX set by the benchmark: OpenBLAS "
                f"detected {detected} on this AVX-512 CPU)")
    if chosen is not None:
        return f"OpenBLAS {core} (OPENBLAS_CORETYPE={chosen} from the environment)"
    return f"OpenBLAS {core} (detected)"


BLAS = openblas_tuned_for_this_cpu() if __name__ == "__main__" else None

import torch  # noqa: E402 (after OpenBLAS's core is settled)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import lattice_torch  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--family", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, default=0)
    parser.add_argument("--ffn", type=int, default=0)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="threads in all (0: torch's default)")
    parser.add_argument("--ranks", type=int, default=1, help="DDP processes (1: no DDP)")
    args = parser.parse_args()
    if args.ranks < 1 or args.batch % args.ranks != 0:
        sys.exit(f"--ranks {args.ranks} must be >= 1 and divide --batch {args.batch}")
    if args.ranks == 1:
        result = train(0, args, None)
    else:
        with tempfile.TemporaryDirectory() as directory:
            results = mp.get_context("spawn").SimpleQueue()
            mp.spawn(train, args=(args, (os.path.join(directory, "rendezvous"), results)),
                     nprocs=args.ranks, join=True)
            result = results.get()
    result["blas"] = BLAS
    print(json.dumps(result))


def train(rank, args, distributed):
    """Trains on this rank's share of the batch. Without DDP returns the result (the throughput of
    the whole batch); under DDP rank 0 puts it on the results queue."""
    if distributed is not None:
        rendezvous, results = distributed
        dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank,
                                world_size=args.ranks)
    if args.threads > 0:
        torch.set_num_threads(max(1, args.threads // args.ranks))
    config = {
        "family": args.family,
        "vocab_size": args.vocab,
        "max_seq_len": args.seq,
        "d_model": args.d_model,
        "n_layers": args.layers,
        "n_heads": args.heads,
        "n_kv_heads": args.kv_heads or args.heads,
        "ffn_hidden": args.ffn or 4 * args.d_model,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tied_embeddings": args.family == "gpt2",
        "init_std": 0.02,
    }
    torch.manual_seed(0)
    model = lattice_torch.init_like_lattice(lattice_torch.build_model(config), seed=0)
    forward = model if distributed is None else torch.nn.parallel.DistributedDataParallel(model)
    optimizer = lattice_torch.make_adamw(model, lr=3e-4)
    generator = torch.Generator().manual_seed(1 + rank)
    batch = args.batch // args.ranks
    tokens = torch.randint(0, args.vocab, (batch, args.seq + 1), generator=generator)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        optimizer.zero_grad(set_to_none=True)
        if args.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = forward(inputs)
                loss = lattice_torch.cross_entropy(logits, targets)
        else:
            logits = forward(inputs)
            loss = lattice_torch.cross_entropy(logits, targets)
        loss.backward()
        lattice_torch.clip_gradients(model, 1.0)
        optimizer.step()
        return float(loss)

    for _ in range(args.warmup):
        step()
    if distributed is not None:
        dist.barrier()  # the ranks start the timed steps together and the time ends with the last
    start_all = time.perf_counter()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    if distributed is not None:
        dist.barrier()
    elapsed = time.perf_counter() - start_all
    result = {
        "tokens_per_second": args.batch * args.seq * args.steps / elapsed,
        "step_seconds": times,
        "loss": loss,
        "threads": torch.get_num_threads(),
        "ranks": args.ranks,
        "torch": torch.__version__,
    }
    if distributed is None:
        return result
    if rank == 0:
        results.put(result)
    dist.destroy_process_group()
    return None


if __name__ == "__main__":
    main()
