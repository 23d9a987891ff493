// cuda/kernels/cross_entropy.cuh — softmax cross-entropy over the vocabulary and its gradient, one block per
// token row of a logits chunk, in place: z[V] → dlogits = grad_scale · (softmax(z) − onehot(target)).
//
// Per row: m = max z (exact in any order); s = Σ exp(z − m), exp in f32 widened to f64, each thread summing
// i ≡ tid (mod 256) in order, the 256 partials combined by a fixed shared-memory tree; loss = m + log s −
// z[target] in f64, written per row and summed in token order by a second kernel. A row whose target is
// kIgnoreIndex (-100) adds nothing and gets zero gradients. The same algorithm as ops/cpu/head.cpp, whose
// f64 sum runs in 16 lanes instead: results agree to f32 rounding, and every run gives the same bits.
#pragma once

#include "cuda/kernels/common.cuh"
#include "ops/head.h"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kCeThreads = 256;

// The block's `v` combined by a fixed tree over shared `red` (kCeThreads entries); every thread gets it.
template <class V, class Op>
__device__ __forceinline__ V block_tree(V v, V* red, Op op) {
  const int tid = int(threadIdx.x);
  red[tid] = v;
  __syncthreads();
  for (int stride = kCeThreads / 2; stride >= 1; stride /= 2) {
    if (tid < stride) red[tid] = op(red[tid], red[tid + stride]);
    __syncthreads();
  }
  const V out = red[0];
  __syncthreads();  // red is reused by the next reduction
  return out;
}

__global__ void __launch_bounds__(kCeThreads)
    cross_entropy_kernel(float* logits, bf16* dlogits_bf16, double* row_loss, const int32_t* targets, int64_t V,
                         float grad_scale) {
  __shared__ double red_d[kCeThreads];
  __shared__ float red_f[kCeThreads];
  const int tid = int(threadIdx.x);
  const int64_t row = blockIdx.x;
  float* z = logits + row * V;
  bf16* zb = dlogits_bf16 ? dlogits_bf16 + row * V : nullptr;
  const int32_t target = targets[row];
  if (target == kIgnoreIndex) {  // the whole block takes this branch
    for (int64_t i = tid; i < V; i += kCeThreads) {
      z[i] = 0.0f;
      if (zb) store(zb + i, 0.0f);
    }
    if (tid == 0) row_loss[row] = 0.0;
    return;
  }
  float mx = -INFINITY;
  for (int64_t i = tid; i < V; i += kCeThreads) mx = fmaxf(mx, z[i]);
  const float m = block_tree(mx, red_f, [](float a, float b) { return fmaxf(a, b); });
  double sum = 0.0;
  for (int64_t i = tid; i < V; i += kCeThreads) sum += double(expf(z[i] - m));
  const double s = block_tree(sum, red_d, [](double a, double b) { return a + b; });
  const float z_target = z[target];
  __syncthreads();  // z[target] is read before any thread overwrites the row
  if (tid == 0) row_loss[row] = double(m) + log(s) - double(z_target);
  for (int64_t i = tid; i < V; i += kCeThreads) {
    const float p = float(double(expf(z[i] - m)) / s);
    const float g = grad_scale * (p - (i == target ? 1.0f : 0.0f));
    z[i] = g;
    if (zb) store(zb + i, g);
  }
}

// *total += Σ row_loss[0 .. n) in token order (one thread: n is one chunk's tokens).
__global__ void sum_in_order_kernel(double* total, const double* row_loss, int64_t n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double t = *total;
  for (int64_t i = 0; i < n; ++i) t += row_loss[i];
  *total = t;
}

void cross_entropy(Stream s, float* logits, bf16_t* dlogits_bf16, double* row_loss, const int32_t* targets,
                   int64_t n, int64_t V, float grad_scale) {
  if (n == 0) return;
  LT_LAUNCH(cross_entropy_kernel, dim3(unsigned(n)), dim3(kCeThreads), 0, native_stream(s), logits,
            dlogits_bf16 ? dev(dlogits_bf16) : nullptr, row_loss, targets, V, grad_scale);
}

void sum_in_order(Stream s, double* total, const double* values, int64_t n) {
  if (n == 0) return;
  LT_LAUNCH(sum_in_order_kernel, dim3(1), dim3(32), 0, native_stream(s), total, values, n);
}

}  // namespace lt::cuda::LT_KERNELS_NS
