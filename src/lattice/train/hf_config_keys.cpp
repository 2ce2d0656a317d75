// The key lists of Hugging Face config.json files: see hf_config_keys.hpp.
#include "lattice/train/hf_config_keys.hpp"

#include <map>
#include <set>

#include "lattice/core/error.hpp"

namespace lattice::train {

using nlohmann::json;

namespace {

// Keys of every transformers config that leave the model's arithmetic alone: bookkeeping, label
// maps, token ids (the tokenizer's business), output switches and the generation defaults old
// configs carry.
const std::set<std::string>& bookkeeping_keys() {
  static const std::set<std::string> keys = {
      "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype",
      "dtype", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
      "decoder_start_token_id", "use_cache", "initializer_range", "id2label", "label2id",
      "return_dict", "output_hidden_states", "output_attentions", "torchscript", "is_decoder",
      "chunk_size_feed_forward", "problem_type", "tokenizer_class", "prefix",
      "task_specific_params", "finetuning_task", "tie_encoder_decoder",
      "cross_attention_hidden_size", "is_encoder_decoder",
      "pruned_heads",  // checked below: false, and none
      // Generation defaults (transformers 4.x configs; generation_config.json holds them now).
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
      "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
      "num_return_sequences", "diversity_penalty", "output_scores", "return_dict_in_generate",
      "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
      // transformers' pretraining_tp > 1 splits each projection into slices it sums: the same
      // products in another order. MoE: whether the forward returns the router logits.
      "pretraining_tp", "output_router_logits"};
  return keys;
}

// Probabilities of training-time noise, which Lattice does not apply: reported when nonzero.
const std::set<std::string>& noise_keys() {
  static const std::set<std::string> keys = {"attention_dropout", "resid_pdrop", "embd_pdrop",
                                             "attn_pdrop", "router_jitter_noise"};
  return keys;
}

// What model_config_from_hf reads for each model type.
const std::set<std::string>& read_keys(const std::string& type) {
  static const std::set<std::string> llama_common = {"vocab_size",
                                                     "hidden_size",
                                                     "intermediate_size",
                                                     "num_hidden_layers",
                                                     "num_attention_heads",
                                                     "num_key_value_heads",
                                                     "max_position_embeddings",
                                                     "rms_norm_eps",
                                                     "head_dim",
                                                     "rope_theta",
                                                     "rope_scaling",
                                                     "rope_parameters",
                                                     "partial_rotary_factor",
                                                     "original_max_position_embeddings",
                                                     "tie_word_embeddings",
                                                     "hidden_act",
                                                     "attention_bias",
                                                     "sliding_window",
                                                     "use_sliding_window",
                                                     "max_window_layers",
                                                     "layer_types"};
  static const std::map<std::string, std::set<std::string>> extra = {
      {"gpt2",
       {"vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner",
        "activation_function", "layer_norm_epsilon", "tie_word_embeddings", "scale_attn_weights",
        "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention",
        // GPT2DoubleHeadsModel's summary head, which a causal LM does not have.
        "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
        "summary_first_dropout"}},
      {"llama", {"mlp_bias"}},
      {"mistral", {}},
      {"qwen2", {}},
      {"qwen3", {}},
      {"mixtral", {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef"}},
      {"qwen3_moe",
       {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef"}},
      // head_dim and qk_head_dim are derived (transformers sets them from qk_rope_head_dim and
      // qk_nope + qk_rope); topk_method, scoring_func, moe_layer_freq, ep_size, aux_loss_alpha
      // and seq_aux are DeepSeek's remote-code names, checked or reported by the reader
      // (ep_size: how the original code split the experts, not what they compute).
      {"deepseek_v3",
       {"q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "qk_head_dim",
        "n_routed_experts",
        "num_local_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "routed_scaling_factor",
        "n_group",
        "topk_group",
        "norm_topk_prob",
        "first_k_dense_replace",
        "rope_interleave",
        "num_nextn_predict_layers",
        "num_mtp_layers",
        "topk_method",
        "scoring_func",
        "moe_layer_freq",
        "ep_size",
        "aux_loss_alpha",
        "seq_aux"}}};
  // DeepSeek has no sliding window: its keys would be read by nothing.
  static const std::set<std::string> window_keys = {"sliding_window", "use_sliding_window",
                                                    "max_window_layers", "layer_types"};
  static std::map<std::string, std::set<std::string>> keys;
  if (keys.empty())
    for (const auto& [name, own] : extra) {
      keys[name] = own;
      if (name != "gpt2") keys[name].insert(llama_common.begin(), llama_common.end());
      if (name == "deepseek_v3")
        for (const std::string& key : window_keys) keys[name].erase(key);
    }
  return keys.at(type);
}

}  // namespace

void check_hf_config_keys(const json& config, const std::string& type, const std::string& source,
                          std::vector<std::string>* ignored) {
  const std::set<std::string>& read = read_keys(type);
  for (const auto& [key, value] : config.items()) {
    check(key != "quantization_config",
          source +
              ": quantization_config: the weights are quantized; Lattice reads F32, BF16 and "
              "F16 weights (dequantize the model and save it again)");
    check(key != "auto_map", source +
                                 ": auto_map: the model runs code of its own (trust_remote_code), "
                                 "which Lattice cannot check it computes; use a transformers type");
    if (noise_keys().count(key)) {
      if (ignored != nullptr && value.is_number() && value.get<double>() != 0)
        ignored->push_back(key + " = " + value.dump() +
                           " is not applied: Lattice trains without dropout or router noise");
      continue;
    }
    if (bookkeeping_keys().count(key) || read.count(key)) continue;
    throw Error(
        source + ": \"" + key + "\" (" + value.dump() +
        ") is not a key Lattice reads for model_type " + type +
        ", and it may change the arithmetic: remove it if it does not, or convert the model "
        "to a type Lattice computes");
  }
  // Values the keys may hold.
  const auto flag = [&](const char* key, bool fallback) {
    return config.contains(key) && config.at(key).is_boolean() ? config.at(key).get<bool>()
                                                               : fallback;
  };
  if (type == "gpt2") {
    check(flag("scale_attn_weights", true),
          source + ": scale_attn_weights is false; Lattice's attention scales by 1/sqrt(head_dim)");
    check(!flag("scale_attn_by_inverse_layer_idx", false),
          source +
              ": scale_attn_by_inverse_layer_idx is set; Lattice's attention scales every "
              "layer alike");
    check(!flag("add_cross_attention", false),
          source +
              ": add_cross_attention is set; Lattice's GPT-2 is a decoder without cross "
              "attention");
  }
  check(!flag("is_encoder_decoder", false),
        source + ": is_encoder_decoder is set; Lattice trains decoder-only models");
  if (config.contains("pruned_heads"))
    check(config.at("pruned_heads").empty(), source + ": pruned_heads " +
                                                 config.at("pruned_heads").dump() +
                                                 ": Lattice's layers have all their heads");
}

}  // namespace lattice::train
