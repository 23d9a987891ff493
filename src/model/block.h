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
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/config.h"
#include "model/layout.h"
#include "ops/linear.h"

namespace lt {

struct BlockShape {
  int64_t B, T, C, Hq, Hkv, D, I;
  float eps;
  double rope_theta;
  bool qk_norm;
  int64_t N() const { return B * T; }
  int64_t QD() const { return Hq * D; }
  int64_t KVD() const { return Hkv * D; }
  static BlockShape make(const ModelConfig& cfg, int64_t B, int64_t T);
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

// x_out[N, C] from x_in[N, C]; fills acts.
void block_forward(float* x_out, BlockActs& acts, const float* x_in, const BlockView& w, const TokenInfo& tok,
                   const BlockShape& s);

// dx_in[N, C] written from dx_out[N, C]; parameter gradients accumulated into g.
// x_in must be the block's input and acts its forward's activations.
void block_backward(float* dx_in, BlockGrads& g, BlockScratch& scratch, const float* dx_out, const float* x_in,
                    const BlockActs& acts, const BlockView& w, const TokenInfo& tok, const BlockShape& s);

// block_backward in its two halves, the same operations in the same order: the MLP half completes the
// gradients of post_attention_layernorm and the MLP (the tail of the layer slab, kMlpGradsFirst onwards) and
// leaves dx_mid in the scratch; the attention half does the rest. The executor downloads the MLP gradients
// while the attention half runs.
inline constexpr const char* kMlpGradsFirst = "post_attention_layernorm.weight";
void block_backward_mlp(BlockGrads& g, BlockScratch& scratch, const float* dx_out, const BlockActs& acts,
                        const BlockView& w, const BlockShape& s);
void block_backward_attention(float* dx_in, BlockGrads& g, BlockScratch& scratch, const float* x_in,
                              const BlockActs& acts, const BlockView& w, const TokenInfo& tok, const BlockShape& s);

}  // namespace lt
