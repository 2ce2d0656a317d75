"""Hugging Face `transformers` on the two sides of Lattice's HF interop (tests/train/test_hf_cli.cpp).

  hf_interop.py check EXPORT_DIR LOGITS_FILE TOLERANCE
      Loads the directory `lattice export --format hf` wrote with AutoModelForCausalLM (fp32, eager
      attention), runs it on the tokens of LOGITS_FILE (what `lattice generate --logits-out` wrote:
      "tokens" [T] and Lattice's "logits" [T, vocab]) and fails unless every logit is within
      TOLERANCE x the largest |logit|. Prints the measured difference. When the file also holds
      "generated" (Lattice's greedy continuation, `lattice generate --max-tokens N`), transformers'
      greedy generate of as many tokens (its eos disabled, as Lattice's --stop-token -1) must give
      the same ids.
  hf_interop.py tokenize EXPORT_DIR TEXT
      Loads the exported tokenizer files with AutoTokenizer and prints the ids of TEXT, one line.
  hf_interop.py generate EXPORT_DIR PROMPT MAX_NEW
      Loads the export and its tokenizer (AutoTokenizer), encodes PROMPT and runs greedy
      model.generate(do_sample=False, max_new_tokens=MAX_NEW) with the generation_config.json the
      export wrote. Prints "prompt ids: ...", "new ids: ...", "eos: ID" (generation_config's),
      "stopped at eos: yes|no" and "text: " + the new tokens decoded (the eos left out) as JSON.
  hf_interop.py narrowed FP32_DIR NARROW_DIR
      Loads both exports with dtype "auto" and fails unless the second's parameters are in the dtype
      its config.json names (bfloat16 or float16) and equal the first's converted by torch
      (round to nearest even), bit for bit.
  hf_interop.py has MODEL_TYPE
      Exits 0 when this transformers has models of MODEL_TYPE (a config.json's model_type), else 3.
  hf_interop.py make KIND OUT_DIR TOKENS...
      Builds a small randomly initialised transformers model of KIND (gpt2, llama, mistral (a sliding
      window of 8), qwen2, qwen3 (heads 16 wide on a 48-wide model), qwen3_moe, mixtral,
      deepseek_v3 (latent attention, group-limited routing, yarn; deepseek_v3_plain: q_proj, plain
      RoPE, rope channels not interleaved, no groups), or a Llama
      with RoPE scaling: llama3, linear, dynamic, yarn; fixed seed), saves it with save_pretrained
      (sharded into small files, so the index is read too) and writes
      OUT_DIR/reference_logits.safetensors with its logits on TOKENS.

Exit 3 when transformers cannot be imported, or has no model of KIND (Qwen 3 came in 4.51), so the
caller skips. Runs under the interpreter
scripts/install_deps.sh prepares: transformers 4.46.3 over Debian's torch, or transformers 5.x with
PyPI's torch 2.x.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lattice_torch import read_safetensors, write_safetensors  # noqa: E402

try:
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM
except ImportError as e:  # pragma: no cover
    print(f"transformers is not available: {e}")
    sys.exit(3)


def check(export_dir, logits_file, tolerance):
    dtype = {"dtype" if TRANSFORMERS_5 else "torch_dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(export_dir, attn_implementation="eager", **dtype)
    model.eval()
    tensors, _ = read_safetensors(logits_file)
    tokens = tensors["tokens"].long()
    ours = tensors["logits"]
    with torch.no_grad():
        theirs = model(tokens[None]).logits[0]
    scale = ours.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    print(
        f"{type(model).__name__} ({transformers.__version__}): {tokens.numel()} tokens, "
        f"max |logit| {scale:.4g}, max difference {diff:.3g} ({diff / scale:.3g} relative)"
    )
    if not diff <= tolerance * scale:
        print(f"FAIL: beyond {tolerance} x the largest logit")
        sys.exit(1)
    if "generated" in tensors:  # Lattice's greedy continuation: transformers' must be the same
        without_fsdp_probe()
        ours_new = tensors["generated"].long().tolist()
        model.generation_config.eos_token_id = None  # Lattice generated without stopping
        with torch.no_grad():
            out = model.generate(tokens[None], attention_mask=torch.ones_like(tokens[None]),
                                 do_sample=False, max_new_tokens=len(ours_new),
                                 min_new_tokens=len(ours_new), eos_token_id=None, pad_token_id=0)
        theirs_new = out[0, tokens.numel():].tolist()
        print(f"greedy: Lattice {ours_new}, transformers {theirs_new}")
        if ours_new != theirs_new:
            print("FAIL: the greedy tokens differ")
            sys.exit(1)


def tokenize(export_dir, text):
    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    print(" ".join(str(i) for i in tokenizer(text)["input_ids"]))


def without_fsdp_probe():
    """transformers 4.46's generate asks whether the model is FSDP-managed by importing
    torch.distributed.fsdp, which Debian's torch 1.13 cannot import under Python 3.11 (a dataclass
    with a mutable default). No model here is: where the import fails, answer no without it."""
    try:
        import torch.distributed.fsdp  # noqa: F401
    except Exception:  # pragma: no cover (depends on the torch build)
        import transformers.generation.utils as generation_utils
        if hasattr(generation_utils, "is_fsdp_managed_module"):
            generation_utils.is_fsdp_managed_module = lambda module: False


def generate(export_dir, prompt, max_new):
    without_fsdp_probe()
    dtype = {"dtype" if TRANSFORMERS_5 else "torch_dtype": torch.float32}
    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    model = AutoModelForCausalLM.from_pretrained(export_dir, attn_implementation="eager", **dtype)
    model.eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new)
    new = out[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    stopped = bool(new) and new[-1] == eos
    print("prompt ids: " + " ".join(str(i) for i in ids[0].tolist()))
    print("new ids: " + " ".join(str(i) for i in new))
    print(f"eos: {eos}")
    print(f"stopped at eos: {'yes' if stopped else 'no'}")
    print("text: " + json.dumps(tokenizer.decode(new[:-1] if stopped else new)))


def narrowed(fp32_dir, narrow_dir):
    auto = {"dtype" if TRANSFORMERS_5 else "torch_dtype": "auto"}
    exact = AutoModelForCausalLM.from_pretrained(fp32_dir, **auto)
    narrow = AutoModelForCausalLM.from_pretrained(narrow_dir, **auto)
    with open(os.path.join(narrow_dir, "config.json")) as f:
        want = getattr(torch, json.load(f)["torch_dtype"])
    theirs = dict(narrow.named_parameters())
    count = 0
    for name, p in exact.named_parameters():
        q = theirs[name]
        if q.dtype != want or p.dtype != torch.float32:
            print(f"FAIL: {name} is {q.dtype} (want {want}), the fp32 export's {p.dtype}")
            sys.exit(1)
        if not torch.equal(p.detach().to(want), q.detach()):
            print(f"FAIL: {name} differs from torch's rounding of the fp32 export")
            sys.exit(1)
        count += 1
    print(f"{count} parameters of {type(narrow).__name__} are the fp32 export's in {want}")


# The scaled-RoPE Llamas (rope_theta 500000, Llama 3's): KIND -> (max_position_embeddings, rope
# scaling). The original context is 16 and the tests run 64 tokens, so the scaling matters. yarn
# takes its base length from max_position_embeddings in transformers 4.46 and from
# original_max_position_embeddings in 5.x: 16 for 4.x, 64 (as 5.x models are saved) for 5.x.
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5
SCALED = {
    "llama3": (64, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=16)),
    "linear": (64, dict(rope_type="linear", factor=4.0)),
    "dynamic": (16, dict(rope_type="dynamic", factor=4.0)),  # grows beyond max_position_embeddings
    "yarn": (64 if TRANSFORMERS_5 else 16,
             dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                  original_max_position_embeddings=16)),
}


def has(model_type):
    """Whether this transformers knows the model_type (Qwen 3's came in 4.51)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return model_type in CONFIG_MAPPING_NAMES


def build(kind):
    """The randomly initialised model of KIND (fixed seed), or None when this transformers has none."""
    torch.manual_seed(7)
    common = dict(vocab_size=256, tie_word_embeddings=kind == "gpt2")
    if kind in ("qwen3", "qwen3_moe") and not has(kind):
        return None
    if kind.startswith("deepseek_v3") and not has("deepseek_v3"):
        return None
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_embd=48, n_layer=2, n_head=4, n_positions=64, n_inner=96,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        model = transformers.GPT2LMHeadModel(config)
    else:
        # rope_theta 500000 (Llama 3's): transformers 5 saves it inside rope_parameters.
        llama = dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     rms_norm_eps=1e-5, rope_theta=500000.0, **common)
        if kind in SCALED:
            llama["max_position_embeddings"], scaling = SCALED[kind]
            model = transformers.LlamaForCausalLM(
                transformers.LlamaConfig(rope_scaling=dict(scaling), **llama))
        elif kind == "llama":
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama))
        elif kind == "qwen2":  # tied, as Qwen 2.5's small models are; q/k/v biases
            llama["tie_word_embeddings"] = True
            model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
                use_sliding_window=False, **llama))
        elif kind == "mistral":  # a window of 8 positions on the 20-token prompt
            model = transformers.MistralForCausalLM(transformers.MistralConfig(
                sliding_window=8, **llama))
        elif kind == "qwen3":  # tied; heads 16 wide: q_proj 48 -> 64
            llama["tie_word_embeddings"] = True
            model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
                head_dim=16, use_sliding_window=False, **llama))
        elif kind == "qwen3_moe":  # 4 experts of width 32, top-2, renormalised
            model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
                head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                norm_topk_prob=True, use_sliding_window=False, **llama))
        elif kind == "deepseek_v3":
            model = transformers.DeepseekV3ForCausalLM(deepseek_v3_config(llama, True))
        elif kind == "deepseek_v3_plain":
            model = transformers.DeepseekV3ForCausalLM(deepseek_v3_config(llama, False))
        else:
            model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
                num_local_experts=4, num_experts_per_tok=2, sliding_window=None, **llama))
    # Larger than the default init, so that the logits are far from uniform.
    # Biases too (transformers starts them at zero), so that importing them is checked; and
    # DeepSeek's choice bias (a buffer), so that it steers the routing.
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
        for name, p in model.named_parameters():
            if p.dim() > 1 or name.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif name.endswith("norm.weight"):  # the q/k norms' and the others' scales too
                p.normal_(1.0, 0.1)
    return model.eval()


