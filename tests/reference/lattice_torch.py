"""PyTorch twins of Lattice's models, safetensors I/O and AdamW setup, for parity tests and benchmarks.

The models (GPT-2 family: learned positions, LayerNorm, GELU (tanh), biases, tied head; Llama family:
RMSNorm as Hugging Face's LlamaRMSNorm, RoPE with Hugging Face's half rotation, SwiGLU, grouped-query
attention, no biases, untied head; Qwen 2: Llama's with q/k/v biases; Qwen 3: Llama's with per-head q/k
RMSNorm and heads of their own width; Mistral: Llama's with a sliding window; DeepSeek-V3: Llama's with
multi-head latent attention and dense first layers) have state_dict keys and shapes exactly equal to Lattice's parameter
names and shapes: every Linear weight is [out, in] (also GPT-2's c_attn/c_proj/c_fc, which Hugging Face
stores transposed as Conv1D). They are built from a dict with the keys of the "lattice.model" JSON that
Lattice writes into model.safetensors (family, vocab_size, max_seq_len, d_model, n_layers, n_heads,
n_kv_heads, ffn_hidden, norm_eps, rope_theta, tied_embeddings, init_std).

Works with plain fp32 and under torch.autocast("cpu", dtype=torch.bfloat16) (softmax, norms and the loss
are computed in fp32, as Hugging Face does). With ops=LATTICE_BF16_OPS the products instead emulate
Lattice's Precision::bf16 exactly where it rounds: GEMM inputs rounded to bf16 (nearest even), fp32
accumulation and fp32 outputs, and in attention q, k, v, d_out, the probabilities and dS rounded before
the products they feed (forward and backward written out, as Lattice's kernels do). Needs only torch (no
safetensors package): the safetensors format is read and written here by hand.
"""

import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

import lattice_torch_moe

__all__ = [
    "TORCH_OPS",
    "LATTICE_BF16_OPS",
    "Gpt2Model",
    "LlamaModel",
    "build_model",
    "init_like_lattice",
    "causal_attention",
    "round_bf16",
    "cross_entropy",
    "Ops",
    "read_safetensors",
    "write_safetensors",
    "load_lattice_weights",
    "make_adamw",
    "clip_gradients",
]

# ---------------------------------------------------------------------------------------------------
# Products: PyTorch's own (autocast-aware) or an emulation of Lattice's bf16 rounding


def round_bf16(x):
    """x rounded to the nearest bf16 (ties to even), kept in fp32."""
    return x.bfloat16().float()


def hidden_keys(T, window, device):
    """[T, T] True where query i does not see key j: the future (j > i) and, under a sliding window
    W > 0, the keys before the window (j <= i - W: each query sees itself and W - 1 before it)."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    return (j > i) | ((j <= i - window) if window > 0 else torch.zeros_like(j > i))


def causal_attention(q, k, v, window=0):
    """Causal softmax attention on [B, H, T, D] tensors (k and v already repeated to H heads), with a
    sliding window of `window` positions or none (0). Scores and softmax in fp32; under autocast the
    two products run in bf16 (probabilities are cast to v's dtype first, as Hugging Face does)."""
    T, D = q.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * (1.0 / math.sqrt(D))
    mask = hidden_keys(T, window, q.device)
    scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v)


