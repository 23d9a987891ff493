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
#include <initializer_list>

#include "core/dtype.h"
#include "core/host_device.h"
#include "core/scoped_setting.h"
#include "ops/attention.h"
#include "ops/gated_delta.h"

namespace lt::cuda {

// A cudaStream_t for native launches (nullptr: the default stream); ignored by cuda-sim, whose launches
// run to completion before they return.
using Stream = void*;

// Device scratch rmsnorm_backward needs for rows × C: the f64 partial sums of dweight per fixed row chunk.
size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t C);

// The token chunks of the Qwen3.5 layer ops' parameter gradients: the CPU ops' rules (ops/cpu/short_conv.cpp,
// ops/cpu/delta_gates.cpp: at most 64 chunks), which the kernels must follow to give their bits.
int64_t short_conv_dweight_chunk_tokens(int64_t N);
int64_t delta_gates_param_chunk_tokens(int64_t N);
// Device scratch short_conv_backward needs: f64 partials of dweight per token chunk, [chunks, K, Cc].
size_t short_conv_backward_workspace_bytes(int64_t N, int64_t Cc, int64_t K);
// Device scratch delta_gates_backward needs: f64 partials of dA_log and ddt_bias per token chunk, [chunks, 2, Hv].
size_t delta_gates_backward_workspace_bytes(int64_t N, int64_t Hv);

// Device scratch attention_backward needs: Di = rowsum(dO ∘ O), f32 [B, Hq, T]; on tensor cores
// (attention_on_tensor_cores) the AttentionMmaWorkspace below.
size_t attention_backward_workspace_bytes(AttentionShape s);
// The tensor-core backward's workspace (cuda/kernels/attention_mma.cuh), carved 256-byte aligned in this order:
// Di f32 [B, Hq, T]; dO rounded to bf16 [B, T, Hq, D]; with grouped heads (G = Hq / Hkv > 1) each query head's
// partial dK and dV for `partial_rows` batch rows at a time, f32 [G, partial_rows, T, Hkv, D] each (null for G = 1:
// the kernel writes dk and dv itself). With a null base it only measures (bytes).
struct AttentionMmaWorkspace {
  float* Di = nullptr;
  bf16_t* dout = nullptr;
  float* dk_part = nullptr;
  float* dv_part = nullptr;
  int64_t partial_rows = 0;
  size_t bytes = 0;
  static AttentionMmaWorkspace carve(void* base, AttentionShape s);
};
// The dK/dV partials of every row of a large batch would outweigh the rest of a layer's scratch (2·G·N·Hkv·D·4
// bytes: 4.2 GB at Qwen2.5-7B's shape and 144 × 1024 tokens), so the backward sums them a group of rows at a time:
// as many rows as fit attention_partial_bytes() (at least one). The groups' launches still hold thousands of blocks.
inline constexpr int64_t kAttentionPartialBytes = int64_t(256) << 20;
int64_t attention_partial_rows(AttentionShape s);
// The budget in force: kAttentionPartialBytes, unless an AttentionPartialBudget (a test's, so that a small batch
// takes several groups) holds another for its lifetime. Workspace sizes and launches read the same value.
ScopedSetting<int64_t>& attention_partial_budget();
inline int64_t attention_partial_bytes() { return attention_partial_budget().get(); }
struct AttentionPartialBudget : ScopedSetting<int64_t>::Override {
  explicit AttentionPartialBudget(int64_t bytes) : Override(attention_partial_budget(), bytes) {}
};
// Query rows a warp of the tensor-core forward takes at head dims 64 and 128 (cuda/kernels/attention_mma_tiles.cuh's
// ForwardTiles): 16 (8 warps a block, Q's fragments in registers) or 32 (4 warps, each K and V fragment loaded from
// shared memory serving two m-tiles, Q read from shared memory; where the block's 102 KiB fit). The same bits either
// way. kAttentionForwardWarpRows unless an AttentionForwardWarpRows holds another for its lifetime (the tests compare
// the two; bench_cuda_layer measures both).
inline constexpr int kAttentionForwardWarpRows = 32;
ScopedSetting<int>& attention_forward_warp_rows_setting();
inline int attention_forward_warp_rows() { return attention_forward_warp_rows_setting().get(); }
struct AttentionForwardWarpRows : ScopedSetting<int>::Override {
  explicit AttentionForwardWarpRows(int rows) : Override(attention_forward_warp_rows_setting(), rows) {}
};
// lt::Error naming the op unless the shape is one the attention kernels take (B, T ≥ 0; Hq a multiple of
// Hkv; grid limits), and for an unsupported head dimension (the kernels take 1 to 256).
void check_attention_shape(const char* op, AttentionShape s);
[[noreturn]] void throw_unsupported_head_dim(const char* op, int64_t D);
// lt::Error naming the op unless every tensor is 16-byte aligned, as the tensor-core kernels' 16-byte copies need
// (every device allocation and workspace carve is; a caller's offset view might not be).
void check_attention_alignment(const char* op, std::initializer_list<const void*> tensors);
// The dynamic shared memory an sm_86 / sm_89 block (RTX 30 / 40, A40, L40) may opt into: 99 KiB. The attention
// kernels' blocks fit it, or the launcher picks one that does (cuda/kernels/attention_mma.cuh).
inline constexpr size_t kSm89BlockSharedBytes = 99 * 1024;
// Whether bf16-storage attention at head dim D runs on tensor cores (cuda/kernels/attention_mma.cuh), with its
// bf16 rounding of P, dS and dO; every other case runs on CUDA cores (attention.cuh).
inline bool attention_on_tensor_cores(int64_t D) { return D == 64 || D == 128 || D == 256; }

