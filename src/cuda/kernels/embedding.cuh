// cuda/kernels/embedding.cuh — token embedding (ops/embedding.h).
//
// Forward: one block per token copies (and rounds, for bf16 activations) its table row.
// Backward's device half (ops/embedding.h embedding_grad_rows) without atomics, in the CPU op's order: a thread
// per (present id, 8 columns — one where C or a pointer does not allow 16-byte packs) sums the id's tokens in
// token order — an id seen once copies dout's row, more often in f64, rounded to f32 once — into rows[P, C], which
// the host adds to the table. Grid (P present ids, ⌈C/(128·W)⌉); the host's group_tokens_by_id gives start/order.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/pack.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kEmbeddingThreads = 128;

template <class T>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_forward_kernel(T* out, const int32_t* ids, const float* table, int64_t C) {
  const int64_t n = blockIdx.x;
  const float* row = table + int64_t(ids[n]) * C;
  for (int64_t c = threadIdx.x; c < C; c += kEmbeddingThreads) store(out + n * C + c, row[c]);
}

template <int W>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_grad_rows_kernel(float* rows, const float* dout, const int32_t* start, const int32_t* order, int64_t C) {
  const int64_t c = (int64_t(blockIdx.y) * kEmbeddingThreads + threadIdx.x) * W;
  if (c >= C) return;
  const int64_t i = blockIdx.x, k0 = start[i], k1 = start[i + 1];
  float* dst = rows + i * C + c;
  if (k1 - k0 == 1) {  // float(double(x)) == x: the row as is
    copy_n<W>(dst, dout + int64_t(order[k0]) * C + c);
    return;
  }
  double acc[W] = {};
  for (int64_t k = k0; k < k1; ++k) {
    float x[W];
    load_n<W>(x, dout + int64_t(order[k]) * C + c);
    for (int j = 0; j < W; ++j) acc[j] += double(x[j]);
  }
  float y[W];
  for (int j = 0; j < W; ++j) y[j] = float(acc[j]);
  store_n<W>(dst, y);
}

namespace detail {
template <class T>
void embedding_forward(Stream s, T* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
  if (N == 0) return;
  LT_LAUNCH(embedding_forward_kernel<T>, dim3(unsigned(N)), dim3(kEmbeddingThreads), 0, native_stream(s), out,
            ids, table, C);
}
}  // namespace detail

void embedding_forward(Stream s, float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
  detail::embedding_forward(s, out, ids, table, N, C);
}
void embedding_forward(Stream s, bf16_t* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
  detail::embedding_forward(s, dev(out), ids, table, N, C);
}
void embedding_grad_rows(Stream s, float* rows, const float* dout, const int32_t* start, const int32_t* order,
                         int64_t P, int64_t C) {
  if (P == 0) return;
  const bool packed = rows_packed(C, {rows, dout});
  const int64_t cols = kEmbeddingThreads * (packed ? kPack : 1);  // columns a block covers
  const dim3 grid(unsigned(P), unsigned((C + cols - 1) / cols));
  if (packed)
    LT_LAUNCH(embedding_grad_rows_kernel<kPack>, grid, dim3(kEmbeddingThreads), 0, native_stream(s), rows, dout,
              start, order, C);
  else
    LT_LAUNCH(embedding_grad_rows_kernel<1>, grid, dim3(kEmbeddingThreads), 0, native_stream(s), rows, dout, start,
              order, C);
}

}  // namespace lt::cuda::LT_KERNELS_NS
