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

Tensor::Tensor(Shape shape, DType dtype, MemoryTracker* tracker, MemoryCategory category)
    : shape_(std::move(shape)), dtype_(dtype), tracker_(tracker), category_(category) {
  numel_ = shape_numel(shape_);
  size_t bytes = nbytes();
  if (bytes == 0) return;
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
  }
  return *this;
}

Tensor Tensor::clone() const {
  Tensor copy(shape_, dtype_, tracker_, category_);
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
  check(expected == dtype_, "tensor of dtype " + std::string(dtype_name(dtype_)) + " accessed as " +
                                std::string(dtype_name(expected)));
}

}  // namespace lattice
