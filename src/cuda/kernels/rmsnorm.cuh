// cuda/kernels/rmsnorm.cuh — RMSNorm forward and backward in ops/cpu/rmsnorm.cpp's order (ops/rmsnorm.h).
//
// Rows go to half-warps: a block of 128 threads takes 8 rows; lane k (0..15) of a half-warp sums the row's
// c ≡ k (mod 16) in order, and the shuffle tree below combines the 16 lanes exactly as the CPU op's
// acc[k] += acc[k + w]. Rows past the end still take part in the shuffles (all 32 lanes name the full
// mask) and store nothing. Memory-bound, as on the CPU.
//
// Where C % 8 == 0 and the rows are 16-byte aligned (the executor's buffers), the kernels run with W = 8 elements a
// lane and read and write 16 bytes at a time (pack.cuh): a lane makes the sum's terms of eight consecutive elements
// into a per-half-warp stage in shared memory, and lane k then adds the stage's c ≡ k (mod 16) in order — the CPU's
// order, so the same bits as W = 1, which takes every other shape and any unaligned view.
//
// dweight: one thread per column per fixed row chunk (rmsnorm_dweight_chunk_rows) sums g · (x · rstd) in
// f64 into the workspace [chunks, C]; a second kernel adds the chunks in order and adds the total to
// dweight once in f32 — no atomics, the CPU op's bits.
#pragma once

#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/pack.cuh"
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

// The packed kernels' stage: 32 packs of a row (256 elements, as f32 terms) per half-warp at a time, each
// half-warp's stage 16 floats past the last so that the two half-warps of a warp read different banks.
constexpr int kNormStagePacks = 2 * kRmsnormLanes;
constexpr int kNormStage = kNormStagePacks * kPack;
constexpr int kNormStageStride = kNormStage + 16;
constexpr int kNormStageFloats = kNormRowsPerBlock * kNormStageStride;  // a block's, 8.5 KiB

// A half-warp's row: lane k (0..15) of half-warp `row` of the launch; rows past `rows` are not live.
struct HalfWarpRow {
  int lane;
  int64_t row;
  bool live;
};
__device__ __forceinline__ HalfWarpRow half_warp_row(int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kNormRowsPerBlock + threadIdx.x / kRmsnormLanes;
  return {int(threadIdx.x) % kRmsnormLanes, row, row < rows};
}

// Σ_c term(c) over a row of n in the CPU's lane order (lane k takes c ≡ k (mod 16) in order; the lane tree), the
// terms made W at a time: terms(c, p) fills p[0..W) with the terms of elements c..c+W-1. W = 1: lane k makes and
// adds its own. W = kPack (n % 8 == 0, 16-byte loads): lane t makes packs t and t + 16 of each 256-element stretch
// into its half-warp's part of `stage` (the block's kNormStageFloats), then lane k adds stage elements k, k + 16,
// ... in order — the same sum. Every lane of the warp calls it (both half-warps loop over the same n); a row that
// is not live makes no terms and gets 0.
template <int W, class Terms>
__device__ __forceinline__ float half_warp_ordered_sum(float* stage, int64_t n, bool live, Terms terms) {
  const int lane = int(threadIdx.x) % kRmsnormLanes;
  float acc = 0.0f;
  if constexpr (W == 1) {
    if (live)
      for (int64_t c = lane; c < n; c += kRmsnormLanes) {
        float p[1];
        terms(c, p);
        acc += p[0];
      }
  } else {
    float* mine = stage + int(threadIdx.x) / kRmsnormLanes * kNormStageStride;
    for (int64_t base = 0; base < n; base += kNormStage) {
      for (int u = lane; u < kNormStagePacks; u += kRmsnormLanes) {
        const int64_t c = base + int64_t(u) * kPack;
        if (live && c < n) {
          float p[kPack];
          terms(c, p);
          store_pack(mine + u * kPack, p);
        }
      }
      __syncwarp();
      if (live)
        for (int j = lane; j < kNormStage && base + j < n; j += kRmsnormLanes) acc += mine[j];
      __syncwarp();  // the stage is read before the next stretch overwrites it
    }
  }
  return half_warp_tree_sum(acc);
}

