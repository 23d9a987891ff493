// io/mxfp4.cpp — MXFP4 (E2M1 codes, E8M0 block scales) to f32. A 16-entry table and an ldexp per value: the
// dequantisation runs once per load, bound by reading the file.
#include "io/mxfp4.h"

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

namespace lt {
namespace {

constexpr int64_t kBlock = 32;  // values a scale covers
// The E2M1 values by code, as transformers' FP4_VALUES lists them.
constexpr float kFp4[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

float fp4_e2m1_value(uint8_t code) {
  LT_CHECK(code < 16, "fp4_e2m1_value: code {} is not 4 bits", code);
  return kFp4[code];
}

void mxfp4_dequantize(float* out, const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols,
                      const std::string& what) {
  LT_CHECK(rows >= 0 && cols > 0 && cols % kBlock == 0,
           "{}: MXFP4 rows of {} values: expected a positive multiple of {}", what, cols, kBlock);
  const int64_t nb = cols / kBlock;  // blocks a row
  parallel_chunks(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t s = scales[r * nb + b];
        LT_CHECK(s != 255, "{}: row {} block {} has scale 255 (E8M0's NaN)", what, r, b);
        const int e = int(s) - 127;
        const uint8_t* q = blocks + (r * nb + b) * (kBlock / 2);
        float* o = out + r * cols + b * kBlock;
        for (int64_t i = 0; i < kBlock / 2; ++i) {
          o[2 * i] = std::ldexp(kFp4[q[i] & 0x0F], e);
          o[2 * i + 1] = std::ldexp(kFp4[q[i] >> 4], e);
        }
        for (int64_t i = 0; i < kBlock; ++i)
          LT_CHECK(std::isfinite(o[i]), "{}: row {} block {}: {} x 2^{} overflows f32", what, r, b,
                   i % 2 ? kFp4[q[i / 2] >> 4] : kFp4[q[i / 2] & 0x0F], e);
      }
  });
}

}  // namespace lt
