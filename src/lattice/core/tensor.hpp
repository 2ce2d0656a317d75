// Tensor: an owned, 64-byte-aligned, contiguous n-d buffer with a dtype, a shape, the device its
// storage lives on (allocated, zeroed, copied and freed through that device's DeviceMemory) and an
// optional memory-accounting category. Kernels take raw pointers from it; it does no arithmetic.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "lattice/core/device.hpp"
#include "lattice/core/device_memory.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/memory.hpp"

namespace lattice {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage on `device`. With a tracker, the bytes are counted under
  // `category` until the tensor is destroyed or reset. Device::cpu allocates host memory; any
  // other device needs its backend's memory (the constructor below): throws Error naming the fix
  // for storage on Device::cuda ("no CUDA backend is built"; an empty tensor may name it).
  Tensor(Shape shape, DType dtype, MemoryTracker* tracker = nullptr,
         MemoryCategory category = MemoryCategory::other, Device device = Device::cpu);
  // Zero-filled storage from `memory` (a backend's, kernels::Ops::memory()), on its device.
  Tensor(Shape shape, DType dtype, DeviceMemory& memory, MemoryTracker* tracker = nullptr,
         MemoryCategory category = MemoryCategory::other);
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // A deep copy (same memory, tracker and category).
  Tensor clone() const;
  // Frees the storage (and its accounting); the tensor becomes empty.
  void reset();
  void zero();

  bool empty() const { return data_ == nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i < 0 ? i + rank() : i)); }
  int rank() const { return static_cast<int>(shape_.size()); }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  MemoryCategory category() const { return category_; }
  Device device() const { return device_; }
  // The memory the storage came from (host_memory() for cpu tensors).
  DeviceMemory& memory() const { return *memory_; }
  // Throws Error naming both devices unless the tensor is on `expected`: for a kernel of one
  // device that is handed a tensor.
  void check_on(Device expected) const;

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  // Typed access; throws Error when T does not match the dtype, or the tensor is not on the cpu
  // (these are host pointers for the CPU kernels; one dtype-and-device compare).
  template <class T>
  T* data();
  template <class T>
  const T* data() const;
  float* f32() { return data<float>(); }
  const float* f32() const { return data<float>(); }

 private:
  void check_type(DType expected) const;
  void allocate();

  Shape shape_;
  DType dtype_ = DType::f32;
  int64_t numel_ = 0;
  void* data_ = nullptr;
  MemoryTracker* tracker_ = nullptr;
  MemoryCategory category_ = MemoryCategory::other;
  Device device_ = Device::cpu;
  DeviceMemory* memory_ = &host_memory();
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

template <class T>
T* Tensor::data() {
  check_type(dtype_of<T>());
  return static_cast<T*>(data_);
}
template <class T>
const T* Tensor::data() const {
  check_type(dtype_of<T>());
  return static_cast<const T*>(data_);
}

}  // namespace lattice
