// cuda/kernels/rmsnorm.cuh — RMSNorm forward and backward in ops/cpu/rmsnorm.cpp's order (ops/rmsnorm.h).
//
// Rows go to half-warps: a block of 128 threads takes 8 rows; lane k (0..15) of a half-warp sums the row's
// c ≡ k (mod 16) in order, and the shuffle tree below combines the 16 lanes exactly as the CPU op's
// acc[k] += acc[k + w]. Rows past the end still take part in the shuffles (all 32 lanes name the full
// mask) and store nothing. Reading a row 16 lanes at a time moves 64 contiguous bytes (f32) per half-warp
// step: memory-bound, as on the CPU.
//
// dweight: one thread per column per fixed row chunk (rmsnorm_dweight_chunk_rows) sums g · (x · rstd) in
// f64 into the workspace [chunks, C]; a second kernel adds the chunks in order and adds the total to
// dweight once in f32 — no atomics, the CPU op's bits.
#pragma once

#include "cuda/kernels/common.cuh"
#include "ops/rmsnorm.h"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kNormThreads = 128;
constexpr int kNormRowsPerBlock = kNormThreads / kRmsnormLanes;  // 8

// Σ over this half-warp's 16 lanes of `acc`, the CPU's lane tree; every lane of the warp must call it.
__device__ __forceinline__ float half_warp_tree_sum(float acc) {
  for (int width = kRmsnormLanes / 2; width >= 1; width /= 2) {
    const float other = __shfl_down_sync(0xffffffffu, acc, unsigned(width), kRmsnormLanes);
    acc = acc + other;  // lanes < width hold acc[k] + acc[k + width]; the others are not read again
  }
  return __shfl_sync(0xffffffffu, acc, 0, kRmsnormLanes);
}

// Σ x[c]² over a row of n: lane k of the half-warp sums c ≡ k (mod 16) in order, the lane tree combines them
// (the CPU op's order); every lane gets the sum (0 for a row that is not live). Every lane of the warp calls it.
template <class T>
__device__ __forceinline__ float half_warp_sum_squares(const T* x, int64_t n, bool live) {
  const int lane = int(threadIdx.x) % kRmsnormLanes;
  float acc = 0.0f;
  if (live)
    for (int64_t c = lane; c < n; c += kRmsnormLanes) {
      const float v = load(x + c);
      acc += v * v;
    }
  return half_warp_tree_sum(acc);
}

// out[rows, C], rstd[rows]
template <class T>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_forward_kernel(T* out, float* rstd, const T* in, const float* weight, int64_t rows, int64_t C,
                           float eps) {
  const int lane = int(threadIdx.x) % kRmsnormLanes;
  const int64_t row = int64_t(blockIdx.x) * kNormRowsPerBlock + threadIdx.x / kRmsnormLanes;
  const bool live = row < rows;
  const T* x = in + (live ? row : 0) * C;
  const float ss = half_warp_sum_squares(x, C, live);
  if (!live) return;
  const float ms = ss / float(C);  // a division, as torch's mean
  const float s = 1.0f / sqrtf(ms + eps);
  if (lane == 0) rstd[row] = s;
  T* y = out + row * C;
  for (int64_t c = lane; c < C; c += kRmsnormLanes) store(y + c, (load(x + c) * s) * weight[c]);
}

// din[rows, C] = rstd · (w·g - x · rstd² · mean(w·g·x))
template <class T>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_backward_din_kernel(float* din, const float* dout, const T* in, const float* weight,
                                const float* rstd, int64_t rows, int64_t C) {
  const int lane = int(threadIdx.x) % kRmsnormLanes;
  const int64_t row = int64_t(blockIdx.x) * kNormRowsPerBlock + threadIdx.x / kRmsnormLanes;
  const bool live = row < rows;
  const T* x = in + (live ? row : 0) * C;
  const float* g = dout + (live ? row : 0) * C;
  float acc = 0.0f;
  if (live)
    for (int64_t c = lane; c < C; c += kRmsnormLanes) acc += (weight[c] * g[c]) * load(x + c);
  const float dot = half_warp_tree_sum(acc);
  if (!live) return;
  const float s = rstd[row];
  const float m = dot / float(C);
  const float k = s * s * m;
  float* dx = din + row * C;
  for (int64_t c = lane; c < C; c += kRmsnormLanes) dx[c] = s * ((weight[c] * g[c]) - load(x + c) * k);
}

