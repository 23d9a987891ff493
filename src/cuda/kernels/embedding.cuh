// cuda/kernels/embedding.cuh — token embedding (ops/embedding.h).
//
// Forward: one block per token copies (and rounds, for bf16 activations) its table row.
// Backward without atomics, in the CPU op's order: one thread per (present id, column) sums the id's tokens
// in token order — an id seen once adds dout's row directly, more often in f64, added to dtable once in f32.
// Grid (P present ids, ⌈C/128⌉); the host's group_tokens_by_id gives present/start/order.
#pragma once

#include "cuda/kernels/common.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kEmbeddingThreads = 128;

template <class T>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_forward_kernel(T* out, const int32_t* ids, const float* table, int64_t C) {
  const int64_t n = blockIdx.x;
  const float* row = table + int64_t(ids[n]) * C;
  for (int64_t c = threadIdx.x; c < C; c += kEmbeddingThreads) store(out + n * C + c, row[c]);
}

__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_backward_kernel(float* dtable, const float* dout, const int32_t* present, const int32_t* start,
                              const int32_t* order, int64_t C) {
  const int64_t c = int64_t(blockIdx.y) * kEmbeddingThreads + threadIdx.x;
  if (c >= C) return;
  const int64_t i = blockIdx.x, k0 = start[i], k1 = start[i + 1];
  float* dst = dtable + int64_t(present[i]) * C + c;
  if (k1 - k0 == 1) {  // float(double(x)) == x: add the row directly
    *dst += dout[int64_t(order[k0]) * C + c];
    return;
  }
  double acc = 0.0;
  for (int64_t k = k0; k < k1; ++k) acc += double(dout[int64_t(order[k]) * C + c]);
  *dst += float(acc);
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
void embedding_backward(Stream s, float* dtable, const float* dout, const int32_t* present, const int32_t* start,
                        const int32_t* order, int64_t P, int64_t C) {
  if (P == 0) return;
  const unsigned col_blocks = unsigned((C + kEmbeddingThreads - 1) / kEmbeddingThreads);
  LT_LAUNCH(embedding_backward_kernel, dim3(unsigned(P), col_blocks), dim3(kEmbeddingThreads), 0,
            native_stream(s), dtable, dout, present, start, order, C);
}

}  // namespace lt::cuda::LT_KERNELS_NS
