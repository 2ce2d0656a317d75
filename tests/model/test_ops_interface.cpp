// Tests of the kernel seam (kernels/ops.hpp): a second implementation of kernels::Ops, one that
// records every call and forwards it to a CpuOps, runs GPT-2 and Llama through their stage forward
// and backward with no change to the model and gives the plain CpuOps run's loss and gradients
// bit for bit; and the ops it records are every op each model's layers must compute, called as
// often as its blocks require (a layer computing outside the interface would drop a call).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "recording_ops.hpp"

using namespace lattice;
using namespace lattice::model;
using kernels::Precision;

namespace {

using lattice::testing::OpCounts;
using lattice::testing::RecordingOps;

// Tiny models with three blocks: per-block counts (3 per block) differ from the embedding's and
// the head's single calls.
ModelConfig tiny(Family family) {
  ModelConfig c = model_preset(family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layers = 3;
  c.init_std = 0.2f;  // weights large enough that every gradient term is visible
  return c;
}
constexpr int64_t kT = 32;  // the tiny presets' whole context

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int64_t rows, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int64_t i = 0; i < rows; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    b.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  }
  b.targets[2] = -1;  // an ignored target
  return b;
}

// One whole-model forward_stage and backward_stage on `ops`: the loss and every gradient, and,
// when `recorder` is `ops`, the ops each half called.
struct StageRun {
  float loss = 0.0f;
  std::vector<float> grads;
  OpCounts forward_calls, backward_calls;
};

// The calls in `after` that were not yet in `before`.
OpCounts calls_since(const OpCounts& before, const OpCounts& after) {
  OpCounts d;
  for (const auto& [op, n] : after) {
    const auto it = before.find(op);
    const int delta = n - (it == before.end() ? 0 : it->second);
    if (delta > 0) d[op] = delta;
  }
  return d;
}

StageRun run_stage(kernels::Ops& ops, const RecordingOps* recorder, Family family,
                   Precision precision, int64_t B,
                   std::optional<HeadFusion> fusion = std::nullopt) {
  const ModelConfig config = tiny(family);
  const Batch batch = random_batch(B * kT, config.vocab_size, 11);
  const LayerContext ctx{ops, precision, nullptr};
  Transformer model(config, nullptr);
  if (fusion) model.set_head_fusion(*fusion);
  model.initialize(7);
  model.parameters().zero_grads();
  StageRun r;
  const OpCounts before = recorder ? recorder->calls() : OpCounts{};
  r.loss =
      model.forward_stage(ctx, batch.tokens.data(), nullptr, batch.targets.data(), B, kT, 0.5f);
  const OpCounts after_forward = recorder ? recorder->calls() : OpCounts{};
  model.backward_stage(ctx, nullptr);
  if (recorder) {
    r.forward_calls = calls_since(before, after_forward);
    r.backward_calls = calls_since(after_forward, recorder->calls());
  }
  const ParameterStore& params = model.parameters();
  r.grads.assign(params.grads(), params.grads() + params.size());
  return r;
}

void expect_same_bits(const StageRun& recorded, const StageRun& plain) {
  EXPECT_EQ(0, std::memcmp(&recorded.loss, &plain.loss, sizeof(float)))
      << recorded.loss << " vs " << plain.loss;
  ASSERT_EQ(recorded.grads.size(), plain.grads.size());
  EXPECT_EQ(0, std::memcmp(recorded.grads.data(), plain.grads.data(),
                           sizeof(float) * plain.grads.size()));
  int64_t nonzero = 0;
  for (float g : plain.grads) nonzero += g != 0.0f;
  EXPECT_GT(nonzero, static_cast<int64_t>(plain.grads.size()) / 2);  // a real backward ran
}