// partial[chunk, C] = Σ_{rows r of the chunk} f64(g[r, c]) · f64(x[r, c] · rstd[r]); grid (chunks, ⌈C/128⌉).
template <class T>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_backward_partial_kernel(double* partial, const float* dout, const T* in, const float* rstd,
                                    int64_t rows, int64_t C, int64_t chunk_rows) {
  const int64_t c = int64_t(blockIdx.y) * kNormThreads + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = int64_t(blockIdx.x) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  double p = 0.0;
  for (int64_t r = r0; r < r1; ++r) p += double(dout[r * C + c]) * double(load(in + r * C + c) * rstd[r]);
  partial[int64_t(blockIdx.x) * C + c] = p;
}

// dweight[c] += f32(Σ_chunks partial[chunk, c]), chunks in order.
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_backward_dweight_kernel(float* dweight, const double* partial, int64_t chunks, int64_t C) {
  const int64_t c = int64_t(blockIdx.x) * kNormThreads + threadIdx.x;
  if (c >= C) return;
  double total = 0.0;
  for (int64_t t = 0; t < chunks; ++t) total += partial[t * C + c];
  dweight[c] += float(total);
}

namespace detail {

inline unsigned norm_blocks(int64_t rows) { return unsigned((rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock); }

template <class T>
void rmsnorm_forward(Stream s, T* out, float* rstd, const T* in, const float* weight, int64_t rows, int64_t C,
                     float eps) {
  if (rows == 0) return;
  LT_LAUNCH(rmsnorm_forward_kernel<T>, dim3(norm_blocks(rows)), dim3(kNormThreads), 0, native_stream(s), out,
            rstd, in, weight, rows, C, eps);
}

template <class T>
void rmsnorm_backward(Stream s, float* din, float* dweight, const float* dout, const T* in, const float* weight,
                      const float* rstd, int64_t rows, int64_t C, void* workspace) {
  if (rows == 0) return;
  LT_LAUNCH(rmsnorm_backward_din_kernel<T>, dim3(norm_blocks(rows)), dim3(kNormThreads), 0, native_stream(s),
            din, dout, in, weight, rstd, rows, C);
  if (!dweight) return;  // a frozen weight (model/finetune.h): no gradient
  const int64_t chunk_rows = rmsnorm_dweight_chunk_rows(rows);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  const unsigned col_blocks = unsigned((C + kNormThreads - 1) / kNormThreads);
  double* partial = static_cast<double*>(workspace);
  LT_LAUNCH(rmsnorm_backward_partial_kernel<T>, dim3(unsigned(chunks), col_blocks), dim3(kNormThreads), 0,
            native_stream(s), partial, dout, in, rstd, rows, C, chunk_rows);
  LT_LAUNCH(rmsnorm_backward_dweight_kernel, dim3(col_blocks), dim3(kNormThreads), 0, native_stream(s), dweight,
            partial, chunks, C);
}

}  // namespace detail

void rmsnorm_forward(Stream s, float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                     int64_t C, float eps) {
  detail::rmsnorm_forward(s, out, rstd, in, weight, rows, C, eps);
}
void rmsnorm_forward(Stream s, bf16_t* out, float* rstd, const bf16_t* in, const float* weight, int64_t rows,
                     int64_t C, float eps) {
  detail::rmsnorm_forward(s, dev(out), rstd, dev(in), weight, rows, C, eps);
}
void rmsnorm_backward(Stream s, float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t rows, int64_t C, void* workspace) {
  detail::rmsnorm_backward(s, din, dweight, dout, in, weight, rstd, rows, C, workspace);
}
void rmsnorm_backward(Stream s, float* din, float* dweight, const float* dout, const bf16_t* in,
                      const float* weight, const float* rstd, int64_t rows, int64_t C, void* workspace) {
  detail::rmsnorm_backward(s, din, dweight, dout, dev(in), weight, rstd, rows, C, workspace);
}

}  // namespace lt::cuda::LT_KERNELS_NS
