// reduce_into_targets against a scalar reference that combines the sources in the order given:
// bit for bit on values whose sums depend on the order (so a reordered or fused path would fail),
// for every source and target count the direct algorithms use, every tail length of a 16-lane
// vector, the block size and beyond it, averages, and targets that alias a source.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lattice/comm/reduce_kernels.hpp"

namespace lattice::comm {
namespace {

// sources[0][i] + sources[1][i] + ..., left to right, then divided when divisor > 0.
std::vector<float> serial_sum(const std::vector<std::vector<float>>& sources, int64_t count,
                              int divisor) {
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    float acc = sources[0][static_cast<size_t>(i)];
    for (size_t s = 1; s < sources.size(); ++s) acc = acc + sources[s][static_cast<size_t>(i)];
    if (divisor > 0) acc = acc / static_cast<float>(divisor);
    out[static_cast<size_t>(i)] = acc;
  }
  return out;
}

// Values of mixed magnitudes: (a + b) + c differs from a + (b + c) for many of them.
std::vector<std::vector<float>> random_sources(int source_count, int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<float>> sources(static_cast<size_t>(source_count));
  for (auto& source : sources) {
    source.resize(static_cast<size_t>(count));
    for (float& v : source) v = std::ldexp(mantissa(rng), exponent(rng));
  }
  return sources;
}

void expect_bits(const std::vector<float>& expected, const float* actual, const std::string& what) {
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(expected[i]), std::bit_cast<uint32_t>(actual[i]))
        << what << " at element " << i << ": expected " << expected[i] << ", got " << actual[i];
  }
}

TEST(ReduceKernels, Fp32SumsMatchTheSerialOrderBitForBit) {
  int checked_order_sensitive = 0;
  for (int source_count : {1, 2, 3, 5, 8}) {
    for (int target_count : {1, 2, 3}) {
      for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{16}, int64_t{17},
                            int64_t{33}, int64_t{128}, int64_t{255}, int64_t{2047}, int64_t{2048},
                            int64_t{2049}, int64_t{5000}}) {
        for (int divisor : {0, source_count}) {
          const std::string what = std::to_string(source_count) + " sources, " +
                                   std::to_string(target_count) + " targets, count " +
                                   std::to_string(count) + ", divisor " + std::to_string(divisor);
          auto sources = random_sources(source_count, count,
                                        static_cast<uint32_t>(source_count * 131 + count));
          const std::vector<float> expected = serial_sum(sources, count, divisor);
          // The same sum in another order differs somewhere (else the check would prove little).
          if (source_count >= 3) {
            for (int64_t i = 0; i < count; ++i) {
              const auto k = static_cast<size_t>(i);
              float reversed = sources[static_cast<size_t>(source_count - 1)][k];
              for (int s = source_count - 2; s >= 0; --s)
                reversed = reversed + sources[static_cast<size_t>(s)][k];
              if (divisor > 0) reversed = reversed / static_cast<float>(divisor);
              if (reversed != expected[k]) {
                ++checked_order_sensitive;
                break;
              }
            }
          }
          std::vector<const void*> source_pointers;
          for (const auto& source : sources) source_pointers.push_back(source.data());
          std::vector<std::vector<float>> targets(static_cast<size_t>(target_count),
                                                  std::vector<float>(static_cast<size_t>(count)));
          std::vector<void*> target_pointers;
          for (auto& target : targets) target_pointers.push_back(target.data());
          reduce_into_targets(source_pointers.data(), source_count, target_pointers.data(),
                              target_count, count, DType::f32,
                              divisor > 0 ? ReduceOp::avg : ReduceOp::sum, divisor);
          for (int t = 0; t < target_count; ++t)
            expect_bits(expected, targets[static_cast<size_t>(t)].data(),
                        what + ", target " + std::to_string(t));
        }
      }
    }
  }
  EXPECT_GT(checked_order_sensitive, 20);
}

TEST(ReduceKernels, TargetsThatAreSourcesGetTheSum) {
  // In place, as a direct allreduce on the ranks' own buffers: target t is source t.
  for (int64_t count : {int64_t{5}, int64_t{128}, int64_t{1000}, int64_t{3000}}) {
    auto sources = random_sources(3, count, static_cast<uint32_t>(count));
    const std::vector<float> expected = serial_sum(sources, count, 0);
    std::vector<const void*> source_pointers;
    std::vector<void*> target_pointers;
    for (auto& source : sources) {
      source_pointers.push_back(source.data());
      target_pointers.push_back(source.data());
    }
    reduce_into_targets(source_pointers.data(), 3, target_pointers.data(), 3, count, DType::f32,
                        ReduceOp::sum);
    for (size_t t = 0; t < 3; ++t)
      expect_bits(expected, sources[t].data(), "count " + std::to_string(count) + " in place");
  }
}

TEST(ReduceKernels, ATargetOverlappingASourceAtAnOffsetStillGetsTheSum) {
  // Not the collectives' use, but the staged block makes it correct, and it must stay so.
  const int64_t count = 100;
  auto sources = random_sources(2, count + 8, 7);
  std::vector<std::vector<float>> trimmed = {
      std::vector<float>(sources[0].begin(), sources[0].begin() + count),
      std::vector<float>(sources[1].begin(), sources[1].begin() + count)};
  const std::vector<float> expected = serial_sum(trimmed, count, 0);
  const void* source_pointers[2] = {sources[0].data(), sources[1].data()};
  void* target_pointers[1] = {sources[0].data() + 8};  // overlaps source 0, 8 elements on
  reduce_into_targets(source_pointers, 2, target_pointers, 1, count, DType::f32, ReduceOp::sum);
  expect_bits(expected, sources[0].data() + 8, "overlap at an offset");
}

}  // namespace
}  // namespace lattice::comm
