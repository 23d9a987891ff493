// core/tensor.h — a non-owning view of a dense tensor (data pointer, dtype, shape, strides in elements)
// and an owning host tensor. Kernels take raw pointers and sizes (llm.c style); views are the currency
// of file I/O, weight layouts and tests, where shapes must be checked.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/dtype.h"
#include "core/error.h"

namespace lt {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[4, 37, 64]"

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Shape strides;  // in elements; contiguous (C order) when made by contiguous()

  static TensorView contiguous(void* data, DType dtype, Shape shape);

  int64_t numel() const { return shape_numel(shape); }
  int64_t dim() const { return int64_t(shape.size()); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;

  // Typed pointer, checking the dtype: view.ptr<float>().
  template <typename T>
  T* ptr() const {
    LT_CHECK(dtype_matches<T>(), "tensor is {}, accessed as a different type", dtype_name(dtype));
    return static_cast<T*>(data);
  }
  // Checked element access by index list (any dtype readable as f32).
  float get(std::initializer_list<int64_t> idx) const;
  void set(std::initializer_list<int64_t> idx, float v) const;
  int64_t offset(std::initializer_list<int64_t> idx) const;

 private:
  template <typename T>
  bool dtype_matches() const {
    if constexpr (std::is_same_v<T, float>) return dtype == DType::f32;
    else if constexpr (std::is_same_v<T, uint16_t>) return dtype == DType::bf16 || dtype == DType::f16;
    else if constexpr (std::is_same_v<T, int8_t>) return dtype == DType::i8;
    else if constexpr (std::is_same_v<T, uint8_t>) return dtype == DType::u8;
    else if constexpr (std::is_same_v<T, int32_t>) return dtype == DType::i32;
    else if constexpr (std::is_same_v<T, int64_t>) return dtype == DType::i64;
    else return false;
  }
};

// An owning, 64-byte-aligned host tensor.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);
  TensorView view() const { return TensorView::contiguous(const_cast<uint8_t*>(buf_.data()), dtype_, shape_); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t bytes() const { return buf_.size(); }
  template <typename T>
  T* data() { return view().ptr<T>(); }
  template <typename T>
  const T* data() const { return view().ptr<T>(); }

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  AlignedBuffer<uint8_t> buf_;
};

}  // namespace lt