def deepseek_v3_config(llama, full):
    """DeepSeek-V3 in miniature on the Llama fixtures' trunk: three layers (the first dense), 4 heads of
    multi-head latent attention (8 + 8 query/key channels, 12 value channels, kv rank 16), 8 routed
    experts of width 16, top-3, one shared expert, sigmoid scores renormalised and scaled by 2.5.
    `full`: as DeepSeek-V3 itself: a query rank (12), rope channels interleaved, group-limited
    routing (4 groups, the best 2) and yarn (factor 4 over 16 positions) with mscale_all_dim, so
    that the softmax scale changes too. Else q_proj, rope_interleave false, plain RoPE, no groups."""
    rope = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
                mscale=1.0, mscale_all_dim=1.0) if full else dict(rope_type="default", rope_theta=10000.0)
    shape = {k: v for k, v in llama.items() if k not in ("rope_theta", "num_key_value_heads")}
    shape.update(num_hidden_layers=3, rms_norm_eps=1e-6)
    return transformers.DeepseekV3Config(
        num_key_value_heads=4, q_lora_rank=12 if full else None, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=3, moe_intermediate_size=16, n_shared_experts=1,
        routed_scaling_factor=2.5, n_group=4 if full else 1, topk_group=2 if full else 1,
        first_k_dense_replace=1, norm_topk_prob=True, rope_interleave=full,
        rope_parameters=rope, **shape)


