// ops/linear.h — y = x · Wᵀ + b, the HF nn.Linear, on ops/gemm.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace lt {

enum class ComputeType : uint8_t { f32, bf16 };

// The parameter gradients (dW, dbias) sum over the tokens in fixed slices of kTokenSlice, one after another,
// and the GEMMs' rows never depend on how many there are (ops/gemm.h): so a caller may split the tokens of a
// backward at multiples of kTokenSlice — the MLP's token chunks (model/block.h) — and get the same bits.
// Large enough that dW's read-modify-write per slice stays well below the slice's GEMM work.
constexpr int64_t kTokenSlice = 4096;

// A weight matrix as the op receives it: f32 master data, or its bf16 copy in bf16 mode.
struct WeightRef {
  const void* data = nullptr;
  DType dtype = DType::f32;  // f32 or bf16
  const float* f32() const;
  const bf16_t* bf16() const;
};

// out[N, out_f] = in[N, in_f] · W[out_f, in_f]ᵀ + bias[out_f] (bias may be null).
// W.dtype == bf16 selects the bf16 GEMM: `in` is rounded to bf16 first.
void linear_forward(float* out, const float* in, WeightRef W, const float* bias,
                    int64_t N, int64_t in_f, int64_t out_f);

// din[N, in_f]  = dout · W          (written; skipped when din is null)
// dW[out_f, in_f] += doutᵀ · in      (accumulated; f32 master gradient; token slices of kTokenSlice in order;
//                                    skipped when null: a frozen weight, model/finetune.h)
// dbias[out_f]  += Σ_rows dout       (accumulated; skipped when null; per token slice, in order)
// In bf16 mode dout and in are rounded to bf16 as GEMM operands.
void linear_backward(float* din, float* dW, float* dbias,
                     const float* dout, const float* in, WeightRef W,
                     int64_t N, int64_t in_f, int64_t out_f);

// din[N, in_f] = dout · W (written): linear_backward's input gradient alone, for a caller whose weight gradient
// takes another dout (the Mixture-of-Experts combine's backward, model/moe_ffn.cpp). Same GEMM, same bits.
void linear_backward_input(float* din, const float* dout, WeightRef W, int64_t N, int64_t in_f, int64_t out_f);

}  // namespace lt