class _RoundedBf16Linear(torch.autograd.Function):
    """y = bf16(x) bf16(W)^T + b in fp32; dx = bf16(dy) bf16(W), dW = bf16(dy)^T bf16(x), db = sum dy
    (Lattice's MatmulEngine in Precision::bf16)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        xr, wr = round_bf16(x.float()), round_bf16(weight)
        ctx.save_for_backward(xr, wr)
        ctx.has_bias = bias is not None
        y = torch.matmul(xr, wr.t())
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        dyr = round_bf16(dy)
        dx = torch.matmul(dyr, wr)
        dw = torch.matmul(dyr.reshape(-1, dy.shape[-1]).t(), xr.reshape(-1, xr.shape[-1]))
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db


class _RoundedBf16Attention(torch.autograd.Function):
    """Causal attention as Lattice's kernel in Precision::bf16 computes it when the sequence fits one
    64-key tile (T <= 64; longer sequences round exp(S - running max) per tile, so they differ by a few
    bf16 roundings): S = bf16(q) bf16(k)^T
    * scale, p = exp(S - rowmax) (fp32 row sum l), O = bf16(p) bf16(v) / l, lse = rowmax + log l;
    backward P = exp(S - lse), dP = bf16(dO) bf16(v)^T, delta = rowsum(dO * O),
    dS = P (dP - delta) scale, dQ = bf16(dS) bf16(k), dK = bf16(dS)^T bf16(q), dV = bf16(P)^T bf16(dO)."""

    @staticmethod
    def forward(ctx, q, k, v, window=0):
        T, D = q.shape[-2], q.shape[-1]
        scale = 1.0 / math.sqrt(D)
        qr, kr, vr = round_bf16(q.float()), round_bf16(k.float()), round_bf16(v.float())
        mask = hidden_keys(T, window, q.device)
        s = (torch.matmul(qr, kr.transpose(-2, -1)) * scale).masked_fill(mask, float("-inf"))
        row_max = s.amax(-1, keepdim=True)
        p = torch.exp(s - row_max)
        row_sum = p.sum(-1, keepdim=True)
        out = torch.matmul(round_bf16(p), vr) / row_sum
        lse = row_max + torch.log(row_sum)
        ctx.save_for_backward(qr, kr, vr, out, lse)
        ctx.scale, ctx.window = scale, window
        return out

    @staticmethod
    def backward(ctx, d_out):
        qr, kr, vr, out, lse = ctx.saved_tensors
        T = qr.shape[-2]
        mask = hidden_keys(T, ctx.window, qr.device)
        s = (torch.matmul(qr, kr.transpose(-2, -1)) * ctx.scale).masked_fill(mask, float("-inf"))
        p = torch.exp(s - lse)
        d_out_r = round_bf16(d_out)
        dp = torch.matmul(d_out_r, vr.transpose(-2, -1))
        delta = (d_out * out).sum(-1, keepdim=True)
        ds = p * (dp - delta) * ctx.scale
        pr, dsr = round_bf16(p), round_bf16(ds)
        dq = torch.matmul(dsr, kr)
        dk = torch.matmul(dsr.transpose(-2, -1), qr)
        dv = torch.matmul(pr.transpose(-2, -1), d_out_r)
        return dq, dk, dv, None


class _SlopeRoundedGelu(torch.autograd.Function):
    """GELU (tanh) as Lattice's Precision::bf16 keeps it for backward: y = gelu(x) in fp32, and the
    slope gelu'(x) rounded to bf16 is kept instead of x; dx = dy * bf16(gelu'(x))."""

    @staticmethod
    def forward(ctx, x):
        with torch.enable_grad():
            xg = x.detach().float().requires_grad_(True)
            y = F.gelu(xg, approximate="tanh")
            (slope,) = torch.autograd.grad(y.sum(), xg)
        ctx.save_for_backward(round_bf16(slope))
        return y.detach()

    @staticmethod
    def backward(ctx, dy):
        (slope,) = ctx.saved_tensors
        return dy * slope


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


class Ops:
    """The product kinds a model uses: linear(x, weight, bias), causal attention(q, k, v, window)
    and the GELU (whose backward Lattice's bf16 computes from a bf16 slope)."""

    def __init__(self, name, linear, attention, gelu=gelu_tanh):
        self.name, self.linear, self.attention, self.gelu = name, linear, attention, gelu

    def __repr__(self):
        return f"Ops({self.name})"


# PyTorch's own products (fp32, or bf16 under torch.autocast).
TORCH_OPS = Ops("torch", F.linear, causal_attention)
# Lattice's Precision::bf16 rounding, emulated in fp32 (do not combine with autocast).
LATTICE_BF16_OPS = Ops(
    "lattice-bf16",
    lambda x, w, b=None: _RoundedBf16Linear.apply(x, w, b),
    _RoundedBf16Attention.apply,
    _SlopeRoundedGelu.apply,
)


# ---------------------------------------------------------------------------------------------------
# Layers


class Linear(nn.Module):
    """y = x W^T (+ b), W stored [out, in] (as Lattice and nn.Linear), through the model's ops."""

    def __init__(self, in_features, out_features, bias, ops):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features).normal_(0.0, 0.02))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.ops = ops

    def forward(self, x):
        return self.ops.linear(x, self.weight, self.bias)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension with weight and bias, eps from the model config."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x.float(), (x.shape[-1],), self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, then times the weight."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rope_cos_sin(max_positions, head_dim, theta):
    """Hugging Face's rotary table: inv_freq = 1 / theta^(arange(0, D, 2) / D) in fp32, angles
    position * inv_freq, duplicated over both halves ([max_positions, head_dim] each)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# ---------------------------------------------------------------------------------------------------
# GPT-2


class Gpt2Attention(nn.Module):
    def __init__(self, config, ops):
        super().__init__()
        C = config["d_model"]
        self.n_heads = config["n_heads"]
        self.ops = ops
        self.c_attn = Linear(C, 3 * C, True, ops)
        self.c_proj = Linear(C, C, True, ops)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = self.ops.attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class Gpt2Mlp(nn.Module):
    def __init__(self, config, ops):
        super().__init__()
        self.c_fc = Linear(config["d_model"], config["ffn_hidden"], True, ops)
        self.c_proj = Linear(config["ffn_hidden"], config["d_model"], True, ops)
        self.ops = ops

    def forward(self, x):
        return self.c_proj(self.ops.gelu(self.c_fc(x)))


class Gpt2Block(nn.Module):
    def __init__(self, config, ops):
        super().__init__()
        self.ln_1 = LayerNorm(config["d_model"], config["norm_eps"])
        self.attn = Gpt2Attention(config, ops)
        self.ln_2 = LayerNorm(config["d_model"], config["norm_eps"])
        self.mlp = Gpt2Mlp(config, ops)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2Trunk(nn.Module):
    def __init__(self, config, ops):
        super().__init__()
        self.wte = nn.Embedding(config["vocab_size"], config["d_model"])
        self.wpe = nn.Embedding(config["max_seq_len"], config["d_model"])
        self.h = nn.ModuleList(Gpt2Block(config, ops) for _ in range(config["n_layers"]))
        self.ln_f = LayerNorm(config["d_model"], config["norm_eps"])


class Gpt2Model(nn.Module):
    """GPT-2: state_dict keys transformer.wte.weight, transformer.wpe.weight, transformer.h.<i>.*,
    transformer.ln_f.*, and lm_head.weight only when the config unties the head."""

    def __init__(self, config, ops=TORCH_OPS):
        super().__init__()
        self.config = dict(config)
        self.ops = ops
        self.transformer = Gpt2Trunk(config, ops)
        self.tied = bool(config.get("tied_embeddings", True))
        if not self.tied:
            self.lm_head = Linear(config["d_model"], config["vocab_size"], False, ops)

    def head_weight(self):
        return self.transformer.wte.weight if self.tied else self.lm_head.weight

    def forward(self, tokens, targets=None):
        """tokens [B, T] -> logits [B, T, V] (fp32); with targets, (logits, mean loss)."""
        T = tokens.shape[1]
        positions = torch.arange(T, device=tokens.device)
        x = self.transformer.wte(tokens) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        logits = self.ops.linear(self.transformer.ln_f(x), self.head_weight(), None).float()
        return logits if targets is None else (logits, cross_entropy(logits, targets))


# ---------------------------------------------------------------------------------------------------
# Llama


def head_dim_of(config):
    """A head's width: the config's head_dim when set (Qwen 3), else d_model / n_heads."""
    return config.get("head_dim") or config["d_model"] // config["n_heads"]


class LlamaAttention(nn.Module):
    """Llama's attention; Qwen 2 adds q/k/v biases, Qwen 3 a per-head RMSNorm of q and of k before
    RoPE (q_norm, k_norm over head_dim, as Hugging Face's Qwen3Attention) and heads of their own width,
    Mistral a sliding window (the config's sliding_window)."""

    def __init__(self, config, ops):
        super().__init__()
        C = config["d_model"]
        self.n_heads = config["n_heads"]
        self.n_kv_heads = config["n_kv_heads"]
        self.ops = ops
        self.head_dim = head_dim_of(config)
        self.window = config.get("sliding_window", 0)
        A, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        qkv_bias = config["family"] == "qwen2"  # Qwen 2: biases on q, k and v only
        self.q_proj = Linear(C, A, qkv_bias, ops)
        self.k_proj = Linear(C, kv, qkv_bias, ops)
        self.v_proj = Linear(C, kv, qkv_bias, ops)
        self.o_proj = Linear(A, C, False, ops)
        self.qk_norm = config["family"] == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config["norm_eps"])
            self.k_norm = RMSNorm(self.head_dim, config["norm_eps"])

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_proj(x).reshape(B, T, H, D)
        k = self.k_proj(x).reshape(B, T, Hkv, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).reshape(B, T, Hkv, D).transpose(1, 2)
        # RoPE in fp32, as Lattice rotates its fp32 q and k (Hugging Face rotates in the activation
        # dtype; under autocast the next product rounds q and k to bf16 either way).
        q, k, cos, sin = q.float(), k.float(), cos[:T], sin[:T]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # Query head h reads kv head h // (H / Hkv), as Hugging Face's repeat_kv.
        group = H // Hkv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        y = self.ops.attention(q, k, v, self.window).transpose(1, 2).reshape(B, T, H * D)
        return self.o_proj(y)


class LatentAttention(nn.Module):
    """DeepSeek-V2/V3's multi-head latent attention (family deepseek with kv_lora_rank > 0), as
    tests/reference/latent_attention_reference.py and Hugging Face's DeepseekV3Attention compute it:
    q = q_b_proj(q_a_layernorm(q_a_proj(x))) (or q_proj(x) without q_lora_rank), [c | k_pe] =
    kv_a_proj_with_mqa(x), [k_nope | v] per head = kv_b_proj(kv_a_layernorm(c)); RoPE (half layout)
    on the qk_rope_head_dim channels of q and on k_pe (one head shared by all), the scores scaled by
    1/sqrt(qk_nope + qk_rope). The latent norms keep DeepseekV3RMSNorm's eps 1e-6."""

    LATENT_EPS = 1e-6

    def __init__(self, config, ops):
        super().__init__()
        C, H = config["d_model"], config["n_heads"]
        self.ops, self.n_heads = ops, H
        self.q_rank, self.kv_rank = config.get("q_lora_rank", 0), config["kv_lora_rank"]
        self.nope, self.rope = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
        self.v_dim = config["v_head_dim"]
        qk = self.nope + self.rope
        if self.q_rank > 0:
            self.q_a_proj = Linear(C, self.q_rank, False, ops)
            self.q_a_layernorm = RMSNorm(self.q_rank, self.LATENT_EPS)
            self.q_b_proj = Linear(self.q_rank, H * qk, False, ops)
        else:
            self.q_proj = Linear(C, H * qk, False, ops)
        self.kv_a_proj_with_mqa = Linear(C, self.kv_rank + self.rope, False, ops)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, self.LATENT_EPS)
        self.kv_b_proj = Linear(self.kv_rank, H * (self.nope + self.v_dim), False, ops)
        self.o_proj = Linear(H * self.v_dim, C, False, ops)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        H, qk = self.n_heads, self.nope + self.rope
        if self.q_rank > 0:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.float().reshape(B, T, H, qk).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [self.nope, self.rope], dim=-1)
        compressed = self.kv_a_proj_with_mqa(x).float()
        latent, k_rot = torch.split(compressed, [self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).float()
        kv = kv.reshape(B, T, H, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.nope, self.v_dim], dim=-1)
        # RoPE in fp32 on the rope channels only (cos, sin are qk_rope_head_dim wide).
        cos, sin = cos[:T], sin[:T]
        k_rot = k_rot.reshape(B, 1, T, self.rope)
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        k_rot = k_rot * cos + rotate_half(k_rot) * sin
        q = torch.cat((q_pass, q_rot), dim=-1)
        k = torch.cat((k_nope, k_rot.expand(-1, H, -1, -1)), dim=-1)
        y = self.ops.attention(q, k, v.contiguous(), 0)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * self.v_dim))


