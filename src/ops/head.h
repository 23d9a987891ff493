// ops/head.h — the language-model head fused and chunked: final RMSNorm, lm_head GEMM, cross-entropy.
// Tokens are processed in chunks so at most chunk·V logits exist at once (never N·V).
//
// targets[N] are already shifted (target of token n is the label of token n+1 in its row); -100 means
// "not counted". The loss is Σ over counted tokens of -log softmax(logits)[target]; callers divide by
// the count (the model uses the mean over counted tokens, as transformers does).
#pragma once

#include <cstdint>

#include "ops/linear.h"

namespace lt {

constexpr int32_t kIgnoreIndex = -100;

struct HeadShape {
  int64_t N, C, V;
  float eps;                  // RMSNorm epsilon
  int64_t chunk_tokens = 256; // tokens per logits chunk
};

// Returns Σ CE over counted tokens (double). x[N, C] is the last block's output (pre-norm).
double head_forward(const float* x, const int32_t* targets, const float* norm_w, WeightRef lm_w, HeadShape s);

// Loss and backward in one pass over chunks. grad_scale multiplies dlogits (1/count for the mean).
// dx[N, C] written; dnorm_w[C] and dlm_w[V, C] accumulated (either null: frozen, skipped). Returns Σ CE over
// counted tokens.
double head_forward_backward(float* dx, float* dnorm_w, float* dlm_w,
                             const float* x, const int32_t* targets, const float* norm_w, WeightRef lm_w,
                             float grad_scale, HeadShape s);

}  // namespace lt
