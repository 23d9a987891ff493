// io/mxfp4.h — GPT-OSS's MXFP4 expert tensors (OCP Microscaling FP4), dequantised on load.
//
// A released GPT-OSS checkpoint stores each expert matrix as two uint8 tensors (transformers' mxfp4 integration,
// convert_moe_packed_tensors):
//   `*_blocks` [E, rows, cols / 32, 16]: 32 FP4 (E2M1) codes a block, two a byte, the low nibble first;
//   `*_scales` [E, rows, cols / 32]:     one E8M0 scale a block, 2^(s − 127).
// Each row is one output feature over `cols` inputs (gate_up_proj: 2·Ie rows over C, gate and up interleaved;
// down_proj: C rows over Ie), so the rows dequantise straight onto an expert's [out, in] matrices.
// E2M1: sign bit 3, exponent bits 2..1, mantissa bit 0 — the values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}. A value times its
// power-of-two scale is exact in f32 (subnormal at the smallest scales) unless it overflows, which is refused naming
// the row and block, as is scale 255 (E8M0's NaN). Released checkpoints' scales sit near 127.
#pragma once

#include <cstdint>
#include <string>

namespace lt {

// The FP4 (E2M1) value of a 4-bit code.
float fp4_e2m1_value(uint8_t code);

// out[rows, cols] (f32) from blocks[rows, cols / 32, 16] and scales[rows, cols / 32]; cols a multiple of 32. `what`
// names the tensor in errors.
void mxfp4_dequantize(float* out, const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols,
                      const std::string& what);

}  // namespace lt
