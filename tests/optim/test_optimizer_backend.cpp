// Tests that the optimizer reaches the backend only through kernels::Ops: the parameters, their
// gradients and the AdamW moments live in the backend's memory (Ops::memory()), and a step is the
// backend's norm and AdamW ops, with the CPU backend's bits.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../model/recording_ops.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/optim/adamw_optimizer.hpp"

using namespace lattice;

namespace {

void declare(model::ParameterStore& store) {
  store.declare("w", {33, 17}, model::InitKind::normal, true);
  store.declare("b", {17}, model::InitKind::zeros, false);
}

void fill_grads(model::ParameterStore& store, int step) {
  float* g = store.grads();
  for (int64_t i = 0; i < store.size(); ++i)
    g[i] = static_cast<float>((i * 37 + step * 11) % 101 - 50) * 1e-2f;
}

}  // namespace

TEST(OptimizerBackend, StateLivesInTheBackendsMemoryAndStepsAreItsOps) {
  lattice::testing::RecordingOps recording;
  model::ParameterStore store;
  declare(store);
  store.allocate(nullptr, recording.memory());
  const int64_t n = store.size();
  EXPECT_EQ(recording.counting_memory().blocks(), 2);  // values, gradients
  store.initialize(5, 0.02f, 1);
  optim::AdamWSettings settings;
  settings.weight_decay = 0.1f;
  settings.max_grad_norm = 0.5f;
  optim::AdamWOptimizer adamw(recording, store, settings, nullptr);
  EXPECT_EQ(recording.counting_memory().blocks(), 4);  // and both moments
  EXPECT_EQ(recording.counting_memory().bytes(), 4 * n * int64_t{sizeof(float)});

  // The same steps on the plain CPU backend with host memory: the same bits.
  kernels::CpuOps plain;
  model::ParameterStore reference;
  declare(reference);
  reference.allocate(nullptr);
  reference.initialize(5, 0.02f, 1);
  optim::AdamWOptimizer reference_adamw(plain, reference, settings, nullptr);
  for (int step = 1; step <= 3; ++step) {
    fill_grads(store, step);
    fill_grads(reference, step);
    EXPECT_EQ(adamw.step(1e-2f), reference_adamw.step(1e-2f));
  }
  EXPECT_EQ(recording.calls().at("sum_of_squares"), 3);
  EXPECT_EQ(recording.calls().at("adamw_update"), 3);
  EXPECT_EQ(0, std::memcmp(store.values(), reference.values(), sizeof(float) * n));
  EXPECT_EQ(0, std::memcmp(adamw.exp_avg_sq(), reference_adamw.exp_avg_sq(), sizeof(float) * n));
}
