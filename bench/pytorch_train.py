#!/usr/bin/env python3
"""PyTorch side of `lattice bench train`: trains the same model on the same batch shape with
torch.optim.AdamW (fp32, or bf16 autocast) and prints one JSON line with its throughput. With
--ranks N > 1 it runs DistributedDataParallel over gloo in N processes of threads / N threads each,
each with batch / N sequences (rendezvous through a file in a temporary directory; no network).

Uses the PyTorch twins of Lattice's models in tests/reference/lattice_torch.py, in the best setup
the torch at hand offers on CPU: attention through scaled_dot_product_attention (torch >= 2.0),
AdamW with fused=True (torch >= 2.4 on CPU; else foreach), and with --compile the model and its
loss under torch.compile (inductor; the warmup steps absorb the compile). Meant for the newest
torch 2.x from PyPI (`bash scripts/install_peers.sh` creates its venv); runs with Debian's torch
1.13 too, without those three. --probe prints what the torch at hand supports and its BLAS.
A failure prints a JSON line with an "error" field and exits non-zero.
"""

import argparse
import ctypes
import json
import math
import os
import re
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import lattice_torch  # noqa: E402

# OpenBLAS's cores with AVX-512 kernels (its DYNAMIC_ARCH names, lower case).
AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}
TORCH_MAJOR = int(torch.__version__.split(".")[0])


def loaded_openblas():
    """The OpenBLAS library this process has mapped (torch's BLAS when BLAS_INFO is generic or
    open), or None. numpy's own bundled OpenBLAS (numpy.libs/libscipy_openblas*) does not count."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line and "/" in line}
    except OSError:
        return None
    paths = sorted(p for p in paths if "libopenblas" in os.path.basename(p) and "numpy" not in p)
    if not paths:
        return None
    try:
        lib = ctypes.CDLL(paths[0])
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode(), lib.openblas_get_config().decode()
    except (OSError, AttributeError):
        return None


def cpu_has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return all(flag in flags for flag in ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"))


def blas_report():
    """The line that names the BLAS and oneDNN this torch runs on, from torch.__config__.show(),
    e.g. "MKL 2024.2 (BLAS_INFO=mkl), oneDNN v3.13.3" or "OpenBLAS SkylakeX (0.3.21, detected;
    BLAS_INFO=generic), oneDNN v2.6.3" (OpenBLAS's core first). Where torch's BLAS is OpenBLAS
    (Debian's torch: BLAS_INFO=generic, libblas.so.3 from OpenBLAS) tunes it first: Debian 12's OpenBLAS
    0.3.21 does not know some AVX-512 CPUs (Emerald Rapids, family 6 model 207) and falls back to
    its generic "Prescott" core, SSE3 kernels at a quarter of the GEMM rate; then this script runs
    itself again with OPENBLAS_CORETYPE=SkylakeX (OpenBLAS reads it when it loads), as a user
    tuning PyTorch would. An OPENBLAS_CORETYPE already in the environment is kept."""
    config = torch.__config__.show()
    found = re.search(r"BLAS_INFO=(\w+)", config)
    blas_info = found.group(1) if found else "unknown"
    parts = []
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", config)
    openblas = loaded_openblas() if blas_info in ("generic", "open", "openblas", "flexi") else None
    if blas_info == "mkl" or (mkl and openblas is None):
        parts.append(f"MKL {mkl.group(1) if mkl else '(version not reported)'} (BLAS_INFO={blas_info})")
    elif openblas is not None:
        core, build = openblas
        version = build.split()[1] if build.startswith("OpenBLAS ") else "?"
        chosen = os.environ.get("OPENBLAS_CORETYPE")
        detected = os.environ.get("LATTICE_BENCH_OPENBLAS_DETECTED")
        if chosen is None and core.lower() not in AVX512_CORES and cpu_has_avx512():
            env = dict(os.environ, OPENBLAS_CORETYPE="SkylakeX", LATTICE_BENCH_OPENBLAS_DETECTED=core)
            os.execve(sys.executable, [sys.executable] + sys.argv, env)
        if detected is not None:
            how = (f"OPENBLAS_CORETYPE=SkylakeX set by the benchmark: OpenBLAS detected {detected} "
                   "on this AVX-512 CPU")
        elif chosen is not None:
            how = f"OPENBLAS_CORETYPE={chosen} from the environment"
        else:
            how = "detected"
        parts.append(f"OpenBLAS {core} ({version}, {how}; BLAS_INFO={blas_info})")
    else:
        parts.append(f"BLAS_INFO={blas_info}")
    dnnl = re.search(r"(?:MKL-DNN|oneDNN) (v[\d.]+)", config)
    if dnnl:
        parts.append(f"oneDNN {dnnl.group(1)}")
    return ", ".join(parts)


def sdpa_attention(q, k, v):
    """Causal attention through scaled_dot_product_attention (flash attention on CPU). Under
    autocast q and k may come in fp32 (Llama rotates them in fp32) and v in bf16: all in v's dtype."""
    return F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v, is_causal=True)


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def has_fused_adamw():
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], fused=True)
        return True
    except (TypeError, RuntimeError, ValueError):
        return False


def has_compile():
    return TORCH_MAJOR >= 2 and hasattr(torch, "compile")


def error_line(error):
    """A short one-line reason from an exception (inductor's run to pages with the build command)."""
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and "TORCHDYNAMO_VERBOSE" not in line and "TORCH_LOGS" not in line]
    text = f"{type(error).__name__}: " + " / ".join(lines[:3])
    return text[:400]


