#include "core/tensor.h"

#include <fmt/format.h>

namespace lt {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    LT_CHECK(d >= 0, "negative dimension {} in shape", d);
    LT_CHECK(d == 0 || n <= INT64_MAX / d, "shape {} overflows 64-bit element count", shape_str(s));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

TensorView TensorView::contiguous(void* data, DType dtype, Shape shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.strides.assign(shape.size(), 1);
  for (int64_t i = int64_t(shape.size()) - 2; i >= 0; --i) v.strides[i] = v.strides[i + 1] * shape[i + 1];
  v.shape = std::move(shape);
  return v;
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

int64_t TensorView::offset(std::initializer_list<int64_t> idx) const {
  LT_CHECK(int64_t(idx.size()) == dim(), "index has {} coordinates, tensor of shape {} has {}", idx.size(),
           shape_str(shape), dim());
  int64_t off = 0, d = 0;
  for (int64_t i : idx) {
    LT_CHECK(i >= 0 && i < shape[d], "index {} out of range for dimension {} of shape {}", i, d, shape_str(shape));
    off += i * strides[d];
    ++d;
  }
  return off;
}

float TensorView::get(std::initializer_list<int64_t> idx) const {
  int64_t off = offset(idx);
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[off];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[off]);
    case DType::i8: return static_cast<const int8_t*>(data)[off];
    case DType::u8: return static_cast<const uint8_t*>(data)[off];
    case DType::i32: return float(static_cast<const int32_t*>(data)[off]);
    case DType::i64: return float(static_cast<const int64_t*>(data)[off]);
  }
  LT_FAIL("unknown dtype");
}

void TensorView::set(std::initializer_list<int64_t> idx, float v) const {
  int64_t off = offset(idx);
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[off] = v; return;
    case DType::bf16: static_cast<uint16_t*>(data)[off] = f32_to_bf16(v); return;
    case DType::f16: static_cast<uint16_t*>(data)[off] = f32_to_f16(v); return;
    default: LT_FAIL("set() supports floating dtypes only, tensor is {}", dtype_name(dtype));
  }
}

HostTensor::HostTensor(DType dtype, Shape shape)
    : dtype_(dtype), shape_(std::move(shape)), buf_(size_t(shape_numel(shape_)) * dtype_size(dtype), 64) {}

}  // namespace lt
