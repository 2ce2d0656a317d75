// Tensor storage: see tensor.hpp.
#include "lattice/core/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "lattice/core/aligned_allocation.hpp"
#include "lattice/core/error.hpp"

namespace lattice {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    check(d >= 0, "tensor dimension must be non-negative, got " + std::to_string(d));
    n *= d;
  }
  return n;
}

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string_view device_name(Device device) {
  switch (device) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
  }
  return "?";
}

Tensor::Tensor(Shape shape, DType dtype, MemoryTracker* tracker, MemoryCategory category,
               Device device)
    : shape_(std::move(shape)),
      dtype_(dtype),
      tracker_(tracker),
      category_(category),
      device_(device) {
  numel_ = shape_numel(shape_);
  size_t bytes = nbytes();
  if (bytes == 0) return;
  check(device_ == Device::cpu, "tensor: cannot allocate " + shape_string(shape_) + " on " +
                                    std::string(device_name(device_)) +
                                    ": this build has no backend for that device; allocate on cpu");
  size_t padded = (bytes + 63) / 64 * 64;
  data_ = allocate_aligned(padded);
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, padded);
  if (tracker_) tracker_->add(category_, static_cast<int64_t>(bytes));
}

Tensor::~Tensor() {
  reset();
}

Tensor::Tensor(Tensor&& other) noexcept {
  *this = std::move(other);
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    reset();
    shape_ = std::move(other.shape_);
    dtype_ = other.dtype_;
    numel_ = std::exchange(other.numel_, 0);
    data_ = std::exchange(other.data_, nullptr);
    tracker_ = std::exchange(other.tracker_, nullptr);
    category_ = other.category_;
    device_ = other.device_;
  }
  return *this;
}

Tensor Tensor::clone() const {
  Tensor copy(shape_, dtype_, tracker_, category_, device_);
  if (nbytes()) std::memcpy(copy.data_, data_, nbytes());
  return copy;
}

void Tensor::reset() {
  if (data_) {
    if (tracker_) tracker_->remove(category_, static_cast<int64_t>(nbytes()));
    free_aligned(data_);
  }
  data_ = nullptr;
  numel_ = 0;
  shape_.clear();
}

void Tensor::zero() {
  if (data_) std::memset(data_, 0, nbytes());
}

void Tensor::check_type(DType expected) const {
  // Every data<T>() call passes here: the message is built only on failure.
  if (expected != dtype_)
    throw Error("tensor of dtype " + std::string(dtype_name(dtype_)) + " accessed as " +
                std::string(dtype_name(expected)));
  check_on(Device::cpu);
}

void Tensor::check_on(Device expected) const {
  if (device_ != expected)
    throw Error("tensor " + shape_string(shape_) + " is on " + std::string(device_name(device_)) +
                " but was handed to " + std::string(device_name(expected)) +
                " code: move it there first");
}

}  // namespace lattice
