#!/usr/bin/python3
"""Encodes texts with the tokenizer files Lattice's trainer wrote, using tiktoken and Hugging Face
`tokenizers` (whichever is installed), so that tests/data/test_tokenizer_trainer.cpp can check they
read the files the way Lattice does.

Usage: /usr/bin/python3 tests/reference/encode_with_peers.py --dir DIR --texts FILE
  DIR holds trained.tiktoken (+ the pattern GPT-2 uses) and tokenizer.json; FILE is a JSON list of
  strings. Prints one JSON line: {"tiktoken": [[ids], ...] or null, "hf": [[ids], ...] or null}.
"""
import argparse
import base64
import json
import os

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--texts", required=True)
    args = parser.parse_args()
    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)
    result = {"tiktoken": None, "hf": None}
    try:
        import tiktoken
        ranks = {}
        with open(os.path.join(args.dir, "trained.tiktoken"), "rb") as f:
            for line in f.read().splitlines():
                if line:
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
        enc = tiktoken.Encoding(name="lattice_trained", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens={})
        result["tiktoken"] = [enc.encode_ordinary(t) for t in texts]
    except ImportError:
        pass
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(args.dir, "tokenizer.json"))
        result["hf"] = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    except ImportError:
        pass
    print(json.dumps(result))


if __name__ == "__main__":
    main()
