// cuda/kernels.h — the kernels the executor launches on a GPU, as host functions that enqueue them.
//
// One set of kernel sources (cuda/kernels/*.cuh) is compiled twice: by nvcc into lt::cuda::native (only when
// the build found nvcc: LT_WITH_CUDA) and by the host compiler against cuda-sim into lt::cuda::sim, which
// runs every kernel on the CPU, synchronously, so the tests check the kernels here (docs/cuda.md). Both
// namespaces declare the same functions (cuda/kernels_api.inc).
//
// Storage: activations and weights T ∈ {float, bf16_t}, read into f32 and rounded once where stored;
// activation gradients, norm weights, statistics (rstd) and parameter gradients are f32. Each kernel performs
// the CPU op's operations in the CPU op's order (ops/), so on f32 storage it gives the CPU op's bits
// (checked bit for bit under cuda-sim; on a GPU with nvcc's -fmad=false and IEEE division and sqrt).
// Pointers are device pointers (under cuda-sim: host memory); sizes as in ops/ops.h's legend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "ops/attention.h"
#include "ops/head.h"

namespace lt::cuda {

// A cudaStream_t for native launches (nullptr: the default stream); ignored by cuda-sim, whose launches
// run to completion before they return.
using Stream = void*;

// How the GEMMs of a composite op (head_forward_backward) run: natively, on `cublas` (a native::CublasLt of
// cuda/gemm.h) with its per-stream `workspace`; under cuda-sim both are ignored (emulate_matmul).
struct GemmContext {
  void* cublas = nullptr;
  void* workspace = nullptr;
};

// The fused LM head on a GPU: per chunk of shape.chunk_tokens tokens, the final RMSNorm, the logits GEMM,
// cross-entropy, and their backward (ops/head.h's contract: dx written, dnorm_w and dlm_w accumulated,
// *loss += Σ CE over counted tokens). All pointers are device pointers; targets are checked by the caller;
// workspace: head_workspace_bytes.
struct HeadArgs {
  float* dx;             // [N, C]
  float* dnorm_w;        // [C]
  float* dlm_w;          // [V, C]
  double* loss;          // one f64
  const float* x;        // [N, C] the last block's output
  const int32_t* targets;  // [N]
  const float* norm_w;   // [C]
  const void* lm_w;      // [V, C] in lm_type
  DType lm_type = DType::f32;  // f32, or bf16 for bf16 GEMMs (xn and dlogits are then rounded to bf16)
  float grad_scale = 1.0f;
  HeadShape shape{};
  void* workspace = nullptr;
};
size_t head_workspace_bytes(const HeadShape& s, DType lm_type);

// Device scratch rmsnorm_backward needs for rows × C: the f64 partial sums of dweight per fixed row chunk.
size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t C);

// Device scratch attention_backward needs: Di = rowsum(dO ∘ O), f32 [B, Hq, T].
size_t attention_backward_workspace_bytes(AttentionShape s);
// lt::Error naming the op unless the shape is one the attention kernels take (B, T ≥ 0; Hq a multiple of
// Hkv; grid limits), and for an unsupported head dimension (the kernels take 1 to 256).
void check_attention_shape(const char* op, AttentionShape s);
[[noreturn]] void throw_unsupported_head_dim(const char* op, int64_t D);

}  // namespace lt::cuda

namespace lt::cuda::sim {
#include "cuda/kernels_api.inc"
}  // namespace lt::cuda::sim

#if LT_WITH_CUDA
namespace lt::cuda::native {
#include "cuda/kernels_api.inc"
}  // namespace lt::cuda::native
#endif
