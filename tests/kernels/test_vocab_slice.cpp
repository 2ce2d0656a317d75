// The vocabulary-parallel kernels against their whole-vocabulary counterparts: the embedding of
// each rank's slice of the table, summed over the slices, is the whole table's lookup bit for bit
// (each row is one slice's row plus zeros); its gradient is the whole gradient's rows of the slice;
// the cross-entropy from slices (max, sums and target logits combined as the tensor-parallel
// group's all-reduces do) equals cross_entropy_forward_backward within fp32 rounding of a sum
// split differently (1e-6 relative), with padding columns that never count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/cross_entropy_vocab_slice.hpp"
#include "lattice/kernels/cpu/embedding.hpp"

using namespace lattice::kernels;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

}  // namespace

TEST(VocabSlice, EmbeddingSlicesSumToTheWholeLookupAndSplitItsGradient) {
  const int64_t V = 50, C = 8, B = 2, T = 7, slices = 3, rows = 17;  // 3 x 17 = 51: one padding row
  const auto wte = random_values(static_cast<size_t>(V * C), 1, 1.0f);
  const auto wpe = random_values(static_cast<size_t>(T * C), 2, 1.0f);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 13 + 5) % V);
  tokens[3] = tokens[9] = 16;  // repeated, on a slice boundary's side
  std::vector<float> whole(static_cast<size_t>(B * T * C));
  embedding_forward(whole.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  std::vector<float> summed(whole.size(), 0.0f), part(whole.size());
  const auto d_out = random_values(whole.size(), 3, 1.0f);
  std::vector<float> d_whole(static_cast<size_t>(V * C), 0.0f);
  embedding_backward(d_whole.data(), nullptr, d_out.data(), tokens.data(), B, T, C);
  for (int64_t s = 0; s < slices; ++s) {
    const VocabRange vocab{std::min(V, s * rows), std::min(V, (s + 1) * rows)};
    std::vector<float> table(static_cast<size_t>(rows * C), 0.0f);
    std::copy(wte.begin() + vocab.begin * C, wte.begin() + vocab.end * C, table.begin());
    // Positions from slice 0 only, as tensor parallelism adds them once.
    embedding_forward(part.data(), tokens.data(), table.data(), s == 0 ? wpe.data() : nullptr, B, T,
                      C, 0, vocab);
    for (size_t i = 0; i < summed.size(); ++i) summed[i] += part[i];
    std::vector<float> d_table(static_cast<size_t>(rows * C), 0.0f);
    embedding_backward(d_table.data(), nullptr, d_out.data(), tokens.data(), B, T, C, vocab);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const float got = d_table[static_cast<size_t>(r * C + c)];
        if (vocab.begin + r < vocab.end)
          ASSERT_EQ(got, d_whole[static_cast<size_t>((vocab.begin + r) * C + c)]);
        else
          ASSERT_EQ(got, 0.0f) << "padding row";
      }
  }
  EXPECT_EQ(summed, whole);
}

TEST(VocabSlice, CrossEntropyFromSlicesEqualsTheWholeRows) {
  const int64_t V = 70, rows = 9, slices = 4, width = 18;  // 4 x 18 = 72: two padding columns
  const auto logits = random_values(static_cast<size_t>(rows * V), 4, 3.0f);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    targets[static_cast<size_t>(r)] = static_cast<int32_t>((r * 31) % V);
  targets[4] = -1;  // ignored
  targets[5] = 69;  // in the last slice, next to the padding
  const float scale = 0.25f;
  std::vector<float> d_whole(logits.size());
  const double whole =
      cross_entropy_forward_backward(d_whole.data(), logits.data(), targets.data(), rows, V, scale);

  // Each slice's logits with garbage in its padding (it must never count).
  std::vector<std::vector<float>> part(static_cast<size_t>(slices));
  std::vector<VocabRange> vocab(static_cast<size_t>(slices));
  for (int64_t s = 0; s < slices; ++s) {
    vocab[static_cast<size_t>(s)] = {std::min(V, s * width), std::min(V, (s + 1) * width)};
    auto& p = part[static_cast<size_t>(s)];
    p.assign(static_cast<size_t>(rows * width), 1e4f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = vocab[static_cast<size_t>(s)].begin; v < vocab[static_cast<size_t>(s)].end;
           ++v)
        p[static_cast<size_t>(r * width + v - vocab[static_cast<size_t>(s)].begin)] =
            logits[static_cast<size_t>(r * V + v)];
  }
  auto valid = [&](int64_t s) {
    return vocab[static_cast<size_t>(s)].end - vocab[static_cast<size_t>(s)].begin;
  };
  // The group's max (an all-reduce MAX), then sums and target logits (all-reduce SUM).
  std::vector<float> max(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity()),
      m(static_cast<size_t>(rows));
  for (int64_t s = 0; s < slices; ++s) {
    vocab_slice_row_max(m.data(), part[static_cast<size_t>(s)].data(), rows, width, valid(s));
    for (int64_t r = 0; r < rows; ++r)
      max[static_cast<size_t>(r)] =
          std::max(max[static_cast<size_t>(r)], m[static_cast<size_t>(r)]);
  }
  std::vector<float> sum(static_cast<size_t>(rows), 0.0f), target(static_cast<size_t>(rows), 0.0f),
      s1(static_cast<size_t>(rows)), t1(static_cast<size_t>(rows));
  for (int64_t s = 0; s < slices; ++s) {
    vocab_slice_row_sums(s1.data(), t1.data(), part[static_cast<size_t>(s)].data(), max.data(),
                         targets.data(), rows, width, valid(s), vocab[static_cast<size_t>(s)]);
    for (int64_t r = 0; r < rows; ++r) {
      sum[static_cast<size_t>(r)] += s1[static_cast<size_t>(r)];
      target[static_cast<size_t>(r)] += t1[static_cast<size_t>(r)];
    }
  }
  for (int64_t s = 0; s < slices; ++s) {
    auto& p = part[static_cast<size_t>(s)];
    const double loss =
        vocab_slice_loss(p.data(), p.data(), max.data(), sum.data(), target.data(), targets.data(),
                         rows, width, valid(s), vocab[static_cast<size_t>(s)], scale);
    EXPECT_NEAR(loss, whole, 1e-6 * std::abs(whole)) << "slice " << s;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < width; ++c) {
        const float got = p[static_cast<size_t>(r * width + c)];
        const int64_t v = vocab[static_cast<size_t>(s)].begin + c;
        if (c >= valid(s)) {
          ASSERT_EQ(got, 0.0f) << "padding column";
          continue;
        }
        const float want = d_whole[static_cast<size_t>(r * V + v)];
        ASSERT_NEAR(got, want, 1e-6f * scale + 1e-6f * std::abs(want)) << "row " << r << " v " << v;
      }
  }
}
