// Tests of core: Tensor storage and accounting, bf16 rounding, RNG determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/core/tensor.hpp"

using namespace lattice;

TEST(Tensor, AllocatesZeroedAlignedStorageAndCountsIt) {
  MemoryTracker tracker;
  {
    Tensor t({3, 5}, DType::f32, &tracker, MemoryCategory::activations);
    EXPECT_EQ(t.numel(), 15);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
    for (int i = 0; i < 15; ++i) EXPECT_EQ(t.f32()[i], 0.0f);
    EXPECT_EQ(tracker.current(MemoryCategory::activations), 60);
    Tensor moved = std::move(t);
    EXPECT_TRUE(t.empty());
    EXPECT_EQ(tracker.current(MemoryCategory::activations), 60);
  }
  EXPECT_EQ(tracker.current(MemoryCategory::activations), 0);
  EXPECT_EQ(tracker.peak(MemoryCategory::activations), 60);
}

TEST(Tensor, TypedAccessChecksDtype) {
  Tensor t({4}, DType::bf16);
  EXPECT_NO_THROW(t.data<bf16>());
  EXPECT_THROW(t.data<float>(), Error);
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1).
  EXPECT_EQ(to_float(to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd mantissa) and 1+2^-6: goes to 1+2^-6.
  EXPECT_EQ(to_float(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(to_float(to_bf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::infinity()))));
  // Largest finite float rounds up to infinity in bf16 (as PyTorch does).
  EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));
}

TEST(Rng, IsDeterministicAndRestorable) {
  Rng a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  auto saved = a.state();
  float x = a.normal();
  a.set_state(saved);
  EXPECT_EQ(a.normal(), x);
  double sum = 0, sum_sq = 0;
  Rng c(7);
  for (int i = 0; i < 100000; ++i) {
    double v = c.normal();
    sum += v;
    sum_sq += v * v;
  }
  EXPECT_NEAR(sum / 1e5, 0.0, 0.02);
  EXPECT_NEAR(sum_sq / 1e5, 1.0, 0.02);
}

TEST(Tensor, CarriesItsDeviceCpuByDefault) {
  Tensor t({2, 3}, DType::f32);
  EXPECT_EQ(t.device(), Device::cpu);
  EXPECT_EQ(Tensor().device(), Device::cpu);
  EXPECT_EQ(t.clone().device(), Device::cpu);
  Tensor moved = std::move(t);
  EXPECT_EQ(moved.device(), Device::cpu);
  EXPECT_EQ(device_name(Device::cpu), "cpu");
  EXPECT_EQ(device_name(Device::cuda), "cuda");
  // CPU kernels take host pointers: a cpu tensor hands them out, checked with the dtype.
  EXPECT_NO_THROW(moved.data<float>());
  EXPECT_NO_THROW(moved.check_on(Device::cpu));
  EXPECT_THROW(moved.check_on(Device::cuda), Error);
}

TEST(Tensor, CudaIsReservedUntilItsBackendAllocates) {
  try {
    Tensor t({4}, DType::f32, nullptr, MemoryCategory::other, Device::cuda);
    FAIL() << "a cuda tensor was allocated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  // An empty tensor needs no storage, so it may name any device.
  Tensor empty({0}, DType::f32, nullptr, MemoryCategory::other, Device::cuda);
  EXPECT_EQ(empty.device(), Device::cuda);
  EXPECT_THROW(empty.check_on(Device::cpu), Error);
}

TEST(Tensor, ACudaTensorWithoutABackendIsOneLineNamingTheFix) {
  try {
    Tensor t({2, 3}, DType::bf16, nullptr, MemoryCategory::parameters, Device::cuda);
    FAIL() << "a cuda tensor was allocated";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[2, 3] on cuda: no CUDA backend is built; run on the cpu"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

namespace {

// A device's memory as a backend would hand it out (here host blocks under a cuda name), counting
// what the tensor asks of it.
class CountingMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::cuda; }
  void* allocate(size_t bytes) override {
    ++allocations;
    return host_memory().allocate(bytes);
  }
  void free(void* block) noexcept override {
    ++frees;
    host_memory().free(block);
  }
  void zero(void* data, size_t bytes) override {
    ++zeros;
    host_memory().zero(data, bytes);
  }
  void release(void* data, size_t bytes) override { host_memory().release(data, bytes); }
  void copy(void* destination, const void* source, size_t bytes, CopyKind kind) override {
    copies.push_back(kind);
    host_memory().copy(destination, source, bytes, kind);
  }
  void copy_rows(void* destination, size_t destination_pitch, const void* source,
                 size_t source_pitch, size_t row_bytes, size_t rows, CopyKind kind) override {
    copies.push_back(kind);
    host_memory().copy_rows(destination, destination_pitch, source, source_pitch, row_bytes, rows,
                            kind);
  }
  int allocations = 0, frees = 0, zeros = 0;
  std::vector<CopyKind> copies;
};

}  // namespace

TEST(Tensor, StorageFromABackendsMemoryLivesOnItsDeviceAndGoesBackThroughIt) {
  CountingMemory memory;
  MemoryTracker tracker;
  {
    Tensor t({4, 8}, DType::f32, memory, &tracker, MemoryCategory::gradients);
    EXPECT_EQ(t.device(), Device::cuda);
    EXPECT_EQ(&t.memory(), &memory);
    EXPECT_EQ(memory.allocations, 1);
    EXPECT_EQ(tracker.current(MemoryCategory::gradients), 4 * 8 * 4);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
    // Its pointer is the device's: typed host access is refused with both devices named.
    EXPECT_THROW(t.f32(), Error);
    t.zero();
    EXPECT_EQ(memory.zeros, 1);
    Tensor copy = t.clone();
    EXPECT_EQ(copy.device(), Device::cuda);
    ASSERT_EQ(memory.copies.size(), 1u);
    EXPECT_EQ(memory.copies[0], CopyKind::device_to_device);
    Tensor moved = std::move(copy);
    EXPECT_EQ(&moved.memory(), &memory);
  }
  EXPECT_EQ(memory.frees, 2);
  EXPECT_EQ(tracker.current(MemoryCategory::gradients), 0);
}

TEST(HostMemory, AllocatesZeroedAlignedBlocksAndCopies) {
  HostMemory& host = host_memory();
  EXPECT_EQ(host.device(), Device::cpu);
  EXPECT_EQ(host.allocate(0), nullptr);
  auto* a = static_cast<float*>(host.allocate(100 * sizeof(float)));
  auto* b = static_cast<float*>(host.allocate(100 * sizeof(float)));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a[i], 0.0f);
  for (int i = 0; i < 100; ++i) a[i] = static_cast<float>(i);
  host.copy(b, a, 100 * sizeof(float), CopyKind::host_to_device);
  EXPECT_EQ(b[99], 99.0f);
  host.zero(b, 50 * sizeof(float));
  EXPECT_EQ(b[49], 0.0f);
  EXPECT_EQ(b[50], 50.0f);
  host.free(a);
  host.free(b);
  host.free(nullptr);
}
