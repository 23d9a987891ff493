// core/dtype.h — element types and conversions.
//
// bf16 and f16 are stored as raw uint16_t bit patterns. f32 -> bf16 rounds to nearest, ties to even
// (the rounding of torch.Tensor.to(torch.bfloat16) and of AVX512-BF16's vcvtneps2bf16); NaN stays a
// quiet NaN. The array conversions pick AVX-512 (F/BW integer code, not AVX512-BF16's instruction, which
// flushes subnormals) or AVX2 at run time and give the same bits as the scalar functions, their specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lt {

enum class DType : uint8_t { f32, bf16, f16, i8, u8, i32, i64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", ...
// Parses our names and safetensors' ("F32", "BF16", "F16", "I8", "U8", "I32", "I64"); throws otherwise.
DType dtype_parse(std::string_view name);
std::string_view dtype_safetensors_name(DType t);  // "F32", "BF16", ...

using bf16_t = uint16_t;
using f16_t = uint16_t;

inline float bf16_to_f32(bf16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16_t((bits >> 16) | 0x40u);  // quiet NaN, sign kept
  bits += 0x7fffu + ((bits >> 16) & 1u);                                       // round to nearest even
  return bf16_t(bits >> 16);
}

// Rounds an f32 to the nearest bf16 value, kept in f32 (what a bf16 GEMM operand sees).
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(f16_t h);
f16_t f32_to_f16(float f);  // round to nearest even, overflow to inf

// Array conversions (vectorised where the CPU allows; bit-identical to the scalar functions).
void convert_f32_to_bf16(bf16_t* dst, const float* src, size_t n);
void convert_bf16_to_f32(float* dst, const bf16_t* src, size_t n);
void convert_f16_to_f32(float* dst, const f16_t* src, size_t n);
void convert_f32_to_f16(f16_t* dst, const float* src, size_t n);
// Converts n elements of any floating dtype (f32, bf16, f16) to f32.
void convert_to_f32(float* dst, const void* src, DType src_type, size_t n);
// Converts n f32 elements to a floating dtype (f32, bf16, f16).
void convert_from_f32(void* dst, DType dst_type, const float* src, size_t n);
// The two above in chunks over the thread pool (core/parallel.h), for activations; element by element, so the
// bits do not depend on the split.
void parallel_convert_to_f32(float* dst, const void* src, DType src_type, size_t n);
void parallel_convert_from_f32(void* dst, DType dst_type, const float* src, size_t n);

}  // namespace lt
