// ops/ops.h — every kernel family of a decoder LLM, forward and backward side by side.
//
// Legend (used in shape comments across ops/ and model/):
//   B batch rows, T tokens per row, N = B*T tokens, C hidden size, Hq query heads, Hkv key/value heads,
//   D head dimension, I MLP intermediate size, V vocabulary size, L layers; Gated DeltaNet (Qwen3.5/3.6):
//   Hk key heads, Hv value heads, dk / dv their head dims, K the short convolution's width.
//
// Conventions:
//   * Argument order: outputs, saved-for-backward, inputs, weights, sizes.
//   * Gradient contract: PARAMETER gradients ACCUMULATE (+=) so micro-batches and tied weights sum for
//     free; ACTIVATION gradients are WRITTEN (=). Names of gradients carry a `d` prefix.
//   * Activations are f32, row-major, tokens outer: x[N, C]. Linear weights are [out, in] as in HF.
//   * Each op has a plain reference (in tests or *_reference) and a finite-difference check.
//   * Deterministic: same inputs, same bits, whatever the thread count (core/parallel.h).
//   * ComputeType::bf16 rounds GEMM operands (weights and activations) to bf16 and accumulates in f32;
//     everything else (norms, softmax, losses) stays f32.
#pragma once

#include "ops/attention.h"
#include "ops/delta_gates.h"
#include "ops/embedding.h"
#include "ops/gated_delta.h"
#include "ops/gated_rmsnorm.h"
#include "ops/gemm.h"
#include "ops/head.h"
#include "ops/l2norm.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/short_conv.h"
#include "ops/sigmoid_gate.h"
#include "ops/swiglu.h"
