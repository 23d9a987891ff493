// cuda/kernels/lora.cuh — LoRA dropout (model/lora.h) on the GPU: the adapter's dropped input as a GEMM operand and
// the mask applied to its input gradient, element (row, i) kept by model/lora_mask.h's lora_keep — the CPU block's
// mask, so a recompute, every plan and an MLP chunk (row0: its first token) draw the same one; an expert's grouped
// rows name their tokens through `gather` (lora_row). Grid-stride loops.
#pragma once

#include "cuda/kernels/common.cuh"
#include "model/lora_mask.h"

namespace lt::cuda::LT_KERNELS_NS {
namespace detail {

// out[N, in_f] = keep ? in · keep_scale : 0 (in f32, rounded once on store to Out).
template <class Out, class In>
__global__ void lora_dropout_kernel(Out* out, const In* in, uint64_t key, int64_t row0, const int32_t* gather,
                                    int64_t per_token, int64_t N, int64_t in_f, float p, float keep_scale) {
  for (int64_t e = global_thread(); e < N * in_f; e += grid_threads()) {
    const uint64_t index =
        uint64_t(lora_row(row0, gather, per_token, e / in_f)) * uint64_t(in_f) + uint64_t(e % in_f);
    store(out + e, lora_keep(key, index, p) ? load(in + e) * keep_scale : 0.0f);
  }
}

// din[N, in_f] += keep ? dx · keep_scale : 0.
__global__ void lora_dropout_backward_kernel(float* din, const float* dx, uint64_t key, int64_t row0,
                                             const int32_t* gather, int64_t per_token, int64_t N, int64_t in_f, float p,
                                             float keep_scale) {
  for (int64_t e = global_thread(); e < N * in_f; e += grid_threads()) {
    const uint64_t index =
        uint64_t(lora_row(row0, gather, per_token, e / in_f)) * uint64_t(in_f) + uint64_t(e % in_f);
    if (lora_keep(key, index, p)) din[e] += dx[e] * keep_scale;
  }
}

template <class Out, class In>
void lora_dropout(Stream s, Out* out, const In* in, uint64_t key, int64_t row0, const int32_t* gather,
                  int64_t per_token, int64_t N, int64_t in_f, float p) {
  const auto lora_dropout_kernel_ = lora_dropout_kernel<Out, In>;  // (a macro argument cannot hold the comma)
  LT_ELEMENTWISE(lora_dropout_kernel_, N * in_f, out, in, key, row0, gather, per_token, N, in_f, p,
                 1.0f / (1.0f - p));
}

}  // namespace detail

void lora_dropout(Stream s, bf16_t* out, const bf16_t* in, uint64_t key, int64_t row0,
                  const int32_t* gather, int64_t per_token, int64_t N, int64_t in_f, float p) {
  detail::lora_dropout(s, dev(out), dev(in), key, row0, gather, per_token, N, in_f, p);
}
void lora_dropout(Stream s, float* out, const bf16_t* in, uint64_t key, int64_t row0,
                  const int32_t* gather, int64_t per_token, int64_t N, int64_t in_f, float p) {
  detail::lora_dropout(s, out, dev(in), key, row0, gather, per_token, N, in_f, p);
}
void lora_dropout(Stream s, bf16_t* out, const float* in, uint64_t key, int64_t row0,
                  const int32_t* gather, int64_t per_token, int64_t N, int64_t in_f, float p) {
  detail::lora_dropout(s, dev(out), in, key, row0, gather, per_token, N, in_f, p);
}
void lora_dropout(Stream s, float* out, const float* in, uint64_t key, int64_t row0,
                  const int32_t* gather, int64_t per_token, int64_t N, int64_t in_f, float p) {
  detail::lora_dropout(s, out, in, key, row0, gather, per_token, N, in_f, p);
}
void lora_dropout_backward(Stream s, float* din, const float* dx, uint64_t key, int64_t row0, const int32_t* gather,
                           int64_t per_token, int64_t N, int64_t in_f, float p) {
  LT_ELEMENTWISE(detail::lora_dropout_backward_kernel, N * in_f, din, dx, key, row0, gather, per_token, N, in_f, p,
                 1.0f / (1.0f - p));
}

}  // namespace lt::cuda::LT_KERNELS_NS
