"""Reference inverse frequencies and attention factors of transformers' RoPE scaling types, for
tests/kernels/test_rope_scaling.cpp (which holds the printed values, so the C++ table is checked
where no transformers venv exists).

  python rope_frequencies.py     # prints one C++ initializer per case

Runs transformers' own ROPE_INIT_FUNCTIONS (modeling_rope_utils.py) on a LlamaConfig: under
/opt/lattice/hf5-venv/bin/python (transformers 5.x), the values in the test were printed.
Each case: head_dim 16, and the sequence length dynamic scaling is computed for.
"""

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

HEAD_DIM = 16
CASES = [
    # name, rope_theta, max_position_embeddings, rope parameters, seq_len
    ("linear", 10000.0, 64, dict(rope_type="linear", factor=4.0), None),
    ("dynamic", 10000.0, 16, dict(rope_type="dynamic", factor=4.0), 64),
    ("llama3", 500000.0, 64, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=16), None),
    ("yarn", 10000.0, 64, dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                               original_max_position_embeddings=16), None),
    ("yarn_ramp", 10000.0, 8192, dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                      original_max_position_embeddings=2048), None),
    ("yarn_mscale", 10000.0, 8192, dict(rope_type="yarn", factor=4.0, mscale=0.707,
                                        mscale_all_dim=1.0, truncate=False,
                                        original_max_position_embeddings=2048), None),
]


def main():
    print(f"// transformers {transformers.__version__}, torch {torch.__version__}")
    for name, theta, max_pos, params, seq_len in CASES:
        params = dict(params, rope_theta=theta)
        config = transformers.LlamaConfig(
            hidden_size=HEAD_DIM * 2, num_attention_heads=2, max_position_embeddings=max_pos,
            rope_parameters=params)
        fn = ROPE_INIT_FUNCTIONS[params["rope_type"]]
        if seq_len is None:
            inv_freq, attention = fn(config, "cpu")
        else:  # as dynamic_frequency_update calls it: the forward's max position + 1, a tensor
            inv_freq, attention = fn(config, "cpu", seq_len=torch.tensor(seq_len))
        values = ", ".join(f"{v.item().hex()}" for v in inv_freq.float())
        print(f'{{"{name}", {float(attention)!r}, {{{values}}}}},')


if __name__ == "__main__":
    main()
