// DeepSeek-V3 as transformers saves it (model_type deepseek_v3, transformers 5.x) <-> Lattice's
// deepseek family: the config.json keys of its multi-head latent attention and its MoE (sigmoid
// router with the choice bias e_score_correction_bias, group-limited routing, shared experts, the
// first layers dense), and how its weights lie beyond their names: the rope channels of q_b_proj
// (or q_proj) and kv_a_proj_with_mqa in interleaved pairs (rope_interleave, transformers' default
// and DeepSeek's own layout), which Lattice's RoPE takes as two halves, and the multi-token-
// prediction layers after the model's (num_nextn_predict_layers), which transformers does not load
// and neither does Lattice. hf_config.hpp calls the config half, hf_format.hpp the weights half.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "lattice/core/tensor.hpp"
#include "lattice/model/model_config.hpp"

namespace lattice::train {

// Reads a deepseek_v3 config.json's shape, latent attention and MoE into `c` (not RoPE: the
// caller reads it as for every family). What Lattice cannot compute is one Error line naming the
// key; the settings read but not applied (DeepSeek's sequence-wise balance loss) are appended to
// `ignored` when given.
void read_hf_deepseek_v3(const nlohmann::json& j, const std::string& source, model::ModelConfig& c,
                         std::vector<std::string>* ignored);

// Throws Error naming what of a deepseek-family `c` transformers' deepseek_v3 cannot express.
void check_deepseek_v3_exportable(const model::ModelConfig& c);

// deepseek_v3's keys for `c` into `j` (RoPE aside; yarn's mscale keys are added to the
// rope_scaling the caller wrote, since DeepSeek's softmax scale reads mscale_all_dim).
void write_hf_deepseek_v3(const model::ModelConfig& c, nlohmann::json& j);

// How a config.json's weights lie: interleaved rope channels (deepseek_v3 with rope_interleave,
// its default), and the layers [n_layers, n_layers + prediction_layers) of multi-token prediction.
struct HfWeightLayout {
  bool interleaved_rope = false;
  int64_t n_layers = 0, prediction_layers = 0;
  // Whether `name` is a weight of one of the multi-token-prediction layers.
  bool is_prediction_weight(const std::string& name) const;
};
HfWeightLayout hf_weight_layout(const nlohmann::json& config);

// Reorders, in place, the rope rows of weight `name` of `config` ([rows, cols] row-major): each
// q_b_proj / q_proj head's last qk_rope_head_dim rows and kv_a_proj_with_mqa's last
// qk_rope_head_dim rows, from interleaved pairs (x0, x1), (x2, x3), ... to Lattice's halves
// (x0, x2, ..., x1, x3, ...), or back with `to_interleaved`. Other tensors are left as they are.
void reorder_rope_rows(const model::ModelConfig& config, const std::string& name, float* values,
                       int64_t cols, bool to_interleaved);

// The tensors transformers' deepseek_v3 has and `config` does not, which are zero where the model
// has none: each MoE layer's e_score_correction_bias when the model keeps no choice bias.
std::vector<std::pair<std::string, Shape>> hf_zero_tensors(const model::ModelConfig& config);

}  // namespace lattice::train
