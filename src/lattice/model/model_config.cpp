// Model configuration and presets: see model_config.hpp.
#include "lattice/model/model_config.hpp"

#include "lattice/core/error.hpp"

namespace lattice::model {

std::string family_name(Family family) {
  switch (family) {
    case Family::gpt2:
      return "gpt2";
    case Family::llama:
      return "llama";
    case Family::qwen2:
      return "qwen2";
    case Family::qwen3:
      return "qwen3";
    case Family::mistral:
      return "mistral";
    case Family::deepseek:
      return "deepseek";
  }
  return "unknown";
}

Family parse_family(const std::string& name) {
  if (name == "gpt2") return Family::gpt2;
  if (name == "llama") return Family::llama;
  if (name == "qwen2") return Family::qwen2;
  if (name == "qwen3") return Family::qwen3;
  if (name == "mistral") return Family::mistral;
  if (name == "deepseek") return Family::deepseek;
  throw Error("unknown model family '" + name +
              "': use \"gpt2\", \"llama\", \"mistral\", \"qwen2\", \"qwen3\" or \"deepseek\"");
}

std::string moe_names_name(MoeNames names) {
  return names == MoeNames::mixtral ? "mixtral" : "deepseek";
}

MoeNames parse_moe_names(const std::string& name) {
  if (name == "mixtral") return MoeNames::mixtral;
  if (name == "deepseek") return MoeNames::deepseek;
  throw Error("unknown model.moe_names '" + name + "': use \"mixtral\" or \"deepseek\"");
}

std::string moe_activation_name(MoeActivation activation) {
  return activation == MoeActivation::swiglu ? "swiglu" : "gelu";
}

MoeActivation parse_moe_activation(const std::string& name) {
  if (name == "swiglu") return MoeActivation::swiglu;
  if (name == "gelu") return MoeActivation::gelu;
  throw Error("unknown model.moe_activation '" + name + "': use \"swiglu\" or \"gelu\"");
}

std::string router_score_name(kernels::RouterScore score) {
  return score == kernels::RouterScore::softmax ? "softmax" : "sigmoid";
}

kernels::RouterScore parse_router_score(const std::string& name) {
  if (name == "softmax") return kernels::RouterScore::softmax;
  if (name == "sigmoid") return kernels::RouterScore::sigmoid;
  throw Error("unknown model.moe_score '" + name + "': use \"softmax\" or \"sigmoid\"");
}

void ModelConfig::validate() const {
  auto positive = [](const char* key, int64_t value) {
    check(value > 0,
          "model." + std::string(key) + " must be positive, got " + std::to_string(value));
  };
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("ffn_hidden", ffn_hidden);
  check(explicit_head_dim >= 0,
        "model.head_dim must not be negative (0: d_model / n_heads, else each head's width)");
  check(explicit_head_dim > 0 || d_model % n_heads == 0,
        "model.d_model (" + std::to_string(d_model) + ") is not divisible by model.n_heads (" +
            std::to_string(n_heads) +
            "): choose heads that divide it, or give each head its width (model.head_dim)");
  check(sliding_window >= 0,
        "model.sliding_window must not be negative (0: no window, else the "
        "positions each query sees, itself included)");
  check(n_heads % n_kv_heads == 0,
        "model.n_heads (" + std::to_string(n_heads) + ") is not a multiple of model.n_kv_heads (" +
            std::to_string(n_kv_heads) + "): grouped-query attention needs whole groups");
  if (family == Family::gpt2) {
    check(!rope_scaling.scaled(),
          "gpt2 models have learned positions, no RoPE: leave model.rope_type at default");
    check(n_kv_heads == n_heads,
          "gpt2 models have no grouped-query attention: set model.n_kv_heads "
          "equal to model.n_heads (" +
              std::to_string(n_heads) + ")");
    check(explicit_head_dim == 0 || explicit_head_dim * n_heads == d_model,
          "gpt2 models' heads are d_model / n_heads wide (one packed q | k | v projection): leave "
          "model.head_dim at 0");
    check(sliding_window == 0,
          "gpt2 models attend to every earlier position: leave model.sliding_window at 0 (a "
          "sliding window is Mistral's: model.family = \"mistral\")");
  } else if (latent_attention()) {
    validate_latent_attention();
    rope_scaling.validate();
  } else {
    check(head_dim() % 2 == 0, family_name(family) +
                                   " models need an even head dimension for RoPE, got " +
                                   std::to_string(head_dim()) + ": change d_model or n_heads");
    rope_scaling.validate();
  }
  check(n_experts >= 1 && top_k >= 1 && top_k <= n_experts,
        "model.top_k (" + std::to_string(top_k) +
            ") must be in [1, model.n_experts = " + std::to_string(n_experts) +
            "]: route each token to at least one and at most every "
            "expert (n_experts = 1: a dense model)");
  check(latent_attention() ||
            (q_lora_rank == 0 && qk_nope_head_dim == 0 && qk_rope_head_dim == 0 && v_head_dim == 0),
        "model.q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim are multi-head "
        "latent attention's: set model.kv_lora_rank > 0 (family deepseek) or leave them at 0");
  check(moe_first_dense_layers >= 0 && moe_first_dense_layers <= n_layers,
        "model.moe_first_dense_layers = " + std::to_string(moe_first_dense_layers) +
            " must be in [0, model.n_layers = " + std::to_string(n_layers) + "]");
  if (is_moe()) {
    check(moe_layer_interval >= 1 && moe_layer_interval <= n_layers,
          "model.moe_layer_interval = " + std::to_string(moe_layer_interval) +
              " must be in [1, model.n_layers = " + std::to_string(n_layers) +
              "]: layer i is a MoE layer when (i + 1) % interval == 0");
    check(moe_ffn_hidden >= 0 && moe_shared_experts >= 0,
          "model.moe_ffn_hidden and model.moe_shared_experts must not be negative (0: "
          "ffn_hidden, and no shared expert)");
    check(!moe_capacity_factor || *moe_capacity_factor > 0,
          "model.moe_capacity_factor = " +
              std::to_string(moe_capacity_factor ? *moe_capacity_factor : 0.0) +
              " must be positive (each expert keeps ceil(factor x tokens x top_k / experts) "
              "copies); leave it out for dropless routing");
    check(moe_bias_update_rate >= 0,
          "model.moe_bias_update_rate must not be negative (0: no auxiliary-loss-free bias)");
    check(moe_groups >= 1 && n_experts % moe_groups == 0 &&
              (moe_groups == 1 || n_experts / moe_groups >= 2),
          "model.moe_groups = " + std::to_string(moe_groups) +
              " must divide model.n_experts = " + std::to_string(n_experts) +
              " into groups of at least 2 experts (a group scores by its two best; 1: no groups)");
    check(moe_top_groups >= 1 && moe_top_groups <= moe_groups &&
              top_k <= moe_top_groups * (n_experts / moe_groups),
          "model.moe_top_groups = " + std::to_string(moe_top_groups) + " must be in [1, " +
              "model.moe_groups = " + std::to_string(moe_groups) +
              "] and its groups must hold at least model.top_k = " + std::to_string(top_k) +
              " experts");
    check(moe_aux_loss_coef >= 0 && moe_z_loss_coef >= 0,
          "model.moe_aux_loss_coef and model.moe_z_loss_coef must not be negative (0: off)");
    check(moe_scaling > 0,
          "model.moe_scaling must be positive (1: the routed weights as they are)");
  }
  check(dropout >= 0 && dropout < 1,
        "model.dropout = " + std::to_string(dropout) + " must be in [0, 1) (0: no dropout)");
  check(norm_eps > 0, "model.norm_eps must be positive");
  check(init_std > 0, "model.init_std must be positive");
}

void ModelConfig::validate_latent_attention() const {
  check(
      family == Family::deepseek,
      "model.kv_lora_rank > 0 (multi-head latent attention) is built in the deepseek family only, "
      "not " +
          family_name(family) + ": set model.family = \"deepseek\" or model.kv_lora_rank = 0");
  check(q_lora_rank >= 0, "model.q_lora_rank must not be negative (0: one q_proj)");
  check(qk_nope_head_dim > 0 && qk_rope_head_dim > 0 && v_head_dim > 0,
        "multi-head latent attention needs model.qk_nope_head_dim, qk_rope_head_dim and v_head_dim "
        "positive (DeepSeek-V3: 128, 64, 128)");
  check(qk_rope_head_dim % 2 == 0, "model.qk_rope_head_dim (" + std::to_string(qk_rope_head_dim) +
                                       ") must be even: RoPE rotates channel pairs");
  check(explicit_head_dim == 0,
        "model.head_dim is qk_nope_head_dim + qk_rope_head_dim under multi-head latent attention: "
        "leave it at 0");
  check(n_kv_heads == n_heads,
        "multi-head latent attention has as many key/value heads as query "
        "heads: set model.n_kv_heads = model.n_heads (" +
            std::to_string(n_heads) + ")");
  check(sliding_window == 0,
        "multi-head latent attention has no sliding window: leave model.sliding_window at 0");
}

int64_t ModelConfig::attention_parameter_count() const {
  const int64_t C = d_model, H = n_heads;
  if (latent_attention()) {
    const int64_t qk = head_dim(), r = q_lora_rank, c = kv_lora_rank;
    const int64_t q = r > 0 ? C * r + r + r * H * qk : C * H * qk;  // q_a, its norm, q_b / q_proj
    return q + C * (c + qk_rope_head_dim)                           // kv_a_proj_with_mqa
           + c                                                      // kv_a_layernorm
           + c * H * (qk_nope_head_dim + v_head_dim)                // kv_b_proj
           + H * v_head_dim * C;                                    // o_proj
  }
  const int64_t kv = n_kv_heads * head_dim(), A = attention_width();
  return A * C + 2 * kv * C                  // q, k, v
         + (qkv_bias() ? A + 2 * kv : 0)     // their biases (Qwen 2)
         + (qk_norm() ? 2 * head_dim() : 0)  // the q and k norms (Qwen 3)
         + C * A;                            // o_proj
}

int64_t ModelConfig::attention_projection_macs() const {
  const int64_t C = d_model, H = n_heads;
  if (latent_attention()) {
    const int64_t qk = head_dim(), r = q_lora_rank, c = kv_lora_rank;
    return (r > 0 ? C * r + r * H * qk : C * H * qk) + C * (c + qk_rope_head_dim) +
           c * H * (qk_nope_head_dim + v_head_dim) + H * v_head_dim * C;
  }
  const int64_t kv = n_kv_heads * head_dim(), A = attention_width();
  return C * A + 2 * C * kv + A * C;
}

int64_t ModelConfig::parameter_count(bool with_position_embedding) const {
  const int64_t C = d_model;
  int64_t per_layer = 0, embed = vocab_size * C, head = tied_embeddings ? 0 : vocab_size * C;
  if (family == Family::gpt2) {
    per_layer = 2 * C                          // ln_1
                + 3 * C * C + 3 * C            // c_attn
                + C * C + C                    // attn c_proj
                + 2 * C                        // ln_2
                + ffn_hidden * C + ffn_hidden  // c_fc
                + C * ffn_hidden + C;          // mlp c_proj
    int64_t final_norm = 2 * C;
    int64_t positions = with_position_embedding ? max_seq_len * C : 0;
    return embed + positions + n_layers * per_layer + final_norm + head;
  }
  per_layer = C                              // input_layernorm
              + attention_parameter_count()  // projections (and MLA's latent norms)
              + C;                           // post_attention_layernorm
  const int64_t dense_mlp = 3 * ffn_hidden * C;
  const int64_t expert = expert_matrices() * expert_ffn_hidden() * C;
  const int64_t shared = 3 * expert_ffn_hidden() * C;  // shared experts are SwiGLU
  const int64_t moe_mlp = n_experts * (C + expert) + moe_shared_experts * shared  // router, experts
                          + (has_choice_bias() ? n_experts : 0);  // e_score_correction_bias
  const int64_t moe = moe_layers();
  return embed + n_layers * per_layer + (n_layers - moe) * dense_mlp + moe * moe_mlp + C + head;
}

int64_t ModelConfig::active_parameter_count(bool with_position_embedding) const {
  const int64_t idle = n_experts - top_k;  // routed experts a token does not visit
  return parameter_count(with_position_embedding) -
         moe_layers() * idle * expert_matrices() * expert_ffn_hidden() * d_model;
}

double ModelConfig::flops_per_token(int64_t seq_len) const {
  // Under latent attention the scores span qk_head_dim and the values v_head_dim channels per
  // head: 6·L·T·H·(qk + v), which is 12·L·T·A when both are head_dim.
  const double width = latent_attention()
                           ? 0.5 * static_cast<double>(n_heads * (head_dim() + v_head_dim))
                           : static_cast<double>(attention_width());
  return 6.0 * static_cast<double>(active_parameter_count(false)) +
         12.0 * static_cast<double>(n_layers) * static_cast<double>(attended_keys(seq_len)) * width;
}

ModelConfig gpt2_config(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                        int64_t vocab, int64_t seq) {
  ModelConfig c;
  c.name = name;
  c.family = Family::gpt2;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = heads;
  c.ffn_hidden = 4 * d;
  c.tied_embeddings = true;
  return c;
}

ModelConfig llama_config(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                         int64_t kv_heads, int64_t ffn, int64_t vocab, int64_t seq) {
  ModelConfig c;
  c.name = name;
  c.family = Family::llama;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.ffn_hidden = ffn;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tied_embeddings = false;
  return c;
}

ModelConfig qwen2_config(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                         int64_t kv_heads, int64_t ffn, int64_t vocab, int64_t seq, bool tied) {
  ModelConfig c = llama_config(name, layers, d, heads, kv_heads, ffn, vocab, seq);
  c.family = Family::qwen2;
  c.norm_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.tied_embeddings = tied;
  return c;
}

ModelConfig qwen3_config(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, int64_t ffn, int64_t vocab,
                         int64_t seq, bool tied) {
  ModelConfig c = qwen2_config(name, layers, d, heads, kv_heads, ffn, vocab, seq, tied);
  c.family = Family::qwen3;
  c.explicit_head_dim = head_dim == d / heads ? 0 : head_dim;
  return c;
}

ModelConfig mistral_config(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                           int64_t kv_heads, int64_t ffn, int64_t vocab, int64_t seq,
                           int64_t window) {
  ModelConfig c = llama_config(name, layers, d, heads, kv_heads, ffn, vocab, seq);
  c.family = Family::mistral;
  c.sliding_window = window;
  return c;
}

ModelConfig deepseek_config(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                            const LatentDims& latent, int64_t ffn, int64_t vocab, int64_t seq) {
  ModelConfig c = llama_config(name, layers, d, heads, heads, ffn, vocab, seq);
  c.family = Family::deepseek;
  c.norm_eps = 1e-6f;
  c.q_lora_rank = latent.q_lora_rank;
  c.kv_lora_rank = latent.kv_lora_rank;
  c.qk_nope_head_dim = latent.qk_nope_head_dim;
  c.qk_rope_head_dim = latent.qk_rope_head_dim;
  c.v_head_dim = latent.v_head_dim;
  c.moe_names = MoeNames::deepseek;
  return c;
}

// DeepSeek-V3's MoE recipe on `c`: `experts` routed experts of width `expert_ffn`, top `k`, one
// shared expert, sigmoid scores renormalised and scaled by 2.5, the first `dense` layers dense.
static ModelConfig with_deepseek_moe(ModelConfig c, int64_t experts, int64_t k, int64_t expert_ffn,
                                     int64_t dense) {
  c.n_experts = experts;
  c.top_k = k;
  c.moe_ffn_hidden = expert_ffn;
  c.moe_shared_experts = 1;
  c.moe_first_dense_layers = dense;
  c.moe_score = kernels::RouterScore::sigmoid;
  c.moe_normalize = true;
  c.moe_scaling = 2.5f;
  c.moe_names = MoeNames::deepseek;
  return c;
}

namespace {

// The GPT models of the published Megatron-LM and Korthikanti tables: V = 51200, s = 2048, and
// dropout (its masks are part of the tables' activation memory).
ModelConfig megatron_gpt(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                         int64_t vocab = 51200, int64_t seq = 2048) {
  ModelConfig c = gpt2_config(name, layers, d, heads, vocab, seq);
  c.dropout = 0.1f;
  return c;
}

ModelConfig with_rope_theta(ModelConfig c, float theta) {
  c.rope_theta = theta;
  return c;
}

// Llama 3.1 / 3.2's RoPE: base 500000, llama3 scaling of an 8192-token context by `factor`.
ModelConfig with_llama3_scaling(ModelConfig c, double factor, bool tied) {
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = kernels::RopeType::llama3;
  c.rope_scaling.factor = factor;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_positions = 8192;
  c.tied_embeddings = tied;
  return c;
}

// Qwen3-MoE's layers on a Qwen 3 trunk: `experts` routed experts of `width`, top `top_k` softmax,
// renormalised, in every layer, no shared expert, Hugging Face's names and aux-loss coefficient.
ModelConfig with_qwen3_experts(ModelConfig c, int64_t experts, int64_t top_k, int64_t width) {
  c.n_experts = experts;
  c.top_k = top_k;
  c.moe_ffn_hidden = width;
  c.moe_names = MoeNames::deepseek;
  c.moe_aux_loss_coef = 0.001;
  return c;
}

std::vector<ModelConfig> build_presets() {
  std::vector<ModelConfig> p;
  // The trainer's small models (tests, the demo, benchmarks).
  p.push_back(gpt2_config("gpt2-tiny", 2, 32, 4, 64, 32));
  p.push_back(gpt2_config("gpt2-small-test", 4, 256, 4, 8192, 256));
  p.push_back(gpt2_config("gpt2-demo", 4, 192, 6, 256, 128));
  p.push_back(llama_config("llama-tiny", 2, 32, 4, 2, 64, 64, 32));
  p.push_back(llama_config("llama-small-test", 4, 256, 8, 4, 688, 8192, 256));
  p.push_back(qwen2_config("qwen2-tiny", 2, 32, 4, 2, 64, 64, 32, true));
  // Qwen 3 with heads of their own width (4 x 16 = 64 query channels on a 32-wide model, as
  // Qwen3-30B-A3B's 32 x 128 on 2048); Mistral with a window of 8 on 32 positions.
  p.push_back(qwen3_config("qwen3-tiny", 2, 32, 4, 2, 16, 64, 64, 32, true));
  p.push_back(mistral_config("mistral-tiny", 2, 32, 4, 2, 64, 64, 32, 8));
  // Mixture-of-experts test models on llama-tiny's trunk: Mixtral-style (4 experts of the dense
  // width, top-2, softmax, every layer) and DeepSeek/Qwen-MoE-style (8 fine-grained experts of a
  // quarter width, top-2, one shared expert, sigmoid scores, MoE in the second layer only).
  ModelConfig mixtral_tiny = llama_config("mixtral-tiny", 2, 32, 4, 2, 64, 64, 32);
  mixtral_tiny.n_experts = 4;
  mixtral_tiny.top_k = 2;
  mixtral_tiny.moe_aux_loss_coef = 0.01;
  p.push_back(mixtral_tiny);
  ModelConfig deepseek_tiny = llama_config("deepseek-moe-tiny", 2, 32, 4, 2, 64, 64, 32);
  deepseek_tiny.n_experts = 8;
  deepseek_tiny.top_k = 2;
  deepseek_tiny.moe_ffn_hidden = 16;
  deepseek_tiny.moe_shared_experts = 1;
  deepseek_tiny.moe_layer_interval = 2;
  deepseek_tiny.moe_score = kernels::RouterScore::sigmoid;
  deepseek_tiny.moe_names = MoeNames::deepseek;
  deepseek_tiny.moe_aux_loss_coef = 0.001;
  p.push_back(deepseek_tiny);
  // Qwen3-MoE on qwen3-tiny's trunk: 8 experts of a quarter width, top-2 softmax, renormalised,
  // every layer, no shared expert (Qwen3-30B-A3B's recipe).
  p.push_back(with_qwen3_experts(qwen3_config("qwen3-moe-tiny", 2, 32, 4, 2, 16, 64, 64, 32, true),
                                 8, 2, 16));
  // DeepSeek-V3 in miniature: multi-head latent attention (query and key/value ranks 16, heads of
  // 8 + 8 query/key channels and 8 value channels), the first layer dense, then 8 routed experts
  // of width 16, top-2, one shared expert, sigmoid scores renormalised and scaled by 2.5.
  p.push_back(with_deepseek_moe(
      deepseek_config("deepseek-v3-tiny", 2, 32, 4, {16, 16, 8, 8, 8}, 64, 64, 32), 8, 2, 16, 1));
  p.push_back(llama_config("llama-60m", 8, 512, 8, 4, 1376, 32000, 1024));
  p.push_back(llama_config("llama-1b", 16, 2048, 32, 8, 8192, 128256, 2048));
  // GPT-2 (Radford et al. 2019; Hugging Face configs): V = 50257, s = 1024, tied embeddings, and
  // trained here without dropout.
  p.push_back(gpt2_config("gpt2-124m", 12, 768, 12, 50257, 1024));
  p.push_back(gpt2_config("gpt2-350m", 24, 1024, 16, 50257, 1024));
  p.push_back(gpt2_config("gpt2-774m", 36, 1280, 20, 50257, 1024));
  p.push_back(gpt2_config("gpt2-1.5b", 48, 1600, 25, 50257, 1024));
  // GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d = 12288, 96 heads, s = 2048.
  p.push_back(megatron_gpt("gpt3-175b", 96, 12288, 96, 50257, 2048));
  // Llama 2 (Touvron et al. 2023): V = 32000, s = 4096; 70B uses 8 KV heads.
  p.push_back(llama_config("llama-7b", 32, 4096, 32, 32, 11008, 32000, 4096));
  p.push_back(llama_config("llama-13b", 40, 5120, 40, 40, 13824, 32000, 4096));
  p.push_back(llama_config("llama-70b", 80, 8192, 64, 8, 28672, 32000, 4096));
  // Llama 3 / 3.1 (Dubey et al. 2024): V = 128256, 8 KV heads, s = 8192, RoPE base 500000.
  p.push_back(
      with_rope_theta(llama_config("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192), 500000.0f));
  p.push_back(
      with_rope_theta(llama_config("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192), 500000.0f));
  p.push_back(with_rope_theta(llama_config("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
                              500000.0f));
  // Llama 3.1 8B and 3.2 1B / 3B (the models' config.json): s = 131072 by llama3 RoPE scaling of
  // an 8192-token pre-training context (factor 8 for 3.1, 32 for 3.2); 3.2 ties its head.
  p.push_back(with_llama3_scaling(
      llama_config("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072), 8.0, false));
  p.push_back(with_llama3_scaling(
      llama_config("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072), 32.0, true));
  p.push_back(with_llama3_scaling(
      llama_config("llama3.2-3b", 28, 3072, 24, 8, 8192, 128256, 131072), 32.0, true));
  // Mistral 7B v0.1 (Jiang et al. 2023, its config.json): a 4096-position sliding window,
  // s = 32768.
  p.push_back(mistral_config("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, 4096));
  // Qwen 2.5 (Qwen team 2024, the models' config.json): V = 151936 (0.5B) / 152064 (7B), RoPE
  // base 10^6, s = 32768; 0.5B ties its head to the embedding.
  p.push_back(qwen2_config("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, 32768, true));
  p.push_back(qwen2_config("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, false));
  // Qwen 3 (Qwen team 2025, the models' config.json): V = 151936, heads 128 wide, RoPE base 10^6,
  // s = 40960; 30B-A3B: 128 experts of width 768, top-8, renormalised, in every layer.
  p.push_back(qwen3_config("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, 40960, false));
  p.push_back(with_qwen3_experts(
      qwen3_config("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, 40960, false), 128, 8,
      768));
  // Mixtral 8x7B (Jiang et al. 2024): Mistral-7B blocks with 8 experts, top-2 routing.
  ModelConfig mixtral = with_rope_theta(
      llama_config("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096), 1000000.0f);
  mixtral.n_experts = 8;
  mixtral.top_k = 2;
  p.push_back(mixtral);
  // DeepSeek-V3 (DeepSeek-AI 2024, its config.json): 61 layers, hidden 7168, 128 heads of MLA
  // (q rank 1536, kv rank 512, 128 + 64 query/key and 128 value channels), the first 3 layers dense
  // (18432), then 256 routed experts of width 2048, top-8, one shared expert, sigmoid scores
  // renormalised and scaled by 2.5; V = 129280, s = 163840, untied. Its counts are the Hugging
  // Face checkpoint's without the multi-token-prediction module (~671B total, ~37B activated; the
  // published 671B leaves the 14B MTP module out as well). Group-limited routing (8 groups, the
  // best 4), the choice bias, and yarn over its 4096-token pre-training context (factor 40,
  // mscale and mscale_all_dim 1: the softmax scale times 1.369^2).
  ModelConfig deepseek_v3 =
      with_deepseek_moe(deepseek_config("deepseek-v3", 61, 7168, 128, {1536, 512, 128, 64, 128},
                                        18432, 129280, 163840),
                        256, 8, 2048, 3);
  deepseek_v3.moe_groups = 8;
  deepseek_v3.moe_top_groups = 4;
  deepseek_v3.moe_choice_bias = true;
  deepseek_v3.rope_scaling.type = kernels::RopeType::yarn;
  deepseek_v3.rope_scaling.factor = 40;
  deepseek_v3.rope_scaling.original_max_positions = 4096;
  deepseek_v3.rope_scaling.mscale = deepseek_v3.rope_scaling.mscale_all_dim = 1.0;
  p.push_back(deepseek_v3);
  // Megatron-LM weak scaling (Narayanan et al., SC21, Table 1): V = 51200, s = 2048.
  p.push_back(megatron_gpt("megatron-1.7b", 24, 2304, 24));
  p.push_back(megatron_gpt("megatron-3.6b", 30, 3072, 32));
  p.push_back(megatron_gpt("megatron-7.5b", 36, 4096, 32));
  p.push_back(megatron_gpt("megatron-18.4b", 40, 6144, 48));
  p.push_back(megatron_gpt("megatron-39.1b", 48, 8192, 64));
  p.push_back(megatron_gpt("megatron-76.1b", 60, 10240, 80));
  p.push_back(megatron_gpt("megatron-145.6b", 80, 12288, 96));
  p.push_back(megatron_gpt("megatron-310.1b", 96, 16384, 128));
  p.push_back(megatron_gpt("megatron-529.6b", 105, 20480, 128));
  p.push_back(megatron_gpt("megatron-1t", 128, 25600, 160));
  // Korthikanti et al. (MLSys 2023), Table 3: V = 51200, s = 2048.
  p.push_back(megatron_gpt("korthikanti-22b", 48, 6144, 64));
  p.push_back(megatron_gpt("korthikanti-175b", 96, 12288, 96));
  p.push_back(megatron_gpt("korthikanti-530b", 105, 20480, 128));
  p.push_back(megatron_gpt("korthikanti-1t", 128, 25600, 160));
  return p;
}

}  // namespace

const std::vector<ModelConfig>& model_presets() {
  static const std::vector<ModelConfig> table = build_presets();
  return table;
}

ModelConfig model_preset(const std::string& name) {
  for (const ModelConfig& preset : model_presets())
    if (preset.name == name) return preset;
  std::string names;
  for (const ModelConfig& preset : model_presets())
    names += (names.empty() ? "" : ", ") + preset.name;
  throw Error("unknown model preset '" + name + "': choose one of " + names);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelConfig& preset : model_presets()) names.push_back(preset.name);
  return names;
}

}  // namespace lattice::model
