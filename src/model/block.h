// model/block.h — one decoder block (Qwen2 / Qwen3 / Llama), forward and backward, stateless.
//
// The block reads its weights through a BlockView whose pointers come from a slab (host memory) or a
// device buffer laid out by model/layout.h — binding a layer is pointer arithmetic, never a copy.
//
//   x_mid = x + o_proj(attention(rope(norm_qk(q_proj(n1))), rope(norm_qk(k_proj(n1))), v_proj(n1))),
//           n1 = rmsnorm(x, input_layernorm)
//   x_out = x_mid + down_proj(silu(gate_proj(n2)) * up_proj(n2)),  n2 = rmsnorm(x_mid, post_attention_layernorm)
//
// Legend: B batch, T tokens per row, N = B*T, C hidden, Hq/Hkv heads, D head dim, QD = Hq*D,
// KVD = Hkv*D, I intermediate.
//
// Activation storage (BlockShape::act, docs/activations.md). f32: the layer boundaries and the internals are
// f32, and the internals buffer (BlockActs) is what the backward reads. bf16: the boundaries x_in / x_out are
// bf16, and so is every activation kept for the backward (n1, q, k, v, q_raw, k_raw, att, x_mid, n2, gate, up,
// h) in a separate "stored internals" buffer (block_stored_bytes), beside their f32 statistics (rstd, q/k rstd,
// lse). The block still computes in f32 — in BlockActs, now a per-layer working copy — but rounds each stored
// activation to bf16 where it is produced and computes on from the rounded value, so the forward, a recompute
// and the backward (which widens the stored values back) all see the same numbers: the bf16-activation model
// is one function whatever is kept. Activation gradients and parameter gradients stay f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/layout.h"
#include "ops/linear.h"

