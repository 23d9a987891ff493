// MXFP4 (io/mxfp4.h) against its definition: each E2M1 code decoded from its bit fields, times 2^(scale − 127), over
// every code, scales from the smallest to the largest finite, and odd row counts; the nibble order and the NaN scale.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "io/mxfp4.h"
#include "testing/error_testing.h"

namespace lt {
namespace {

// E2M1 from its fields: sign s, exponent e (bias 1), mantissa m: e = 0 is subnormal (m · 0.5), else 2^(e−1)·(1 + m/2).
double e2m1(uint8_t code) {
  const int s = code >> 3, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return s ? -mag : mag;
}

TEST(Mxfp4, CodesAreE2M1) {
  for (uint8_t c = 0; c < 16; ++c) {
    EXPECT_EQ(double(fp4_e2m1_value(c)), e2m1(c)) << int(c);
    EXPECT_EQ(std::signbit(fp4_e2m1_value(c)), c >= 8) << int(c);  // code 8 is -0
  }
}

TEST(Mxfp4, DequantisesEveryCodeAndScaleExactly) {
  const int64_t rows = 7, cols = 96, nb = cols / 32;
  Rng rng(17);
  std::vector<uint8_t> blocks(size_t(rows * nb * 16)), scales(size_t(rows * nb));
  for (auto& b : blocks) b = uint8_t(rng.below(256));
  // The smallest scale (subnormal results), the largest 6 · 2^(s − 127) does not overflow f32 (252), and typical ones.
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i == 0 ? 0 : i == 1 ? 252 : 100 + rng.below(50));
  std::vector<float> out(size_t(rows * cols), NAN);
  mxfp4_dequantize(out.data(), blocks.data(), scales.data(), rows, cols, "w_blocks");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t b = c / 32, j = c % 32;
      const uint8_t byte = blocks[size_t((r * nb + b) * 16 + j / 2)];
      const uint8_t code = j % 2 == 0 ? byte & 0x0F : byte >> 4;  // the low nibble first
      const double want = std::ldexp(e2m1(code), int(scales[size_t(r * nb + b)]) - 127);
      ASSERT_EQ(double(out[size_t(r * cols + c)]), want) << "row " << r << " col " << c;
    }
}

// One hand-made block: bytes 0x21 (1.0 then 0.5) and 0xF9 (-0.5 then -6.0), scale 2^1.
TEST(Mxfp4, NibbleOrderOnAKnownBlock) {
  std::vector<uint8_t> blocks(16, 0), scales = {128};
  blocks[0] = 0x21;
  blocks[1] = 0xF9;
  std::vector<float> out(32);
  mxfp4_dequantize(out.data(), blocks.data(), scales.data(), 1, 32, "x");
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], -1.0f);
  EXPECT_EQ(out[3], -12.0f);
  for (int i = 4; i < 32; ++i) EXPECT_EQ(out[size_t(i)], 0.0f);
}

TEST(Mxfp4, RefusesANaNScaleAndRaggedRows) {
  std::vector<uint8_t> blocks(32, 0), scales = {127, 255};
  std::vector<float> out(64);
  testing::expect_error([&] { mxfp4_dequantize(out.data(), blocks.data(), scales.data(), 1, 64, "gate_up_proj_blocks"); },
                        {"gate_up_proj_blocks", "row 0 block 1", "scale 255"});
  testing::expect_error([&] { mxfp4_dequantize(out.data(), blocks.data(), scales.data(), 1, 48, "down_proj_blocks"); },
                        {"down_proj_blocks", "48", "multiple of 32"});
  blocks[3] = 0x40;  // the 8th value: 2.0, times 2^127 is 2^128
  scales = {254};
  testing::expect_error([&] { mxfp4_dequantize(out.data(), blocks.data(), scales.data(), 1, 32, "w_blocks"); },
                        {"w_blocks", "row 0 block 0", "overflows f32"});
}

}  // namespace
}  // namespace lt