// The ops one forward (or one backward) of a whole model of L blocks calls, each as often as it
// must: per block, per norm, per Linear (GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj; Llama: q,
// k, v, o, gate, up, down), once for the embedding and once for the head. bf16 training runs the
// LM head and its loss as head_loss_bf16; its backward then adds the weight-gradient partials
// (head_backward_in_forward, the backend's plan) or is the head's linear_backward.
OpCounts expected_calls(Family family, Precision precision, int L, bool forward,
                        bool head_backward_in_forward) {
  const bool bf16 = precision == Precision::bf16;
  OpCounts c;
  if (family == Family::gpt2) {
    if (forward) {
      c["embedding_forward"] = 1;
      c["add_inplace"] = 2 * L;  // the two residual adds
      if (bf16) {
        c["layernorm_forward_bf16"] = 2 * L + 1;  // ln_1, ln_2, ln_f write the GEMMs' bf16 input
        c["linear_forward_to_bf16"] = L;          // c_attn: q, k, v in bf16
        c["attention_forward_bf16"] = L;
        c["linear_forward"] = 2 * L;        // attn.c_proj, mlp.c_proj
        c["linear_gelu_forward_bf16"] = L;  // c_fc and the GELU
        c["plan_head_loss_bf16"] = 1;
        c["head_loss_bf16"] = 1;
      } else {
        c["layernorm_forward"] = 2 * L + 1;
        c["linear_forward"] = 4 * L + 1;
        c["attention_forward"] = L;
        c["gelu_forward"] = L;
        c["cross_entropy_forward_backward"] = 1;
      }
    } else {
      c["embedding_backward"] = 1;
      c["layernorm_backward"] = 2 * L + 1;  // the residual gradient added in the same pass
      if (bf16) {
        c["linear_backward"] = 4 * L + (head_backward_in_forward ? 0 : 1);
        if (head_backward_in_forward) c["add_partials"] = 1;
        c["linear_backward_input_through_gelu_bf16"] = L;  // mlp.c_proj's input through the GELU
        c["round_with_column_sums"] = L;                   // attn.c_proj's d_out and bias
        c["attention_backward_bf16"] = L;
      } else {
        c["linear_backward"] = 4 * L + 1;
        c["attention_backward"] = L;
        c["gelu_backward"] = L;
      }
    }
    return c;
  }
  // Llama: attention in bf16 is attention_forward / backward at Precision::bf16 (fp32 q, k, v
  // after RoPE), and SwiGLU is fp32 in both precisions (its GEMMs bf16).
  if (forward) {
    c["embedding_forward"] = 1;
    // bf16: the blocks' norms write q, k, v's and gate and up's one shared bf16 input, the final
    // norm the head's bf16 input.
    if (bf16)
      c["rmsnorm_forward_bf16"] = 2 * L + 1;
    else
      c["rmsnorm_forward"] = 2 * L + 1;
    c["linear_forward"] = 7 * L + (bf16 ? 0 : 1);
    c["rope"] = 2 * L;  // q and k
    c["attention_forward"] = L;
    c["swiglu_forward"] = L;
    c["add_inplace"] = 2 * L;
    if (bf16) {
      c["plan_head_loss_bf16"] = 1;
      c["head_loss_bf16"] = 1;
    } else {
      c["cross_entropy_forward_backward"] = 1;
    }
  } else {
    c["embedding_backward"] = 1;
    c["rmsnorm_backward"] = 2 * L + 1;
    c["linear_backward"] = 7 * L + (bf16 && head_backward_in_forward ? 0 : 1);
    if (bf16 && head_backward_in_forward) c["add_partials"] = 1;
    c["rope(inverse)"] = 2 * L;
    c["attention_backward"] = L;
    c["swiglu_backward"] = L;
    c["add_inplace"] = 3 * L;  // the input gradients of q, k, v and of gate, up summed
  }
  return c;
}

std::string listing(const OpCounts& calls) {
  std::string s;
  for (const auto& [op, n] : calls) s += "  " + op + " x" + std::to_string(n) + "\n";
  return s;
}

void expect_calls(const OpCounts& recorded, const OpCounts& expected, const char* phase) {
  EXPECT_EQ(recorded, expected) << phase << " recorded:\n"
                                << listing(recorded) << "expected:\n"
                                << listing(expected);
}

// (family, precision, B): T = 32, so B = 9 gives 288 rows (CpuOps's fused bf16 Linears in
// 256-row chunks and a tail) and B = 2 gives 64 (fewer than a chunk: the unchunked path).
using Case = std::tuple<Family, Precision, int64_t>;

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [family, precision, B] = info.param;
  return std::string(family == Family::gpt2 ? "gpt2" : "llama") + "_" +
         (precision == Precision::bf16 ? "bf16" : "fp32") + "_rows" + std::to_string(B * kT);
}

}  // namespace

class OpsInterface : public ::testing::TestWithParam<Case> {};

TEST_P(OpsInterface, ARecordingBackendGivesTheCpuBackendsLossAndGradientsBitForBit) {
  // The model sees only kernels::Ops: another class behind it computes the same bits, which
  // would not hold if a layer depended on the CPU backend's concrete type or state.
  const auto [family, precision, B] = GetParam();
  kernels::CpuOps plain_ops;
  RecordingOps recording;
  const StageRun plain = run_stage(plain_ops, nullptr, family, precision, B);
  const StageRun recorded = run_stage(recording, &recording, family, precision, B);
  expect_same_bits(recorded, plain);
}

