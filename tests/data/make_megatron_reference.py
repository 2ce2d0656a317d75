#!/usr/bin/env python3
"""Writes the Megatron indexed-dataset reference files the data tests read (tests/data/reference/).

Follows the layout of Megatron-LM's indexed_dataset.py (MMapIndexedDataset / _IndexWriter):
.idx = b"MMIDIDX\\x00\\x00", <Q version=1, <B dtype code, <Q sequence count, <Q document count,
int32 sequence lengths, int64 sequence byte pointers, int64 document indices; .bin = the tokens of
every sequence back to back. Written with numpy only (no Megatron import), so it is an independent
reference for the C++ reader and writer. Run with /usr/bin/python3 from the repository root.
"""
import json
import os
import struct

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")
DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6,
               np.float32: 7, np.uint16: 8}


def documents(count, vocab):
    rng = np.random.default_rng(20240520)
    return [rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist() for _ in range(count)]


def write(prefix, docs, dtype):
    with open(prefix + ".bin", "wb") as out:
        for doc in docs:
            out.write(np.array(doc, dtype=dtype).tobytes(order="C"))
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * itemsize)
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)  # one sequence per document
    with open(prefix + ".idx", "wb") as out:
        out.write(b"MMIDIDX\x00\x00")
        out.write(struct.pack("<Q", 1))
        out.write(struct.pack("<B", DTYPE_CODES[dtype]))
        out.write(struct.pack("<Q", len(sizes)))
        out.write(struct.pack("<Q", len(doc_idx)))
        out.write(sizes.tobytes(order="C"))
        out.write(pointers.tobytes(order="C"))
        out.write(doc_idx.tobytes(order="C"))


def main():
    os.makedirs(HERE, exist_ok=True)
    expected = {}
    for name, dtype, vocab in [("megatron_uint16", np.uint16, 50257),
                               ("megatron_int32", np.int32, 128256)]:
        docs = documents(12, vocab)
        write(os.path.join(HERE, name), docs, dtype)
        expected[name] = {"vocab_size": vocab, "documents": docs}
    with open(os.path.join(HERE, "megatron_expected.json"), "w") as out:
        json.dump(expected, out)


if __name__ == "__main__":
    main()