class WithLoss(torch.nn.Module):
    """The model and its cross-entropy as one module, so torch.compile fuses the loss too."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs, targets):
        return lattice_torch.cross_entropy(self.model(inputs), targets)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--family", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument("--layers", type=int)
    parser.add_argument("--d-model", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--kv-heads", type=int, default=0)
    parser.add_argument("--ffn", type=int, default=0)
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed steps first (at least 1 with --compile: it compiles)")
    parser.add_argument("--threads", type=int, default=0, help="threads in all (0: torch's default)")
    parser.add_argument("--ranks", type=int, default=1, help="DDP processes (1: no DDP)")
    parser.add_argument("--compile", action="store_true", help="model and loss under torch.compile")
    parser.add_argument("--probe", action="store_true",
                        help="print torch's version, BLAS and supported modes as JSON, train nothing")
    args = parser.parse_args()
    blas = blas_report()
    if args.probe:
        print(json.dumps({"torch": torch.__version__, "blas": blas, "sdpa": has_sdpa(),
                          "fused_adamw": has_fused_adamw(), "compile": has_compile()}))
        return
    missing = [name for name in ("layers", "d_model", "heads", "vocab", "seq", "batch")
               if getattr(args, name) is None]
    if missing:
        parser.error("the arguments " + ", ".join("--" + m.replace("_", "-") for m in missing)
                     + " are required")
    if args.ranks < 1 or args.batch % args.ranks != 0:
        sys.exit(f"--ranks {args.ranks} must be >= 1 and divide --batch {args.batch}")
    if args.compile and not has_compile():
        fail(f"torch {torch.__version__} has no torch.compile (it came with torch 2.0): "
             "run bash scripts/install_peers.sh for a torch 2.x", args)
    results = mp.get_context("spawn").SimpleQueue() if args.ranks > 1 else None
    try:
        if args.ranks == 1:
            result = train(0, args, None)
        else:
            with tempfile.TemporaryDirectory() as directory:
                mp.spawn(train, args=(args, (os.path.join(directory, "rendezvous"), results)),
                         nprocs=args.ranks, join=True)
                result = results.get()
    except Exception as error:  # noqa: BLE001 (reported to the caller as JSON)
        if results is not None and not results.empty():  # the failed rank's reason
            fail("a DDP rank failed: " + results.get().get("error", error_line(error)), args)
        fail(error_line(error), args)
    result["blas"] = blas
    print(json.dumps(result))


def fail(reason, args):
    print(json.dumps({"error": reason, "mode": "compile" if args.compile else "eager",
                      "torch": torch.__version__}))
    sys.stdout.flush()
    sys.exit(1)


def train(rank, args, distributed):
    """Trains on this rank's share of the batch. Without DDP returns the result (the throughput of
    the whole batch); under DDP rank 0 puts it on the results queue, and a rank that fails puts
    its reason there ({"error": ...}) before it raises."""
    try:
        return train_rank(rank, args, distributed)
    except Exception as error:
        if distributed is not None:
            distributed[1].put({"error": error_line(error)})
        raise


def train_rank(rank, args, distributed):
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
    sdpa = has_sdpa()
    ops = lattice_torch.Ops("torch-sdpa", F.linear, sdpa_attention) if sdpa else lattice_torch.TORCH_OPS
    torch.manual_seed(0)
    model = lattice_torch.init_like_lattice(lattice_torch.build_model(config, ops), seed=0)
    with_loss = WithLoss(model)
    forward = with_loss if distributed is None else torch.nn.parallel.DistributedDataParallel(with_loss)
    if args.compile:
        forward = torch.compile(forward)
    adamw = "fused" if has_fused_adamw() else "foreach"
    optimizer = lattice_torch.make_adamw(model, lr=3e-4, implementation=adamw)
    parameters = list(model.parameters())
    clip_foreach = TORCH_MAJOR >= 2  # clip_grad_norm_(foreach=) came with torch 2.0
    generator = torch.Generator().manual_seed(1 + rank)
    batch = args.batch // args.ranks
    tokens = torch.randint(0, args.vocab, (batch, args.seq + 1), generator=generator)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        optimizer.zero_grad(set_to_none=True)
        if args.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward(inputs, targets)
        else:
            loss = forward(inputs, targets)
        loss.backward()
        if clip_foreach:
            torch.nn.utils.clip_grad_norm_(parameters, 1.0, foreach=True)
        else:
            lattice_torch.clip_gradients(model, 1.0)
        optimizer.step()
        return float(loss.detach())

    warmup_times = []
    for _ in range(max(args.warmup, 1 if args.compile else 0)):
        start = time.perf_counter()
        step()
        warmup_times.append(time.perf_counter() - start)
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
    if not math.isfinite(loss):  # a broken mode (seen: a NaN loss under torch.compile) is no rate
        raise FloatingPointError(f"the loss is {loss} after {len(warmup_times) + args.steps} "
                                 "steps, so this mode's time is not reported")
    result = {
        "tokens_per_second": args.batch * args.seq * args.steps / elapsed,
        "step_seconds": times,
        "warmup_seconds": warmup_times,
        "loss": loss,
        "threads": torch.get_num_threads(),
        "ranks": args.ranks,
        "torch": torch.__version__,
        "mode": "compile" if args.compile else "eager",
        "sdpa": sdpa,
        "adamw": adamw,
    }
    if args.compile and warmup_times:
        # The first step's time over a timed step's: torch.compile's tracing and inductor's build.
        result["compile_seconds"] = max(0.0, warmup_times[0] - min(times or [0.0]))
    if distributed is None:
        return result
    if rank == 0:
        results.put(result)
    dist.destroy_process_group()
    return None


if __name__ == "__main__":
    main()