def latent_attention_of(config):
    """Whether the config's attention is multi-head latent attention (DeepSeek-V3)."""
    return config["family"] == "deepseek" and config.get("kv_lora_rank", 0) > 0


class LlamaMlp(nn.Module):
    def __init__(self, config, ops):
        super().__init__()
        C, Fh = config["d_model"], config["ffn_hidden"]
        self.gate_proj = Linear(C, Fh, False, ops)
        self.up_proj = Linear(C, Fh, False, ops)
        self.down_proj = Linear(Fh, C, False, ops)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def is_moe_layer(config, layer):
    """Lattice's ModelConfig::is_moe_layer (Hugging Face's decoder_sparse_step; the first
    moe_first_dense_layers layers, DeepSeek's first_k_dense_replace, stay dense)."""
    return (
        config.get("n_experts", 1) > 1
        and layer >= config.get("moe_first_dense_layers", 0)
        and (layer + 1) % config.get("moe_layer_interval", 1) == 0
    )


class LlamaBlock(nn.Module):
    """A MoE layer's MLP is `block_sparse_moe` (Mixtral names) or `mlp` (DeepSeek names), a
    lattice_torch_moe.MoeMlp; its balancing loss is left in `balancing_loss`."""

    def __init__(self, config, ops, layer=0):
        super().__init__()
        self.input_layernorm = RMSNorm(config["d_model"], config["norm_eps"])
        latent = latent_attention_of(config)
        self.self_attn = LatentAttention(config, ops) if latent else LlamaAttention(config, ops)
        self.post_attention_layernorm = RMSNorm(config["d_model"], config["norm_eps"])
        self.moe = is_moe_layer(config, layer)
        if not self.moe:
            self.mlp = LlamaMlp(config, ops)
            return
        moe = lattice_torch_moe.MoeMlp(config, lambda i, o: Linear(i, o, False, ops))
        mixtral = config.get("moe_names", "mixtral") == "mixtral"
        self.mlp_name = "block_sparse_moe" if mixtral else "mlp"
        setattr(self, self.mlp_name, moe)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        mlp = getattr(self, self.mlp_name) if self.moe else self.mlp
        return x + mlp(self.post_attention_layernorm(x))

    def balancing_loss(self):
        return getattr(self, self.mlp_name).balancing_loss if self.moe else None


