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

namespace lt::cuda {

// A cudaStream_t for native launches (nullptr: the default stream); ignored by cuda-sim, whose launches
// run to completion before they return.
using Stream = void*;

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