def make(kind, out_dir, tokens, dtype=torch.float32, max_shard_size="40KB"):
    """Saves the model of KIND to OUT_DIR with weights of `dtype` (bf16, f16: the fp32 weights are
    rounded to it first, and the logits are those of the rounded weights in fp32) and its logits on
    `tokens` in reference_logits.safetensors."""
    model = build(kind)
    if model is None:
        print(f"transformers {transformers.__version__} has no {kind} model")
        sys.exit(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
        for name, b in model.named_buffers():  # DeepSeek's choice bias is saved too
            if name.endswith("e_score_correction_bias"):
                b.copy_(b.to(dtype).float())
    # The logits before the model is cast for saving: the cast would round its RoPE inv_freq buffer
    # too, which transformers computes in fp32 when it loads the model.
    ids = torch.tensor([int(t) for t in tokens])
    with torch.no_grad():
        logits = model(ids[None]).logits[0]
    model.to(dtype).save_pretrained(out_dir, max_shard_size=max_shard_size, safe_serialization=True)
    write_safetensors(os.path.join(out_dir, "reference_logits.safetensors"),
                      {"tokens": ids.to(torch.int32), "logits": logits.float()})
    print(f"{type(model).__name__}: saved to {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif len(sys.argv) == 4 and sys.argv[1] == "tokenize":
        tokenize(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "generate":
        generate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 4 and sys.argv[1] == "narrowed":
        narrowed(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "has":
        sys.exit(0 if has(sys.argv[2]) else 3)
    elif len(sys.argv) >= 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        print(__doc__)
        sys.exit(2)