class LlamaTrunk(nn.Module):
    def __init__(self, config, ops):
        super().__init__()
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["d_model"])
        self.layers = nn.ModuleList(LlamaBlock(config, ops, i) for i in range(config["n_layers"]))
        self.norm = RMSNorm(config["d_model"], config["norm_eps"])


class LlamaModel(nn.Module):
    """Llama: state_dict keys model.embed_tokens.weight, model.layers.<i>.*, model.norm.weight and
    lm_head.weight (absent when the config ties the head to the embedding)."""

    def __init__(self, config, ops=TORCH_OPS):
        super().__init__()
        self.config = dict(config)
        self.ops = ops
        self.model = LlamaTrunk(config, ops)
        self.tied = bool(config.get("tied_embeddings", False))
        if not self.tied:
            self.lm_head = Linear(config["d_model"], config["vocab_size"], False, ops)
        # The RoPE table: a head's width, or the rope channels' under latent attention.
        head_dim = config["qk_rope_head_dim"] if latent_attention_of(config) else head_dim_of(config)
        cos, sin = rope_cos_sin(config["max_seq_len"], head_dim, float(config["rope_theta"]))
        # Buffers, not parameters: left out of state_dict so the keys stay Lattice's.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.tied else self.lm_head.weight

    def forward(self, tokens, targets=None):
        """tokens [B, T] -> logits [B, T, V] (fp32); with targets, (logits, mean loss). A MoE
        model's balancing losses (summed over its layers) are left in `balancing_loss`: train on
        loss + balancing_loss."""
        x = self.model.embed_tokens(tokens)
        self.balancing_loss = torch.zeros(())
        for block in self.model.layers:
            x = block(x, self.rope_cos, self.rope_sin)
            if block.balancing_loss() is not None:
                self.balancing_loss = self.balancing_loss + block.balancing_loss()
        logits = self.ops.linear(self.model.norm(x), self.head_weight(), None).float()
        return logits if targets is None else (logits, cross_entropy(logits, targets))