namespace lt {

// How a step computes: GEMM operands (ComputeType) and activation storage (f32 or bf16).
struct Precision {
  ComputeType compute = ComputeType::f32;
  DType activations = DType::f32;
  Precision() = default;
  Precision(ComputeType c, DType a = DType::f32) : compute(c), activations(a) {}  // NOLINT: from ComputeType
};

// The activation storage a setting names: "f32", "bf16", or "auto" (bf16 when the GEMMs run bf16, else f32).
// `what` names the setting in the error for anything else.
DType activation_storage(const std::string& name, ComputeType compute, const std::string& what);

struct BlockShape {
  int64_t B, T, C, Hq, Hkv, D, I;
  float eps;
  double rope_theta;
  bool qk_norm;
  DType act = DType::f32;  // activation storage: f32 or bf16 (see above)
  int64_t N() const { return B * T; }
  int64_t QD() const { return Hq * D; }
  int64_t KVD() const { return Hkv * D; }
  // Bytes of one layer boundary [N, C] in the storage dtype.
  size_t boundary_bytes() const { return size_t(N() * C) * dtype_size(act); }
  static BlockShape make(const ModelConfig& cfg, int64_t B, int64_t T, DType act = DType::f32);
};

// Per-step token metadata shared by all blocks.
struct TokenInfo {
  const int32_t* pos = nullptr;      // [N] RoPE position of each token
  const int32_t* doc_ids = nullptr;  // [B, T] document of each token when packing; nullptr = plain causal
};

// Weights of one block. Matrices in f32 or the compute dtype; vectors always f32; absent biases null.
struct BlockView {
  const float* ln1;                  // [C]
  WeightRef wq, wk, wv, wo;          // [QD, C], [KVD, C], [KVD, C], [C, QD]
  const float *bq, *bk, *bv, *bo;    // [QD], [KVD], [KVD], [C]
  const float *q_norm, *k_norm;      // [D] (Qwen3)
  const float* ln2;                  // [C]
  WeightRef wgate, wup, wdown;       // [I, C], [I, C], [C, I]
  const float *bgate, *bup, *bdown;  // [I], [I], [C]
  // Binds to a slab laid out by `layout` starting at `base`.
  static BlockView bind(const SlabLayout& layout, const void* base);
};

// Parameter gradients of one block, f32, accumulated (+=). Bound to a grad slab (master layout).
struct BlockGrads {
  float* ln1;
  float *wq, *wk, *wv, *wo;
  float *bq, *bk, *bv, *bo;
  float *q_norm, *k_norm;
  float* ln2;
  float *wgate, *wup, *wdown;
  float *bgate, *bup, *bdown;
  static BlockGrads bind(const SlabLayout& layout, void* base);
};

// Activations a block's backward needs ("internals"), bound into one caller-owned f32 buffer so the
// executor can place them in device memory. x_in and x_out (the layer boundaries) are not in here.
struct BlockActs {
  float* n1;          // [N, C]    input_layernorm output
  float* rstd1;       // [N]
  float* q;           // [N, QD]   attention input (after q_norm and RoPE)
  float* k;           // [N, KVD]  (after k_norm and RoPE)
  float* v;           // [N, KVD]
  float* q_raw;       // [N, QD]   q_proj output before q_norm (Qwen3 only, else null)
  float* k_raw;       // [N, KVD]  (Qwen3 only)
  float* q_rstd;      // [N, Hq]   (Qwen3 only)
  float* k_rstd;      // [N, Hkv]  (Qwen3 only)
  float* att;         // [N, QD]   attention output
  float* lse;         // [B, Hq, T]
  float* x_mid;       // [N, C]    residual after attention
  float* n2;          // [N, C]    post_attention_layernorm output
  float* rstd2;       // [N]
  float* gate;        // [N, I]
  float* up;          // [N, I]
  float* h;           // [N, I]    silu(gate) * up
  float* x32;         // [N, C]    bf16 storage only: the block input widened to f32, then x_out before rounding
  static size_t floats(const BlockShape& s);
  static BlockActs bind(float* buffer, const BlockShape& s);
};

// Temporaries of the backward pass, bound into one caller-owned f32 buffer.
struct BlockScratch {
  float *dn, *dtmp;          // [N, C]
  float *dh, *dgate, *dup;   // [N, I]
  float* dx_mid;             // [N, C]
  float *datt, *dq, *dk, *dv, *dq_raw, *dk_raw;  // [N, QD], [N, QD], [N, KVD] x2, [N, QD], [N, KVD]
  static size_t floats(const BlockShape& s);
  static BlockScratch bind(float* buffer, const BlockShape& s);
};

// The stored internals of one layer at bf16 storage (block_stored_bytes): what a kept layer holds. At f32
// storage the internals are BlockActs itself and this is BlockActs::floats(s) * 4.
size_t block_stored_bytes(const BlockShape& s);

// x_out[N, C] from x_in[N, C] (both in s.act); fills acts. At bf16 storage, `stored` (block_stored_bytes, or
// null when the internals are not kept) receives the bf16 internals; at f32 it must be null.
void block_forward(void* x_out, BlockActs& acts, const void* x_in, const BlockView& w, const TokenInfo& tok,
                   const BlockShape& s, void* stored = nullptr);

// dx_in[N, C] written from dx_out[N, C] (f32 activation gradients); parameter gradients accumulated into g.
// x_in must be the block's input and acts its forward's activations — at bf16 storage either as the forward
// left them (stored == null) or widened here from `stored`, the forward's stored internals.
void block_backward(float* dx_in, BlockGrads& g, BlockScratch& scratch, const float* dx_out, const void* x_in,
                    const BlockActs& acts, const BlockView& w, const TokenInfo& tok, const BlockShape& s,
                    const void* stored = nullptr);

// block_backward in its two halves, the same operations in the same order: the MLP half completes the
// gradients of post_attention_layernorm and the MLP (the tail of the layer slab, kMlpGradsFirst onwards) and
// leaves dx_mid in the scratch; the attention half does the rest. The executor downloads the MLP gradients
// while the attention half runs.
inline constexpr const char* kMlpGradsFirst = "post_attention_layernorm.weight";
// The MLP half widens `stored` into acts (when given); the attention half widens a bf16 x_in into acts.x32.
void block_backward_mlp(BlockGrads& g, BlockScratch& scratch, const float* dx_out, const BlockActs& acts,
                        const BlockView& w, const BlockShape& s, const void* stored = nullptr);
void block_backward_attention(float* dx_in, BlockGrads& g, BlockScratch& scratch, const void* x_in,
                              const BlockActs& acts, const BlockView& w, const TokenInfo& tok, const BlockShape& s);

}  // namespace lt
