// model/delta_mixer.h — the token mixer of a Qwen3.5 / Qwen3.6 linear-attention layer (HF Qwen3_5GatedDeltaNet),
// forward and backward, stateless: the part of the layer between its input norm n1 and the residual add.
//
//   qkv_pre = n1 · in_proj_qkvᵀ                      [N, Dc]   Dc = 2·Hk·dk + Hv·dv, laid out [Q | K | V]
//   qkv     = silu(causal depthwise conv(qkv_pre))   [N, Dc]   ops/short_conv.h (kernel K, per document)
//   q̂, k̂    = l2norm(q), l2norm(k) per key head      [N, 2·Hk·dk] (ops/l2norm.h, eps 1e-6)
//   z       = n1 · in_proj_zᵀ                        [N, Hv·dv]
//   β, g    = σ(n1 · in_proj_bᵀ), −e^{A_log}·softplus(n1 · in_proj_aᵀ + dt_bias)   [N, Hv] (ops/delta_gates.h)
//   o       = gated delta rule(q̂ · dk^−½, k̂, v, β, g)  [N, Hv·dv] (ops/gated_delta.h; value head j reads key head
//             j / (Hv / Hk); the state restarts at every document)
//   y       = rmsnorm(o) · norm.weight · silu(z)     [N, Hv·dv] per value head (ops/gated_rmsnorm.h)
//   out     = y · out_projᵀ                          [N, C]
//
// Legend: B rows, T tokens per row, N = B·T, C hidden, Hk / Hv key / value heads, dk / dv their dims, K the conv
// width. Activations f32 (the GEMMs round their operands to bf16 in bf16 mode, ops/linear.h); A_log, dt_bias,
// the conv and norm weights are f32 vectors. At bf16 activation storage (model/block.h) the block passes a
// DeltaMixerStorage: the forward hands it each internal as soon as it is written, and computes on from the value
// the hook leaves there (the activations rounded to bf16, the statistics and gates as they are).
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/config.h"
#include "ops/gated_delta.h"
#include "model/lora.h"
#include "ops/linear.h"

namespace lt {

struct TokenInfo;  // model/block.h

struct DeltaMixerShape {
  int64_t B, T, C, Hk, Hv, dk, dv, K;
  float eps;  // the gated norm's (rms_norm_eps)
  LoraShape lora{};    // the projections' LoRA adapters (model/lora.h)
  int64_t layer = -1;  // the layer's index: keys their dropout
  int64_t N() const { return B * T; }
  int64_t key_dim() const { return Hk * dk; }                  // one of Q, K
  int64_t value_dim() const { return Hv * dv; }                // V, z, o, y
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // Dc
  static DeltaMixerShape make(const ModelConfig& cfg, int64_t B, int64_t T);
};

// HF's l2norm eps for q and k, fixed (not rms_norm_eps).
inline constexpr float kQkNormEps = 1e-6f;

// The delta rule's shape inside the mixer: q̂ and k̂ the two halves of qk_hat's rows [N, 2·Hk·dk], v the last part
// of the conv output's rows [N, Dc]; q scaled by dk^-1/2.
DeltaShape delta_shape(const DeltaMixerShape& s);

// The mixer's weights (a layer slab's "linear_attn.*" entries). Matrices f32 or in the compute dtype.
struct DeltaMixerView {
  WeightRef in_qkv, in_z, in_b, in_a, out;  // [Dc, C], [Hv·dv, C], [Hv, C], [Hv, C], [C, Hv·dv]
  const float* conv;                        // [Dc, K]  (HF conv1d.weight [Dc, 1, K])
  const float* dt_bias;                     // [Hv]
  const float* A_log;                       // [Hv]
  const float* norm;                        // [dv]
  LayerAdapters lora;                       // in_proj_* and out_proj's LoRA adapters (model/lora.h)
};

// Their f32 gradients, accumulated (+=).
struct DeltaMixerGrads {
  float *in_qkv, *in_z, *in_b, *in_a, *out;
  float *conv, *dt_bias, *A_log, *norm;
  LayerAdapterGrads lora;
};

// What the backward reads, in one caller-owned f32 buffer (DeltaMixerActs::floats).
struct DeltaMixerActs {
  float* qkv_pre;  // [N, Dc]          conv input
  float* qkv;      // [N, Dc]          conv output: q, k (before the L2 norm) and v
  float* qk_hat;   // [N, 2·Hk·dk]     q̂ | k̂
  float* q_rnorm;  // [N, Hk]
  float* k_rnorm;  // [N, Hk]
  float* z;        // [N, Hv·dv]
  float* b;        // [N, Hv]
  float* a;        // [N, Hv]
  float* beta;     // [N, Hv]
  float* g;        // [N, Hv]
  float* o;        // [N, Hv·dv]       delta rule output
  float* rstd;     // [N, Hv]          gated norm
  float* y;        // [N, Hv·dv]       out_proj input
  static size_t floats(const DeltaMixerShape& s);
  static DeltaMixerActs bind(float* buffer, const DeltaMixerShape& s);
};

// The forward's hook at each internal the backward reads (bf16 activation storage, model/block.h): `x` is the
// field of `acts` just written; keep() may round it in place and keep a copy. The forward reads the field only
// after keep(), so a recompute through the same hook and a backward that widens the kept copy see its bits.
class DeltaMixerStorage {
 public:
  virtual void keep(float* DeltaMixerActs::*field, float* x) const = 0;

 protected:
  ~DeltaMixerStorage() = default;
};

// The backward's temporaries, one caller-owned f32 buffer.
struct DeltaMixerScratch {
  float* dn;      // [N, C]       the four input projections' input gradients, one at a time
  float* dy;      // [N, Hv·dv]
  float* d_o;     // [N, Hv·dv]
  float* dz;      // [N, Hv·dv]
  float* dqk;     // [N, 2·Hk·dk] dq̂ | dk̂
  float* dqkv;    // [N, Dc]
  float* dpre;    // [N, Dc]
  float* dbeta;   // [N, Hv]
  float* dg;      // [N, Hv]
  float* db;      // [N, Hv]
  float* da;      // [N, Hv]
  static size_t floats(const DeltaMixerShape& s);
  static DeltaMixerScratch bind(float* buffer, const DeltaMixerShape& s);
};

// out[N, C] written from n1[N, C]; fills acts. tok.doc_ids (null: each row one document) marks the documents the
// convolution and the delta rule never cross.
// `storage` (null: none) sees every field of acts as it is produced.
void delta_mixer_forward(float* out, DeltaMixerActs& acts, const float* n1, const DeltaMixerView& w,
                         const TokenInfo& tok, const DeltaMixerShape& s, const DeltaMixerStorage* storage = nullptr);

// dn1[N, C] written from dout[N, C]; parameter gradients accumulated into g.
void delta_mixer_backward(float* dn1, DeltaMixerGrads& g, DeltaMixerScratch& scratch, const float* dout,
                          const float* n1, const DeltaMixerActs& acts, const DeltaMixerView& w, const TokenInfo& tok,
                          const DeltaMixerShape& s);

}  // namespace lt
