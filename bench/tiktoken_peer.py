#!/usr/bin/python3
"""Peer of `lattice bench tokenizer`: tiktoken's single-thread encode throughput on the same text
with the same GPT-2 ranks (built from local encoder.json + vocab.bpe, no download).

Usage: /usr/bin/python3 bench/tiktoken_peer.py --gpt2-dir DIR --text FILE [--repeats N]
Prints one JSON line: {"seconds": best, "bytes": n, "tokens": n, "checksum": c, "tiktoken": version}.
The checksum (sum of (i + 1) * id mod 2^64) lets the caller check both sides produced the same ids.
"""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # encode() is single-threaded; keep the pool small

import tiktoken  # noqa: E402
from tiktoken.load import data_gym_to_mergeable_bpe_ranks  # noqa: E402

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2-dir", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(args.gpt2_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(args.gpt2_dir, "encoder.json"))
    with open(args.text, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    best = float("inf")
    ids = []
    for _ in range(args.repeats):
        # A fresh Encoding per repeat, as the Lattice side builds a fresh tokenizer (cold caches).
        enc = tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
        start = time.perf_counter()
        ids = enc.encode_ordinary(text)
        best = min(best, time.perf_counter() - start)
    checksum = 0
    for i, token in enumerate(ids):
        checksum = (checksum + (i + 1) * token) % (1 << 64)
    print(json.dumps({"seconds": best, "bytes": len(raw), "tokens": len(ids), "checksum": checksum,
                      "tiktoken": tiktoken.__version__}))


if __name__ == "__main__":
    main()
