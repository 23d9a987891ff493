// cuda/layers.h — composite ops on the GPU kernels: the fused LM head and the decoder block, each a sequence of
// kernel launches (cuda/kernels.h) and cuBLASLt calls (cuda/gemm.h) enqueued on one stream.
//
// Host code only, compiled by the host compiler into lt::cuda::sim (cuda/layers_sim.cpp: cuda-sim's kernels,
// the emulated GEMMs) and lt::cuda::native (cuda/native/layers_native.cpp: nvcc's kernels, cuBLASLt), from one
// source (cuda/layers/*.inl). It stays out of nvcc's translation units: fmt (lt::Error's formatting) does not
// compile under nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/kernels.h"
#include "device/device.h"
#include "model/block.h"
#include "model/layer_compute.h"
#include "ops/head.h"

namespace lt::cuda {

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
  float* dnorm_w;        // [C] (null: frozen, not made)
  float* dlm_w;          // [V, C] (null: frozen)
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
// The shape the GPU head runs at: s with chunks as large as kGpuHeadLogitsBytes of logits (f32 and their bf16 copy)
// hold, in multiples of 256 tokens from 256 to 4096. Per chunk the head re-reads lm_w twice and reads and writes all
// of dlm_w f32 (its k = chunk GEMM): at ops/head.h's 256-token chunks that traffic, not the GEMMs, set the head's
// time (docs/cuda.md). The GPU compute, its working set and cuda-sim's in-memory head use it alike, so they chunk
// (and so sum dlm_w) the same way.
inline constexpr int64_t kGpuHeadLogitsBytes = int64_t(1) << 30;
HeadShape gpu_head_shape(HeadShape s);

// One decoder layer on the GPU kernels (cuda/layers/block.inl), bf16 activation storage: the weights, token
// metadata and RoPE table as device pointers, and the layer's scratch (cuda_block_scratch_bytes).
struct CudaBlock {
  BlockShape shape{};
  BlockView weights{};          // matrices bf16 (bf16 GEMMs) or f32; vectors f32
  TokenInfo tok{};              // pos [N], doc_ids [B, T] or null
  const float* rope_cos = nullptr;  // [P, D/2] (ops' rope_table), P above every position
  const float* rope_sin = nullptr;
  void* scratch = nullptr;
};
// For a model with Gated DeltaNet layers (s.Hk > 0), the larger of its two layer kinds' carves.
size_t cuda_block_scratch_bytes(const BlockShape& s);

// The GPU layer compute's buffers (model/layer_compute.h's list): the recompute internals, the block's scratch,
// the head's workspace and loss, the RoPE table and cuBLASLt's workspace.
std::vector<ComputeBuffer> cuda_compute_buffers(const ModelConfig& cfg, const BlockShape& s, DType matrices);

// The GPU layer compute (model/layer_compute.h; cuda/layers/compute.inl) for `device`: natively on a CUDA
// device's compute stream (cuda/cuda_device.h), on cuda-sim's kernels and emulated GEMMs for any other device
// (the CPU device runs them on its compute stream) — the executor's GPU path, testable without a GPU.
std::unique_ptr<LayerCompute> make_cuda_layer_compute(Device& device);

}  // namespace lt::cuda

namespace lt::cuda::sim {
#include "cuda/layers_api.inc"
}  // namespace lt::cuda::sim

#if LT_WITH_CUDA
namespace lt::cuda::native {
#include "cuda/layers_api.inc"
}  // namespace lt::cuda::native
#endif
