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

Tensor::Tensor(Shape shape, DType dtype, MemoryTracker* tracker, MemoryCategory category,
               Device device)
    : shape_(std::move(shape)),
      dtype_(dtype),
      tracker_(tracker),
      category_(category),
      device_(device) {
  numel_ = shape_numel(shape_);
  if (nbytes() == 0) return;
  if (device_ != Device::cpu)
    throw Error(no_backend_message(device_, "tensor: cannot allocate " + shape_string(shape_)));
  allocate();
}

Tensor::Tensor(Shape shape, DType dtype, DeviceMemory& memory, MemoryTracker* tracker,
               MemoryCategory category)
    : shape_(std::move(shape)),
      dtype_(dtype),
      tracker_(tracker),
      category_(category),
      device_(memory.device()),
      memory_(&memory) {
  numel_ = shape_numel(shape_);
  if (nbytes() > 0) allocate();
}

void Tensor::allocate() {
  data_ = memory_->allocate(nbytes());
  if (tracker_) tracker_->add(category_, static_cast<int64_t>(nbytes()));
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
    memory_ = other.memory_;
  }
  return *this;
}

Tensor Tensor::clone() const {
  Tensor copy(shape_, dtype_, *memory_, tracker_, category_);
  if (nbytes()) memory_->copy(copy.data_, data_, nbytes(), CopyKind::device_to_device);
  return copy;
}

void Tensor::reset() {
  if (data_) {
    if (tracker_) tracker_->remove(category_, static_cast<int64_t>(nbytes()));
    memory_->free(data_);
  }
  data_ = nullptr;
  numel_ = 0;
  shape_.clear();
}

void Tensor::zero() {
  if (data_) memory_->zero(data_, nbytes());
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
