// Tests of the backend factory (kernels/make_ops.hpp): the cpu backend with host memory, and one
// clear line for a device this build has no backend for.
#include <gtest/gtest.h>

#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/make_ops.hpp"

using namespace lattice;

TEST(MakeOps, TheCpuBackendComputesInHostMemory) {
  const std::unique_ptr<kernels::Ops> ops = kernels::make_ops(Device::cpu);
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->device(), Device::cpu);
  EXPECT_EQ(ops->memory().device(), Device::cpu);
  EXPECT_EQ(ops->describe().rfind("cpu: ", 0), 0u) << ops->describe();
  EXPECT_FALSE(ops->describe_bf16().empty());
  // A tensor on the backend's memory is an ordinary host tensor its ops compute on.
  Tensor x({5}, DType::f32, ops->memory());
  Tensor y({5}, DType::f32, ops->memory());
  EXPECT_EQ(x.device(), Device::cpu);
  for (int i = 0; i < 5; ++i) x.f32()[i] = static_cast<float>(i + 1);
  ops->copy(y.f32(), x.f32(), 5);
  ops->add_inplace(y.f32(), x.f32(), 5);
  EXPECT_EQ(y.f32()[4], 10.0f);
  const kernels::FloatRun run{x.f32(), 5};
  EXPECT_EQ(ops->sum_of_squares({&run, 1}), 55.0);
}

TEST(MakeOps, ACudaBackendIsRefusedInOneLineNamingTheFix) {
  try {
    kernels::make_ops(Device::cuda);
    FAIL() << "a cuda backend was made";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("on cuda: no CUDA backend is built; run on the cpu"), std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}