TEST_P(OpsInterface, EveryLayerComputesThroughTheInterface) {
  const auto [family, precision, B] = GetParam();
  RecordingOps recording;
  const StageRun r = run_stage(recording, &recording, family, precision, B);
  const int L = static_cast<int>(tiny(family).n_layers);
  bool head_backward_in_forward = false;
  if (precision == Precision::bf16) {
    ASSERT_EQ(recording.head_plans().size(), 1u);
    head_backward_in_forward = recording.head_plans()[0].backward_in_forward;
  }
  expect_calls(r.forward_calls,
               expected_calls(family, precision, L, true, head_backward_in_forward), "forward");
  expect_calls(r.backward_calls,
               expected_calls(family, precision, L, false, head_backward_in_forward), "backward");
  // GPT-2's bf16 MLP hands the backend all its rows at once: chunked (>= kChunkRows rows) or
  // not is the backend's choice, and both cases run here.
  for (int64_t rows : recording.linear_gelu_rows()) EXPECT_EQ(rows, B * kT);
  if (family == Family::gpt2 && precision == Precision::bf16) {
    EXPECT_EQ(recording.linear_gelu_rows().size(), static_cast<size_t>(L));
    // The cases straddle CpuOps's chunk: B = 9 at least one chunk of rows, B = 2 fewer.
    EXPECT_EQ(B * kT >= kernels::CpuOps::kChunkRows, B == 9);
  }
}

INSTANTIATE_TEST_SUITE_P(FamiliesPrecisionsAndRows, OpsInterface,
                         ::testing::Combine(::testing::Values(Family::gpt2, Family::llama),
                                            ::testing::Values(Precision::fp32, Precision::bf16),
                                            ::testing::Values(int64_t{9}, int64_t{2})),
                         case_name);

TEST(OpsInterfaceBf16Head, BothPlansComputeThroughTheInterface) {
  // The LM head's backward inside its forward (add_partials in backward) and after it (the
  // head's linear_backward on the stored bf16 logits' gradient), each chosen explicitly.
  for (Family family : {Family::gpt2, Family::llama}) {
    for (HeadFusion fusion : {HeadFusion::always, HeadFusion::never}) {
      SCOPED_TRACE(std::string(family == Family::gpt2 ? "gpt2" : "llama") +
                   (fusion == HeadFusion::always ? " always" : " never"));
      kernels::CpuOps plain_ops;
      RecordingOps recording;
      const StageRun plain = run_stage(plain_ops, nullptr, family, Precision::bf16, 9, fusion);
      const StageRun recorded =
          run_stage(recording, &recording, family, Precision::bf16, 9, fusion);
      expect_same_bits(recorded, plain);
      ASSERT_EQ(recording.head_plans().size(), 1u);
      const bool in_forward = fusion == HeadFusion::always;
      EXPECT_EQ(recording.head_plans()[0].backward_in_forward, in_forward);
      const int L = static_cast<int>(tiny(family).n_layers);
      expect_calls(recorded.forward_calls,
                   expected_calls(family, Precision::bf16, L, true, in_forward), "forward");
      expect_calls(recorded.backward_calls,
                   expected_calls(family, Precision::bf16, L, false, in_forward), "backward");
    }
  }
}

TEST(OpsInterfaceMemory, EveryTrackedByteLivesInTheBackendsMemory) {
  // A second backend hands out its own memory (CountingMemory): the parameters, gradients and
  // every activation, saved or scratch, of a forward and backward come from it, so a device
  // backend's model lives on its device. After the forward, the bytes live in the backend's
  // memory are the tracked ones plus the stage's token and target ids (staged there, untracked);
  // a tensor allocated elsewhere (host memory) would leave the tracker's count above the live
  // bytes, an untracked transient left behind the other way.
  for (Family family : {Family::gpt2, Family::llama}) {
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(std::string(family == Family::gpt2 ? "gpt2" : "llama") +
                   (precision == Precision::bf16 ? " bf16" : " fp32"));
      RecordingOps recording;
      MemoryTracker tracker;
      const ModelConfig config = tiny(family);
      const int64_t B = 2, rows = B * kT;
      const Batch batch = random_batch(rows, config.vocab_size, 11);
      Transformer model(config, &tracker, {}, {}, {}, recording.memory());
      model.initialize(7);
      const LayerContext ctx{recording, precision, &tracker};
      const int64_t before = recording.counting_memory().live_bytes();
      EXPECT_EQ(before, tracker.current_total());  // the parameters and gradients
      EXPECT_GT(before, 0);
      model.forward_stage(ctx, batch.tokens.data(), nullptr, batch.targets.data(), B, kT, 0.5f);
      const int64_t ids = 2 * rows * static_cast<int64_t>(sizeof(int32_t));
      EXPECT_GT(tracker.current(MemoryCategory::activations), 0);
      EXPECT_EQ(recording.counting_memory().live_bytes(), tracker.current_total() + ids);
      model.backward_stage(ctx, nullptr);
      EXPECT_EQ(recording.counting_memory().live_bytes(), tracker.current_total() + ids);
      EXPECT_GT(recording.counting_memory().copies(), 0);  // the ids, host to device
    }
  }
}
