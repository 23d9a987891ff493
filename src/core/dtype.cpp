// core/dtype.cpp — dtype names and conversions. The bf16 array conversions have AVX-512 and AVX2 paths,
// chosen at run time from cpu_features() (AVX-512 first), that give the scalar functions' bits, NaN codes
// included (tested on every path the CPU has).
#include "core/dtype.h"

#include "core/parallel.h"

// GCC 12's AVX-512 intrinsics fill "undefined" vectors by self-initialisation, which -Wmaybe-uninitialized
// reports once they are inlined; the diagnostic state is kept per source location, so silence it for the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "core/cpu_features.h"
#include "core/error.h"

namespace lt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  LT_FAIL("unknown dtype {}", int(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  LT_FAIL("unknown dtype {}", int(t));
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  LT_FAIL("unknown dtype {}", int(t));
}

DType dtype_parse(std::string_view name) {
  struct Entry { std::string_view a, b; DType t; };
  static constexpr Entry table[] = {
      {"f32", "F32", DType::f32}, {"bf16", "BF16", DType::bf16}, {"f16", "F16", DType::f16},
      {"i8", "I8", DType::i8},    {"u8", "U8", DType::u8},       {"i32", "I32", DType::i32},
      {"i64", "I64", DType::i64}};
  for (const auto& e : table)
    if (name == e.a || name == e.b) return e.t;
  LT_FAIL("unknown dtype '{}' (expected one of F32, BF16, F16, I8, U8, I32, I64)", name);
}

float f16_to_f32(f16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | man << 13 | (man ? 0x400000u : 0u);
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return f16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    // value = abs_float; subnormal unit is 2^-24. Round to nearest even via float arithmetic on bits.
    float a;
    std::memcpy(&a, &abs, 4);
    // Adding 0.5 (2^-1) shifts the value so its mantissa's low bits are the f16 subnormal (RNE by FPU).
    float shifted = a + 0.5f;
    uint32_t sb;
    std::memcpy(&sb, &shifted, 4);
    return f16_t(sign | (sb - 0x3f000000u));
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return f16_t(sign | ((rounded - 0x38000000u) >> 13));
}

namespace {

// The scalar function's integer rounding, 16 lanes at a time. Not AVX512-BF16's vcvtneps2bf16: that
// instruction flushes subnormal inputs to zero, so it would disagree with the scalar path (and torch).
__attribute__((target("avx512f,avx512bw"))) void f32_to_bf16_avx512(bf16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x400000);
  for (; i + 16 <= n; i += 16) {
    __m512i b = _mm512_loadu_si512(src + i);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, abs_mask), inf);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
    __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(bias, lsb));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(b, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

__attribute__((target("avx512f"))) void bf16_to_f32_avx512(float* dst, const bf16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// The same integer rounding, 8 lanes at a time. AVX2 has no unsigned compare, but |b| has its top bit
// clear, so the signed one serves for the NaN test. Returns the 8 bf16 codes in the low half of each lane.
__attribute__((target("avx2"))) inline __m256i f32_to_bf16_lanes_avx2(const float* src) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_set1_epi32(0x400000)), nan);
  return _mm256_srli_epi32(r, 16);
}

// 16 elements a step: packus keeps the 16-bit codes (all in [0, 0xffff], so nothing saturates) but
// interleaves the two inputs' 128-bit lanes, which permute4x64 (qwords 0, 2, 1, 3) puts back in order.
__attribute__((target("avx2"))) void f32_to_bf16_avx2(bf16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = f32_to_bf16_lanes_avx2(src + i), hi = f32_to_bf16_lanes_avx2(src + i + 8);
    const __m256i packed = _mm256_packus_epi32(lo, hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(float* dst, const bf16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace

// The conversions are integer work, so their AVX2 paths need AVX2 only (no FMA); all paths give the bits
// of the scalar functions.
void convert_f32_to_bf16(bf16_t* dst, const float* src, size_t n) {
  const CpuFeatures& cpu = cpu_features();
  if (cpu.avx512bw) return f32_to_bf16_avx512(dst, src, n);
  if (cpu.avx2) return f32_to_bf16_avx2(dst, src, n);
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void convert_bf16_to_f32(float* dst, const bf16_t* src, size_t n) {
  const CpuFeatures& cpu = cpu_features();
  if (cpu.avx512f) return bf16_to_f32_avx512(dst, src, n);
  if (cpu.avx2) return bf16_to_f32_avx2(dst, src, n);
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void convert_f16_to_f32(float* dst, const f16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void convert_f32_to_f16(f16_t* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void convert_to_f32(float* dst, const void* src, DType src_type, size_t n) {
  switch (src_type) {
    case DType::f32: std::memcpy(dst, src, n * 4); return;
    case DType::bf16: return convert_bf16_to_f32(dst, static_cast<const bf16_t*>(src), n);
    case DType::f16: return convert_f16_to_f32(dst, static_cast<const f16_t*>(src), n);
    default: LT_FAIL("cannot convert {} to f32: not a floating type", dtype_name(src_type));
  }
}

void convert_from_f32(void* dst, DType dst_type, const float* src, size_t n) {
  switch (dst_type) {
    case DType::f32: std::memcpy(dst, src, n * 4); return;
    case DType::bf16: return convert_f32_to_bf16(static_cast<bf16_t*>(dst), src, n);
    case DType::f16: return convert_f32_to_f16(static_cast<f16_t*>(dst), src, n);
    default: LT_FAIL("cannot convert f32 to {}: not a floating type", dtype_name(dst_type));
  }
}

namespace {
constexpr int64_t kParallelConvertChunk = int64_t(1) << 16;  // elements per task
}  // namespace

void parallel_convert_to_f32(float* dst, const void* src, DType src_type, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  const size_t e = dtype_size(src_type);
  parallel_chunks(int64_t(n), kParallelConvertChunk, [&](int64_t b, int64_t end) {
    convert_to_f32(dst + b, s + size_t(b) * e, src_type, size_t(end - b));
  });
}

void parallel_convert_from_f32(void* dst, DType dst_type, const float* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const size_t e = dtype_size(dst_type);
  parallel_chunks(int64_t(n), kParallelConvertChunk, [&](int64_t b, int64_t end) {
    convert_from_f32(d + size_t(b) * e, dst_type, src + b, size_t(end - b));
  });
}

}  // namespace lt