# ---------------------------------------------------------------------------------------------------
# Model construction, loss, optimizer


def cross_entropy(logits, targets):
    """Mean cross-entropy over targets >= 0 (negative targets are ignored, as in Lattice)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1).long(), ignore_index=-1
    )


def build_model(config, ops=TORCH_OPS):
    """A Gpt2Model or LlamaModel for a Lattice model config dict (the "lattice.model" JSON); `ops`
    picks the products (TORCH_OPS, or LATTICE_BF16_OPS to emulate Lattice's bf16 rounding)."""
    config = dict(config)
    family = config["family"]
    if "rope_scaling" in config:  # the twin's RoPE is the plain one; transformers checks scaling
        raise ValueError(f"RoPE scaling {config['rope_scaling']['type']!r} is not in the twin: "
                         "compare a scaled model with transformers (tests/reference/hf_interop.py)")
    if family == "gpt2":
        return Gpt2Model(config, ops)
    if family in ("llama", "mistral", "qwen2", "qwen3", "deepseek"):  # Llama's with their options
        return LlamaModel(config, ops)
    raise ValueError(f"unknown model family {family!r}: use 'gpt2', 'llama', 'mistral', 'qwen2', "
                     "'qwen3' or 'deepseek'")


def init_like_lattice(model, seed=0):
    """Random initialisation with Lattice's distributions (not its values): N(0, init_std) for
    matrices and embeddings, N(0, init_std/sqrt(2 n_layers)) for residual output projections
    (c_proj, o_proj, down_proj), ones for norm weights, zeros for biases. For benchmarks; parity
    tests load Lattice's own initial weights instead."""
    std = float(model.config.get("init_std", 0.02))
    residual_std = std / math.sqrt(2.0 * model.config["n_layers"])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith(".weight") else 0.0)  # norm weights; biases
            elif name.endswith(("c_proj.weight", "o_proj.weight", "down_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=generator) * residual_std)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
    return model


def make_adamw(model, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, implementation="single"):
    """torch.optim.AdamW as Lattice configures it: weight decay only on parameters of rank >= 2
    (matrices and embeddings), none on biases and norm weights. `implementation` picks torch's code
    path: "single" (single-tensor, foreach=False: the parity tests' reference), "foreach" or "fused"
    (fused=True; on CPU torch >= 2.4, else torch raises)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    options = {"single": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    if implementation not in options:
        raise ValueError(f"unknown AdamW implementation {implementation!r}: use single, foreach or fused")
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **options[implementation])


def clip_gradients(model, max_norm):
    """Global-norm clipping as Lattice (torch.nn.utils.clip_grad_norm_); returns the pre-clip norm.
    max_norm <= 0 only measures."""
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    grads = [p.grad.detach().double() for p in model.parameters() if p.grad is not None]
    return float(torch.sqrt(sum((g * g).sum() for g in grads)))


# ---------------------------------------------------------------------------------------------------
# Safetensors (by hand: 8-byte little-endian header length, JSON header, raw little-endian data)

_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I32": torch.int32,
    "I64": torch.int64,
    "U8": torch.uint8,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def read_safetensors(path):
    """(tensors: {name: tensor}, metadata: {str: str}) from a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + header_len].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    data = blob[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = _DTYPES[entry["dtype"]]
        raw = bytearray(data[begin:end])
        if raw:
            t = torch.frombuffer(raw, dtype=dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(entry["shape"]).clone()
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (keys sorted, data contiguous in that order) with string metadata."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which safetensors here lacks")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": _NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)


def load_lattice_weights(model, tensors):
    """Copies Lattice's parameters ({name: tensor}) into the model; every state_dict key must be
    present with the same shape (extra entries such as "grad/..." are ignored)."""
    state = model.state_dict()
    missing = [k for k in state if k not in tensors]
    if missing:
        raise KeyError(f"weights lack parameters {missing}")
    for name, value in state.items():
        if tuple(tensors[name].shape) != tuple(value.shape):
            raise ValueError(
                f"{name}: weights hold shape {list(tensors[name].shape)}, model wants {list(value.shape)}"
            )
    model.load_state_dict({k: tensors[k].float() for k in state}, strict=True)
    return model