// The gated delta rule's kernels (cuda/kernels/gated_delta.cuh): threads per block, and one block's slice of
// the workspace in floats — one chunk's quantities (ops/cpu/gated_delta.cpp's Chunk) and the forward's state; the
// backward's temporaries, per-thread partials and the chunk-start states of a row, ⌈T/64⌉ × [dk, dv].
inline constexpr int kGatedDeltaThreads = 128;
LT_HD_INLINE int64_t gated_delta_chunk_floats(int64_t dk, int64_t dv) {
  const int64_t c = kDeltaChunk;
  return c * (5 * dk + 4 * dv + 4) + 5 * c * c;
}
LT_HD_INLINE int64_t gated_delta_forward_block_floats(const DeltaShape& s) {
  return gated_delta_chunk_floats(s.dk, s.dv) + s.dk * s.dv;
}
LT_HD_INLINE int64_t gated_delta_backward_block_floats(const DeltaShape& s) {
  const int64_t c = kDeltaChunk, chunks = (s.T + c - 1) / c;
  return gated_delta_chunk_floats(s.dk, s.dv) + (3 + chunks) * s.dk * s.dv + c * (5 * s.dk + 4 * s.dv + 2) +
         5 * c * c + kGatedDeltaThreads;
}
// Whether the bf16 forward and backward run on tensor cores (cuda/kernels/gated_delta_mma*.cuh): key and value head
// dims multiples of 16 up to 128. Every other case, and every f32 launch, runs gated_delta.cuh's CUDA-core kernels.
inline bool gated_delta_on_tensor_cores(const DeltaShape& s) {
  return s.dk % 16 == 0 && s.dv % 16 == 0 && s.dk <= 128 && s.dv <= 128;
}
// The tensor-core forward's workspace for `rows` batch rows at a time, carved 256-byte aligned in this order, a slot
// per (row, value head) and in it a tile per 64 tokens: W bf16 [rows, Hv, tiles, 64, dk]; U and then V' in its
// place, bf16 [rows, Hv, tiles, 64, dv]; each tile's entering state S₀, bf16 [rows, Hv, tiles, dk, dv]; each tile's
// gates as its first launch made them [rows, Hv, tiles] of kDeltaTileGatesBytes (gated_delta_mma.cuh's
// DeltaTileGates: γ, e^γ, e^{γ_C − γ}, β, documents), which the sequential launches load instead of summing γ a
// tile at a time on their critical path. With a null base it only measures (bytes).
inline constexpr int64_t kDeltaTileGatesBytes = 1296;
struct DeltaMmaWorkspace {
  bf16_t* W = nullptr;
  bf16_t* UV = nullptr;
  bf16_t* states = nullptr;
  unsigned char* gates = nullptr;
  int64_t rows = 0;
  size_t bytes = 0;
  static DeltaMmaWorkspace carve(void* base, const DeltaShape& s, int64_t rows);
};
// The tensor-core backward's workspace (cuda/kernels/gated_delta_mma_backward.cuh) for `rows` batch rows at a time
// (gated_delta_backward_rows), carved 256-byte aligned: the forward's (W, then dW in its place; V'; S₀), then dS₁
// bf16 [rows, Hv, tiles, dk, dv]; Pᵀ dO then dV' f32 [rows, Hv, tiles, 64, dv]; each value head's dq and dk f32
// [rows, Hv, tiles, 64, dk]; dA f32 [rows, Hv, tiles, 64, 64]; dγ f32 [rows, Hv, tiles, 64].
struct DeltaMmaBackwardWorkspace {
  DeltaMmaWorkspace forward;
  bf16_t* dstates = nullptr;
  float* dVp = nullptr;
  float* dq_part = nullptr;
  float* dk_part = nullptr;
  float* dA = nullptr;
  float* dgam = nullptr;
  int64_t rows = 0;
  size_t bytes = 0;
  static DeltaMmaBackwardWorkspace carve(void* base, const DeltaShape& s, int64_t rows);
};
// The tensor-core launches run as many batch rows at a time as their workspace fits in the budget (at least one):
// at Qwen3.6's 48 heads of 128 and 1024 tokens a row takes ~50 MB forward, ~160 MB backward — 3.6 and 11.8 GB for
// the paper's 72 rows at once.
inline constexpr int64_t kDeltaWorkspaceBytes = int64_t(1) << 30;
int64_t gated_delta_forward_rows(const DeltaShape& s);
int64_t gated_delta_backward_rows(const DeltaShape& s);
// The budget in force: kDeltaWorkspaceBytes, unless a DeltaWorkspaceBudget (a test's, so that a small batch takes
// several groups) holds another for its lifetime.
ScopedSetting<int64_t>& gated_delta_workspace_budget();
struct DeltaWorkspaceBudget : ScopedSetting<int64_t>::Override {
  explicit DeltaWorkspaceBudget(int64_t bytes) : Override(gated_delta_workspace_budget(), bytes) {}
};
// Device scratch of the gated delta rule's launches: CUDA cores, a slice per block, B·Hv blocks forward, B·Hk
// backward; on tensor cores the larger of that and DeltaMmaWorkspace (forward) or DeltaMmaBackwardWorkspace
// (backward). At Qwen3.6's sizes, B = 8, T = 1024: forward 162 MiB on CUDA cores, 384 MiB on tensor cores;
// backward 244 MiB on CUDA cores, 937 MiB on tensor cores (6 of the 8 rows at a time).
size_t gated_delta_forward_workspace_bytes(const DeltaShape& s);
size_t gated_delta_backward_workspace_bytes(const DeltaShape& s);
// lt::Error naming the op unless the kernels take the shape (B, T ≥ 0; Hv a multiple of Hk; dims ≥ 1; grid).
void check_gated_delta_shape(const char* op, const DeltaShape& s);

// The MoE permutation (cuda/kernels/moe.cuh) runs as one block of kMoePermuteThreads; its workspace is a count
// per thread and expert (int32).
inline constexpr int kMoePermuteThreads = 256;
inline size_t moe_permute_workspace_bytes(int64_t E) { return size_t(kMoePermuteThreads) * size_t(E) * 4; }

}  // namespace lt::cuda

namespace lt::cuda::sim {
#include "cuda/kernels_api.inc"
}  // namespace lt::cuda::sim

#if LT_WITH_CUDA
namespace lt::cuda::native {
#include "cuda/kernels_api.inc"
}  // namespace lt::cuda::native
#endif
