// Tests of the learning-rate schedules against their closed forms, and of the AdamW optimizer's
// decay rule (matrices only) and reported gradient norm on a ParameterStore.
#include <gtest/gtest.h>

#include <cmath>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/optim/lr_schedule.hpp"

using namespace lattice;
using namespace lattice::optim;

TEST(LrSchedule, WarmupThenCosineLinearOrConstant) {
  LrSchedule s;
  s.peak_lr = 1e-3f;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1f;
  s.decay = DecayKind::cosine;
  EXPECT_FLOAT_EQ(s.at(1), 1e-4f);   // 1/10 of the peak after the first warmup step
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);  // peak at the end of warmup
  // Halfway through the decay the cosine is at the midpoint between peak and floor.
  EXPECT_NEAR(s.at(60), 1e-4 + (1e-3 - 1e-4) * 0.5, 1e-9);
  EXPECT_NEAR(s.at(110), 1e-4, 1e-9);  // the floor at the last step
  EXPECT_NEAR(s.at(500), 1e-4, 1e-9);  // and after it
  s.decay = DecayKind::linear;
  EXPECT_NEAR(s.at(35), 1e-3 - (1e-3 - 1e-4) * 0.25, 1e-9);
  s.decay = DecayKind::constant;
  EXPECT_FLOAT_EQ(s.at(100), 1e-3f);
  EXPECT_THROW(parse_decay("exponential"), Error);
}

TEST(AdamWOptimizer, ReportsThePreClipNormAndDecaysOnlyMatrices) {
  model::ParameterStore store;
  const int matrix = store.declare("w", {2, 2}, model::InitKind::ones, true);
  const int bias = store.declare("b", {2}, model::InitKind::ones, false);
  store.allocate(nullptr);
  store.initialize(0, 0.02f, 1);
  // Zero gradients: only weight decay moves the matrix; the bias must not move at all.
  AdamWSettings settings;
  settings.weight_decay = 0.5f;
  kernels::CpuOps adamw_ops;
  AdamWOptimizer optimizer(adamw_ops, store, settings, nullptr);
  EXPECT_EQ(optimizer.step(0.1f), 0.0);
  EXPECT_FLOAT_EQ(store.value(matrix)[0], 1.0f * (1.0f - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(store.value(bias)[0], 1.0f);
  // A gradient of norm 5 (3, 4 on the bias) is reported before clipping.
  store.grads()[store.info(bias).offset] = 3.0f;
  store.grads()[store.info(bias).offset + 1] = 4.0f;
  EXPECT_NEAR(optimizer.step(0.1f), 5.0, 1e-12);
  EXPECT_EQ(optimizer.steps_taken(), 2);
}
