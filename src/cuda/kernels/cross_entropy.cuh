// cuda/kernels/cross_entropy.cuh — softmax cross-entropy over the vocabulary and its gradient, one block per
// token row of a logits chunk: z[V] → dlogits = grad_scale · (softmax(z) − onehot(target)), as bf16 into their own
// buffer (the bf16 GEMMs' operand; the logits are left as they were) or, without one, as f32 in place.
//
// Two passes over the row, the fewest a softmax needs (the head's logits chunk is ~0.6 GB, far beyond L2, so each
// pass is a read of it from memory; the first version's separate max and sum passes and its f32 write beside the
// bf16 one cost 1.9 GB of traffic a 1024-token chunk more at a 152 k vocabulary):
//   1. each thread keeps a running maximum m_t of its elements and s_t = Σ exp(z − m_t) (exp in f32 widened to
//      f64; a larger z rescales s_t by exp(m_t,old − z)); the block's m = max m_t (exact in any order) and
//      s = Σ s_t · exp(m_t − m) by a fixed shared-memory tree; loss = m + log s − z[target] in f64, written per
//      row and summed in token order by a second kernel;
//   2. p = exp(z − m) / s, the gradient of each element from it.
// A thread takes eight consecutive elements at a time (two 16-byte loads, one 16-byte bf16 store) where V is a
// multiple of 8 and the buffers are 16-byte aligned (the head's workspace is), else one: its elements and their
// order are fixed by the shape, so every run gives the same bits. A row whose target is kIgnoreIndex (-100)
// adds nothing and gets zero gradients. The CPU op (ops/cpu/head.cpp) takes the maximum first and sums in 16
// f64 lanes: the two agree to f32 rounding.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/pack.cuh"
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

// One thread's running maximum m of the logits it has seen and s = Σ exp(z − m) over them. -inf adds nothing.
struct RunningSoftmax {
  float m = -INFINITY;
  double s = 0.0;
  __device__ __forceinline__ void add(float z) {
    if (z > m) {
      s = s * double(expf(m - z)) + 1.0;  // exp(-inf) = 0: the first element gives s = 1
      m = z;
    } else if (z != -INFINITY) {
      s += double(expf(z - m));
    }
  }
};

// Each of the row's elements once, W = 8 (packed) or 1 at a time: body(i, width) for elements [i, i + W) — this
// thread's packs i ≡ 8·tid (mod 8·kCeThreads) in order, or its elements i ≡ tid (mod kCeThreads).
template <class Body>
__device__ __forceinline__ void row_loop(int64_t V, bool packed, Body body) {
  const int tid = int(threadIdx.x);
  if (packed) {
    for (int64_t i = int64_t(kPack) * tid; i < V; i += int64_t(kPack) * kCeThreads)
      body(i, std::integral_constant<int, kPack>{});
  } else {
    for (int64_t i = tid; i < V; i += kCeThreads) body(i, std::integral_constant<int, 1>{});
  }
}

__global__ void __launch_bounds__(kCeThreads)
    cross_entropy_kernel(float* logits, bf16* dlogits_bf16, double* row_loss, const int32_t* targets, int64_t V,
                         float grad_scale, bool packed) {
  __shared__ double red_d[kCeThreads];
  __shared__ float red_f[kCeThreads];
  const int tid = int(threadIdx.x);
  const int64_t row = blockIdx.x;
  float* z = logits + row * V;
  bf16* zb = dlogits_bf16 ? dlogits_bf16 + row * V : nullptr;
  const int32_t target = targets[row];
  // The gradient of elements [i, i + W) out: bf16 into zb, or f32 over z.
  auto write = [&]<int W>(int64_t i, const float(&g)[W]) {
    if (zb) store_n<W>(zb + i, g);
    else store_n<W>(z + i, g);
  };
  if (target == kIgnoreIndex) {  // the whole block takes this branch
    row_loop(V, packed, [&](int64_t i, auto width) {
      float g[decltype(width)::value] = {};
      write(i, g);
    });
    if (tid == 0) row_loss[row] = 0.0;
    return;
  }
  RunningSoftmax part;
  row_loop(V, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float x[W];
    load_n<W>(x, z + i);
    for (int j = 0; j < W; ++j) part.add(x[j]);
  });
  const float m = block_tree(part.m, red_f, [](float a, float b) { return fmaxf(a, b); });
  const double mine = part.m == -INFINITY ? 0.0 : part.s * double(expf(part.m - m));
  const double s = block_tree(mine, red_d, [](double a, double b) { return a + b; });
  const float z_target = z[target];
  __syncthreads();  // z[target] is read before any thread overwrites the row (the f32 path)
  if (tid == 0) row_loss[row] = double(m) + log(s) - double(z_target);
  row_loop(V, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float x[W], g[W];
    load_n<W>(x, z + i);
    for (int j = 0; j < W; ++j) {
      const float p = float(double(expf(x[j] - m)) / s);
      g[j] = grad_scale * (p - (i + j == target ? 1.0f : 0.0f));
    }
    write(i, g);
  });
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
  // Packs of eight where every row starts 16-byte aligned in both buffers.
  const bool packed = rows_packed(V, {logits, dlogits_bf16});
  LT_LAUNCH(cross_entropy_kernel, dim3(unsigned(n)), dim3(kCeThreads), 0, native_stream(s), logits,
            dlogits_bf16 ? dev(dlogits_bf16) : nullptr, row_loss, targets, V, grad_scale, packed);
}

void sum_in_order(Stream s, double* total, const double* values, int64_t n) {
  if (n == 0) return;
  LT_LAUNCH(sum_in_order_kernel, dim3(1), dim3(32), 0, native_stream(s), total, values, n);
}

}  // namespace lt::cuda::LT_KERNELS_NS