// The half-warp's elementwise pass over a row of n: body(c, width) for elements [c, c + W), lane k taking the
// k-th, (k + 16)-th, ... group of W.
template <int W, class Body>
__device__ __forceinline__ void half_warp_row_loop(int lane, int64_t n, Body body) {
  for (int64_t c = int64_t(lane) * W; c < n; c += kRmsnormLanes * W) body(c, std::integral_constant<int, W>{});
}

// out[rows, C], rstd[rows]
template <int W, class T>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_forward_kernel(T* out, float* rstd, const T* in, const float* weight, int64_t rows, int64_t C,
                           float eps) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(rows);
  const T* x = in + (live ? row : 0) * C;
  const float ss = half_warp_ordered_sum<W>(stage, C, live, [&](int64_t c, float (&p)[W]) {
    load_n(p, x + c);
    for (int e = 0; e < W; ++e) p[e] = p[e] * p[e];
  });
  if (!live) return;
  const float ms = ss / float(C);  // a division, as torch's mean
  const float s = 1.0f / sqrtf(ms + eps);
  if (lane == 0) rstd[row] = s;
  T* y = out + row * C;
  half_warp_row_loop<W>(lane, C, [&](int64_t c, auto) {
    float v[W], w[W];
    load_n(v, x + c), load_n(w, weight + c);
    for (int e = 0; e < W; ++e) v[e] = (v[e] * s) * w[e];
    store_n(y + c, v);
  });
}

// din[rows, C] = rstd · (w·g - x · rstd² · mean(w·g·x))
template <int W, class T>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_backward_din_kernel(float* din, const float* dout, const T* in, const float* weight,
                                const float* rstd, int64_t rows, int64_t C) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(rows);
  const T* x = in + (live ? row : 0) * C;
  const float* g = dout + (live ? row : 0) * C;
  const float dot = half_warp_ordered_sum<W>(stage, C, live, [&](int64_t c, float (&p)[W]) {
    float w[W], gc[W];
    load_n(w, weight + c), load_n(gc, g + c), load_n(p, x + c);
    for (int e = 0; e < W; ++e) p[e] = (w[e] * gc[e]) * p[e];
  });
  if (!live) return;
  const float s = rstd[row];
  const float m = dot / float(C);
  const float k = s * s * m;
  float* dx = din + row * C;
  half_warp_row_loop<W>(lane, C, [&](int64_t c, auto) {
    float w[W], gc[W], v[W];
    load_n(w, weight + c), load_n(gc, g + c), load_n(v, x + c);
    for (int e = 0; e < W; ++e) v[e] = s * ((w[e] * gc[e]) - v[e] * k);
    store_n(dx + c, v);
  });
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
  if (rows_packed(C, {out, in, weight}))
    LT_LAUNCH((rmsnorm_forward_kernel<kPack, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0, native_stream(s),
              out, rstd, in, weight, rows, C, eps);
  else
    LT_LAUNCH((rmsnorm_forward_kernel<1, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0, native_stream(s),
              out, rstd, in, weight, rows, C, eps);
}

template <class T>
void rmsnorm_backward(Stream s, float* din, float* dweight, const float* dout, const T* in, const float* weight,
                      const float* rstd, int64_t rows, int64_t C, void* workspace) {
  if (rows == 0) return;
  if (rows_packed(C, {din, dout, in, weight}))
    LT_LAUNCH((rmsnorm_backward_din_kernel<kPack, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0,
              native_stream(s), din, dout, in, weight, rstd, rows, C);
  else
    LT_LAUNCH((rmsnorm_backward_din_kernel<1, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0,
              native_stream(s), din, dout, in, weight, rstd, rows, C);
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
