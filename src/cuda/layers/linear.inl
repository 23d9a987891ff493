// cuda/layers/linear.inl — the linear layer as the GPU block runs it: cuBLASLt calls (cuda/gemm.h) on stored bf16
// activations, rounded or widened to the weight's GEMM dtype as the CPU linear (ops/linear.h) rounds its operands.
// Host code compiled into both namespaces, like the block (cuda/layers/block.inl) and the sparse MLP (moe.inl).
#pragma once

#include "cuda/gemm.h"
#include "cuda/layers.h"
#include "cuda/layers/head.inl"
#include "cuda/layers/lora.inl"

namespace lt::cuda::LT_KERNELS_NS {
namespace detail {

inline MatType weight_type(const WeightRef& w) { return w.dtype == DType::bf16 ? MatType::bf16 : MatType::f32; }

// The linear layer's GEMMs on operands already in the weight's dtype (x: [N, in_f], dy: [N, out_f]):
// out = x · Wᵀ + bias; din = dy · W (written; skipped when null), dW += dyᵀ · x (skipped when null: a frozen weight),
// dbias += Σ dout (unrounded).
inline void linear_gemms(const GemmContext& g, Stream s, float* out, const void* x, const WeightRef& W,
                         const float* bias, int64_t N, int64_t in_f, int64_t out_f) {
  run_matmul(g, linear_forward_matmul(out, MatType::f32, x, W.data, weight_type(W), bias, N, out_f, in_f), s);
}
inline void linear_backward_gemms(const GemmContext& g, Stream s, float* din, float* dW, float* dbias, const float* dout,
                                  const void* dy, const void* x, const WeightRef& W, int64_t N, int64_t in_f,
                                  int64_t out_f) {
  const MatType t = weight_type(W);
  if (din) run_matmul(g, linear_dinput_matmul(din, dy, W.data, t, N, out_f, in_f), s);
  if (dW)
    for (const Matmul& mm : linear_dweight_matmuls(dW, dy, x, t, N, out_f, in_f)) run_matmul(g, mm, s);
  if (dbias) bias_grad(s, dbias, dout, N, out_f);
}

// out[N, out_f] (f32) = in[N, in_f] (bf16) · Wᵀ + bias. In f32 GEMM mode the operands are widened first
// (into `widened`, [N, in_f] f32). `lora`: the linear's adapter (cuda/layers/lora.inl), its update added to out.
inline void gpu_linear(const GemmContext& g, Stream s, float* out, const bf16_t* in, const WeightRef& W, const float* bias,
                int64_t N, int64_t in_f, int64_t out_f, float* widened, const AdapterCall& lora = {}) {
  const void* x = in;
  if (weight_type(W) == MatType::f32) {
    convert(s, widened, in, N * in_f);
    x = widened;
  }
  linear_gemms(g, s, out, x, W, bias, N, in_f, out_f);
  lora_forward(g, s, out, lora, in, N, in_f, out_f);
}

// din = dout · W (written; skipped when null), dW += doutᵀ · in, dbias += Σ dout: dout f32 rounded to bf16 as
// a GEMM operand in bf16 mode (`operand`), `in` the stored bf16 activation (widened into `widened` in f32 mode);
// then the adapter's part (din added).
inline void gpu_linear_backward(const GemmContext& g, Stream s, float* din, float* dW, float* dbias, const float* dout,
                         const bf16_t* in, const WeightRef& W, int64_t N, int64_t in_f, int64_t out_f, bf16_t* operand,
                         float* widened, const AdapterCall& lora = {}) {
  const void* dy = dout;
  const void* x = in;
  if (weight_type(W) == MatType::bf16) {
    convert(s, operand, dout, N * out_f);
    dy = operand;
  } else {
    convert(s, widened, in, N * in_f);
    x = widened;
  }
  linear_backward_gemms(g, s, din, dW, dbias, dout, dy, x, W, N, in_f, out_f);
  lora_backward(g, s, din, lora, dy, in, N, in_f, out_f);
}

// out[N, out_f] (f32) = in[N, in_f] (f32, not a stored activation: gated attention's o_proj input) · Wᵀ + bias,
// the input rounded into `operand` in bf16 mode as the CPU linear rounds it.
inline void gpu_linear_f32_input(const GemmContext& g, Stream s, float* out, const float* in, const WeightRef& W,
                                 const float* bias, int64_t N, int64_t in_f, int64_t out_f, bf16_t* operand,
                                 const AdapterCall& lora = {}) {
  const void* x = in;
  if (weight_type(W) == MatType::bf16) {
    convert(s, operand, in, N * in_f);
    x = operand;
  }
  linear_gemms(g, s, out, x, W, bias, N, in_f, out_f);
  lora_forward(g, s, out, lora, in, N, in_f, out_f);
}

// gpu_linear_backward for an f32 input: in bf16 mode dout and the input are rounded (`operand`, `operand_in`).
inline void gpu_linear_backward_f32_input(const GemmContext& g, Stream s, float* din, float* dW, float* dbias,
                                          const float* dout, const float* in, const WeightRef& W, int64_t N,
                                          int64_t in_f, int64_t out_f, bf16_t* operand, bf16_t* operand_in,
                                          const AdapterCall& lora = {}) {
  const void* dy = dout;
  const void* x = in;
  if (weight_type(W) == MatType::bf16) {
    convert(s, operand, dout, N * out_f);
    convert(s, operand_in, in, N * in_f);
    dy = operand, x = operand_in;
  }
  linear_backward_gemms(g, s, din, dW, dbias, dout, dy, x, W, N, in_f, out_f);
  lora_backward(g, s, din, lora, dy, in, N, in_f, out_f);
}

}  // namespace detail
}  // namespace lt::cuda::LT_KERNELS_NS
