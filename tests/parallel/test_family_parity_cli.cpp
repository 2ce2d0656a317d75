// The families Hugging Face users bring (issue 44) under every kind of parallelism, through
// `lattice parity` on local threads: Qwen 3 (per-head q/k RMSNorm, heads wider than d_model /
// n_heads: its norm weights are whole on every tp rank while the heads they scale are split, so
// their gradients are all-reduced over tp), Mistral (a sliding window of 8 on 32 positions: ring
// attention skips the key blocks before every query's window, Ulysses passes the window on) and
// Qwen3-MoE (expert parallelism) and DeepSeek-V3 (multi-head latent attention, a dense first
// layer, sigmoid-routed experts with a shared one; under tp its heads are split and its latent
// projections and norms whole on every rank, their gradients summed over tp; under cp ring
// attention and Ulysses carry its narrower value heads and RoPE rotates its rope channels at the
// runs' positions). Each layout against one rank from the same weights and batches.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

// The family's tiny preset on 32-token sequences, 8 steps.
std::string family_flags(const fs::path& dir, const std::string& preset) {
  return " --model.preset=" + preset +
         " --model.vocab_size=256 --model.max_seq_len=32"
         " --training.seq_len=32 --training.global_batch_size=8 --training.threads=1"
         " --training.steps=8 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=1"
         " --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --parallelism.bucket_mb=0.05 --job.run_dir=" +
         (dir / "run").string();
}

class FamilyParityCli : public CorpusDirectoryTest {
 protected:
  // Runs `layouts` (the first is one rank) and expects each listed one within the tolerance of it
  // (and every layout to hold: the pipeline's may be bit for bit).
  void expect_parity(const std::string& preset, const std::string& layouts,
                     const std::vector<std::string>& within) {
    SCOPED_TRACE(preset);
    const CliResult r = run_lattice(
        "parity --json --layouts " + layouts + " --tolerance 1e-4" + family_flags(dir_, preset),
        dir_);
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_TRUE(parity_holds(r.out)) << r.out;
    for (const std::string& layout : within)
      EXPECT_EQ(parity_verdict(r.out, layout), "within_tolerance") << layout << "\n" << r.out;
  }
};

}  // namespace

// Relative 1e-4 against one rank, as for the other families: dp and cp change the gradient sums'
// order, tp the row-parallel layers' sums and (Qwen 3) the q/k norm weights' sum over the heads;
// the pipeline runs each stage's arithmetic as one rank does (its tied embedding's gradient is
// summed between the first and last stage).
TEST_F(FamilyParityCli, Qwen3UnderDpTpPpAndCp) {
  expect_parity("qwen3-tiny", "dp1,dp2,dp2z3,dp1t2,dp1t2s,dp2t2z1,dp1p2,dp1c2,dp1c2u",
                {"dp2", "dp1t2", "dp1t2s", "dp2t2z1", "dp1c2", "dp1c2u"});
}

TEST_F(FamilyParityCli, MistralsSlidingWindowUnderDpTpPpAndCp) {
  expect_parity("mistral-tiny", "dp1,dp2z1,dp1t2s,dp1p2,dp1c2,dp1c2u,dp1c4",
                {"dp2z1", "dp1t2s", "dp1c2", "dp1c2u", "dp1c4"});
}

TEST_F(FamilyParityCli, Qwen3MoeUnderEpTpAndPp) {
  expect_parity("qwen3-moe-tiny", "dp1,dp2,dp2e2,dp1t2,dp1p2", {"dp2", "dp2e2", "dp1t2"});
}

// DeepSeek-V3's latent attention under dp (ZeRO-3 included), ep, the pipeline and tp (with and
// without sequence parallelism, with dp, ep, ZeRO and a zero-bubble pipeline whose deferred weight
// halves read the summed gradients of the replicated latent projections). Within 1e-4 of one rank
// as above: under tp the row-parallel o_proj's sum and the latent projections' and norms'
// gradients, summed over the ranks' heads, add in another order.
TEST_F(FamilyParityCli, DeepSeekV3UnderDpEpPpAndTp) {
  // dp2z3 and dp2e2 are compared with dp2 (ZeRO-3 bit for bit), dp1p2 with one rank; the tp
  // layouts with one rank, dp2t2e2 with dp2t2, dp1t2p2 and dp1t2sp2-zb-h1 with dp1t2 and dp1t2s
  // (bit for bit), dp2t2sz1 with dp2t2s (bit for bit).
  expect_parity("deepseek-v3-tiny",
                "dp1,dp2,dp2z3,dp2e2,dp1p2,dp1t2,dp1t2s,dp1t4s,dp2t2,dp2t2s,dp2t2e2,dp1t2p2,"
                "dp1t2sp2-zb-h1,dp2t2sz1",
                {"dp2", "dp2e2", "dp1t2", "dp1t2s", "dp1t4s", "dp2t2", "dp2t2s", "dp2t2e2"});
}

// DeepSeek-V3's latent attention under context parallelism: ring attention (2 and 4 ranks, and
// with dp) and Ulysses (alone and with tp: 2 of the 4 heads per tp rank, split over cp 2), its
// value heads (8 wide) narrower than its query-key heads (16). Within 1e-4 of one rank as above:
// ring merges the ranks' partial outputs through their log-sum-exps and sums the key/value
// gradients over the ring, dp and cp sum the weight gradients in another order.
TEST_F(FamilyParityCli, DeepSeekV3UnderCp) {
  expect_parity("deepseek-v3-tiny", "dp1,dp1c2,dp1c2u,dp1c4,dp2c2,dp1t2c2u",
                {"dp1c2", "dp1c2u", "dp1c4", "dp2c2", "dp1t2c2u"});
}
