"""Writes tests/reference/hf_fixtures: one tiny random transformers model per family Lattice imports,
saved by transformers 5.x's save_pretrained, with its logits (hf_interop.py's `make`, which builds them).

Each fixture directory holds config.json, the safetensors (F32, BF16 or F16 weights, one file or
sharded with model.safetensors.index.json) and reference_logits.safetensors ("tokens": the prompt's
bytes, "logits": transformers' fp32 logits of the weights as saved). fixtures.json lists them with
their prompt, so that tests/train/test_hf_fixtures_cli.cpp can check every CI run, without
transformers, that `lattice import` of each gives transformers' logits.

Run under the transformers 5.x venv that scripts/install_deps.sh prepares:
    /opt/lattice/hf5-venv/bin/python tests/reference/make_hf_fixtures.py
"""

import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_interop  # noqa: E402

PROMPT = "Hello world, this is"
# 64 tokens: four times the scaled Llamas' original context of 16.
LONG_PROMPT = "The quick brown fox jumps over the lazy dog, then sleeps. The qu"

# kind -> (weight dtype, largest shard or None for one file, prompt)
FIXTURES = {
    "gpt2": ("float32", "100KB", PROMPT),
    "llama": ("bfloat16", None, PROMPT),
    "llama3": ("float32", None, LONG_PROMPT),
    "yarn": ("bfloat16", None, LONG_PROMPT),
    "mistral": ("float16", None, PROMPT),
    "qwen2": ("bfloat16", "60KB", PROMPT),
    "qwen3": ("float32", None, PROMPT),
    "qwen3_moe": ("bfloat16", "100KB", PROMPT),
    "mixtral": ("float16", None, PROMPT),
    "deepseek_v3": ("bfloat16", "100KB", LONG_PROMPT),
    "deepseek_v3_plain": ("float32", None, PROMPT),
}


def main():
    if not hf_interop.TRANSFORMERS_5:
        sys.exit(f"transformers {hf_interop.transformers.__version__}: run under transformers 5.x")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_fixtures")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    manifest = {"transformers": hf_interop.transformers.__version__, "fixtures": {}}
    for kind, (dtype, shard, prompt) in FIXTURES.items():
        out = os.path.join(root, kind)
        tokens = [str(b) for b in prompt.encode()]
        hf_interop.make(kind, out, tokens, getattr(torch, dtype), shard or "100GB")
        manifest["fixtures"][kind] = {"dtype": dtype, "sharded": shard is not None,
                                      "prompt": prompt}
    with open(os.path.join(root, "fixtures.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
