#!/usr/bin/env python3
"""PyTorch reference for Lattice's multi-head latent attention (DeepSeek-V2/V3's MLA).

Builds, in fp32 with torch autograd, one pre-norm transformer block whose attention sub-layer is MLA
as Hugging Face's DeepseekV3Attention computes it (transformers 5.x, modeling_deepseek_v3.py) with
the half-rotation RoPE (rotate_half; rope_interleave off), a causal softmax scaled by
1/sqrt(qk_head_dim) and no biases, followed by a SwiGLU MLP (DeepSeek's dense MLP):

    q          = q_b_proj(q_a_layernorm(q_a_proj(h)))   or q_proj(h)   (q_lora_rank 0)
    [c | k_pe] = kv_a_proj_with_mqa(h),  [k_nope | v] per head = kv_b_proj(kv_a_layernorm(c))
    k          = [k_nope | rope(k_pe)] (k_pe one head shared by all), q = [q_nope | rope(q_pe)]
    x2         = x + o_proj(softmax(q k^T / sqrt(qk_head_dim), causal) v),   h = rms(x)
    out        = x2 + down_proj(silu(gate_proj(rms(x2))) * up_proj(rms(x2)))

for two blocks (with a query rank and without), from seeded random weights, input x and output
gradient g, and writes into data/latent_attention_reference.safetensors, under "<case>/": the
weights (Hugging Face's names, [out, in]), "input", "output_gradient", the output "output", and the
gradients of loss = sum(out * g): "input_gradient" and "grad/<parameter name>". The C++ test
(tests/model/test_latent_attention.cpp) loads the weights into a Lattice block of the same shape and
checks its output and every gradient. Run with /usr/bin/python3 (torch 1.13 or later):

    /usr/bin/python3 tests/reference/latent_attention_reference.py

With --against-transformers (under a venv with transformers 5.x, e.g. /opt/lattice/hf5-venv) it
instead runs transformers' own DeepseekV3Attention (eager, rope_interleave off) on the committed
weights and prints its largest difference from this reference's attention output (2e-7 when
written).
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lattice_torch import write_safetensors  # noqa: E402

# The shapes the C++ test describes (keep in step with test_latent_attention.cpp).
D_MODEL, HEADS, NOPE, ROPE, V_HEAD, KV_RANK, Q_RANK, HIDDEN = 32, 4, 4, 4, 6, 12, 10, 48
# The block norms take the config's eps; the latent norms keep DeepseekV3RMSNorm's default 1e-6.
B, T, EPS, LATENT_EPS, THETA = 2, 7, 1e-5, 1e-6, 10000.0
PREFIX = "model.layers.0."


def rms_norm(x, weight, eps=EPS):
    """Hugging Face's DeepseekV3RMSNorm / LlamaRMSNorm in fp32."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(seq, dim):
    """cos and sin [seq, dim] as Hugging Face's default rotary embedding computes them."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def parameter_shapes(q_rank):
    """{name: shape} of the block's parameters, in Hugging Face's module order."""
    qk = NOPE + ROPE
    shapes = {"input_layernorm.weight": [D_MODEL]}
    if q_rank > 0:
        shapes["self_attn.q_a_proj.weight"] = [q_rank, D_MODEL]
        shapes["self_attn.q_a_layernorm.weight"] = [q_rank]
        shapes["self_attn.q_b_proj.weight"] = [HEADS * qk, q_rank]
    else:
        shapes["self_attn.q_proj.weight"] = [HEADS * qk, D_MODEL]
    shapes["self_attn.kv_a_proj_with_mqa.weight"] = [KV_RANK + ROPE, D_MODEL]
    shapes["self_attn.kv_a_layernorm.weight"] = [KV_RANK]
    shapes["self_attn.kv_b_proj.weight"] = [HEADS * (NOPE + V_HEAD), KV_RANK]
    shapes["self_attn.o_proj.weight"] = [D_MODEL, HEADS * V_HEAD]
    shapes["post_attention_layernorm.weight"] = [D_MODEL]
    shapes["mlp.gate_proj.weight"] = [HIDDEN, D_MODEL]
    shapes["mlp.up_proj.weight"] = [HIDDEN, D_MODEL]
    shapes["mlp.down_proj.weight"] = [D_MODEL, HIDDEN]
    return {PREFIX + name: shape for name, shape in shapes.items()}


def latent_attention(p, h, q_rank):
    """DeepseekV3Attention.forward (no cache, no mask beyond causal) on h [B, T, C]."""
    qk = NOPE + ROPE
    w = lambda name: p[PREFIX + "self_attn." + name]  # noqa: E731
    if q_rank > 0:
        q_a = rms_norm(h @ w("q_a_proj.weight").T, w("q_a_layernorm.weight"), LATENT_EPS)
        q = q_a @ w("q_b_proj.weight").T
    else:
        q = h @ w("q_proj.weight").T
    q = q.view(B, T, HEADS, qk).transpose(1, 2)  # [B, H, T, qk]
    q_pass, q_rot = torch.split(q, [NOPE, ROPE], dim=-1)
    compressed = h @ w("kv_a_proj_with_mqa.weight").T
    kv_nope, k_rot = torch.split(compressed, [KV_RANK, ROPE], dim=-1)
    kv_nope = rms_norm(kv_nope, w("kv_a_layernorm.weight"), LATENT_EPS)
    k_rot = k_rot.view(B, 1, T, ROPE)
    cos, sin = rope_cos_sin(T, ROPE)
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = k_rot * cos + rotate_half(k_rot) * sin
    query = torch.cat((q_pass, q_rot), dim=-1)
    kv = (kv_nope @ w("kv_b_proj.weight").T).view(B, T, HEADS, NOPE + V_HEAD).transpose(1, 2)
    k_nope, value = torch.split(kv, [NOPE, V_HEAD], dim=-1)
    key = torch.cat((k_nope, k_rot.expand(-1, HEADS, -1, -1)), dim=-1)
    scores = query @ key.transpose(2, 3) / math.sqrt(qk)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    att = torch.softmax(scores, dim=-1) @ value  # [B, H, T, v]
    att = att.transpose(1, 2).reshape(B, T, HEADS * V_HEAD)
    return att @ w("o_proj.weight").T


def block(p, x, q_rank):
    x2 = x + latent_attention(p, rms_norm(x, p[PREFIX + "input_layernorm.weight"]), q_rank)
    h = rms_norm(x2, p[PREFIX + "post_attention_layernorm.weight"])
    gate = h @ p[PREFIX + "mlp.gate_proj.weight"].T
    up = h @ p[PREFIX + "mlp.up_proj.weight"].T
    return x2 + (torch.nn.functional.silu(gate) * up) @ p[PREFIX + "mlp.down_proj.weight"].T


def reference_case(case, q_rank, seed):
    generator = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in parameter_shapes(q_rank).items():
        if name.endswith("layernorm.weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:
            value = torch.randn(shape, generator=generator) / math.sqrt(shape[1])
        params[name] = value.requires_grad_(True)
    x = torch.randn(B, T, D_MODEL, generator=generator).requires_grad_(True)
    g = torch.randn(B, T, D_MODEL, generator=generator)
    out = block(params, x, q_rank)
    (out * g).sum().backward()
    tensors = {f"{case}/input": x, f"{case}/output_gradient": g, f"{case}/output": out,
               f"{case}/input_gradient": x.grad}
    for name, value in params.items():
        tensors[f"{case}/{name}"] = value
        tensors[f"{case}/grad/{name}"] = value.grad
    return tensors


def check_against_transformers(path):
    """Prints max |DeepseekV3Attention - latent_attention| for each case of the committed data."""
    from lattice_torch import read_safetensors
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config

    tensors, _ = read_safetensors(path)
    for case, q_rank in (("with_q_rank", Q_RANK), ("without_q_rank", 0)):
        config = DeepseekV3Config(
            hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=HEADS,
            q_lora_rank=q_rank or None, kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE,
            qk_rope_head_dim=ROPE, v_head_dim=V_HEAD, rope_interleave=False, attention_bias=False,
            rope_theta=THETA, max_position_embeddings=64)
        config._attn_implementation = "eager"
        attention = hf.DeepseekV3Attention(config, 0)
        at = f"{case}/{PREFIX}self_attn."
        attention.load_state_dict(
            {k[len(at):]: v for k, v in tensors.items() if k.startswith(at)}, strict=True)
        params = {k[len(case) + 1:]: v for k, v in tensors.items() if k.startswith(case + "/")}
        h = rms_norm(tensors[f"{case}/input"], params[PREFIX + "input_layernorm.weight"])
        positions = torch.arange(T).unsqueeze(0).expand(B, -1)
        cos, sin = hf.DeepseekV3RotaryEmbedding(config)(h, positions)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        with torch.no_grad():
            theirs, _ = attention(h, (cos, sin), mask)
            ours = latent_attention(params, h, q_rank)
        print(f"{case}: max |DeepseekV3Attention - reference| = {(theirs - ours).abs().max():.3g}")


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                        "latent_attention_reference.safetensors")
    if "--against-transformers" in sys.argv[1:]:
        check_against_transformers(path)
        return
    tensors = reference_case("with_q_rank", Q_RANK, 1)
    tensors.update(reference_case("without_q_rank", 0, 2))
    write_safetensors(path, tensors, {"generator": "tests/reference/latent_attention_reference.py",
                                      "torch": torch.__version__})
    print(f"wrote {path} ({len(tensors)} tensors)")


if __name__ == "__main__":
    main()
