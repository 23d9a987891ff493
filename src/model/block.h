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
// f32, and the internals buffer (WorkingCopy) is what the backward reads. bf16: the boundaries x_in / x_out are
// bf16, and so is every activation kept for the backward (n1, q, k, v, q_raw, k_raw, att, x_mid, n2, gate, up,
// h; a Gated DeltaNet layer's qkv_pre, qkv, q̂k̂, z, o, y in place of q .. att) in a separate "stored internals"
// buffer (block_stored_bytes), beside their f32 statistics (rstd, q/k rstd, lse; the mixer's L2 and RMS norm
// statistics and its gates b, a, β, g). The output gate's product is not kept: the backward recomputes it from
// att and q_raw. The block still computes in f32 — in WorkingCopy, now a per-layer working copy — but rounds each
// stored activation to bf16 where it is produced and computes on from the rounded value, so the forward, a
// recompute and the backward (which widens the stored values back) all see the same numbers: the bf16-activation
// model is one function whatever is kept. Activation gradients and parameter gradients stay f32.
//
// Sparse layers (qwen3_moe; model/moe_ffn.h): the MLP is a router and E routed SwiGLU experts. Its gate, up and h
// are the grouped rows of the tokens' k assignments ([rows·k, Ie]: mlp_width() per token in place of I), and it runs
// over route slices of min(kTokenSlice, N) tokens whatever the MLP chunk (mlp_rows()), so its bits do not depend on
// the chunk either.
//
// Bounded layer scratch (BlockShape::mlp_chunk). The MLP runs over token chunks: gate, up and h of a chunk
// ([chunk, I] each, and their gradients in the backward) are all of the MLP a working copy holds, so a layer's
// transient memory is O(chunk · I), not O(N · I); a kept layer's stored internals still hold them for every
// token. A layer whose internals are recomputed recomputes its attention half and n2 before the backward
// (block_recompute_internals) and its MLP chunk by chunk inside it. Chunks are multiples of kTokenSlice, and
// neither the GEMMs' rows (ops/gemm.h) nor the parameter gradients' token slices (ops/linear.h) depend on
// the split: every chunk size gives the same bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"
#include "model/delta_mixer.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/moe_ffn.h"
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
  RopeSpec rope;  // θ, and YaRN's scaling where the config has one
  bool qk_norm;
  DType act = DType::f32;  // activation storage: f32 or bf16 (see above)
  int64_t mlp_chunk = 0;   // tokens per MLP chunk (a multiple of kTokenSlice); 0 or >= N: one chunk
  // Qwen3.5 / Qwen3.6 (model/config.h). The layer's token mixer: full attention, or Gated DeltaNet
  // (model/delta_mixer.h) — a model-wide shape is for full attention; for_layer gives each layer's.
  LayerKind kind = LayerKind::full_attention;
  bool out_gate = false;      // q_proj gives per head [query D | gate D]; the attention output × σ(gate)
  bool zero_centred = false;  // every norm scales by (1 + w), w as stored
  int64_t rotary = 0;         // RoPE on the first `rotary` dims of each head (D: all)
  int64_t Hk = 0, Hv = 0, dk = 0, dv = 0, K = 0;  // Gated DeltaNet sizes (0 without linear-attention layers)
  // Mixture-of-Experts (qwen3_moe): whether this layer's MLP is sparse, and the model's expert sizes.
  bool sparse = false;
  int64_t E = 0, k = 0, Ie = 0;  // experts, experts per token, an expert's intermediate size
  int64_t Is = 0;                // the shared expert's intermediate size (qwen3_5_moe; 0: none)
  bool renorm_topk = false;      // norm_topk_prob
  // GPT-OSS (gpt_oss): the router's top-k of the logits then softmax over k (ops/moe.h's topk_softmax), the experts'
  // clamped SwiGLU (ops/swiglu.h; 0: plain SwiGLU), attention sinks, and the sliding window of sliding_attention
  // layers (`window`: this layer's, set by for_layer; 0: every earlier key).
  bool topk_softmax = false;
  float swiglu_limit = 0;
  bool sinks = false;
  int64_t sliding_window = 0, window = 0;
  // LoRA (model/lora.h, model/finetune.h): the adapters' rank, scale and dropout (rank 0: none), and this layer's
  // index (for_layer; -1 for a model-wide shape), which keys the adapters' dropout masks.
  LoraShape lora;
  int64_t layer = -1;
  int64_t N() const { return B * T; }
  // Tokens of gate / up / h a working copy holds: one chunk; a sparse layer's route slice.
  int64_t mlp_rows() const {
    if (sparse) return std::min(kTokenSlice, N());
    return mlp_chunk > 0 && mlp_chunk < N() ? mlp_chunk : N();
  }
  // Elements of gate / up / h per token: I, or a sparse layer's k grouped rows of Ie and its shared expert's Is.
  int64_t mlp_width() const { return sparse ? k * Ie + Is : I; }
  int64_t QD() const { return Hq * D; }
  int64_t QPD() const { return out_gate ? 2 * QD() : QD(); }  // q_proj's rows: [query | gate] per head
  int64_t KVD() const { return Hkv * D; }
  bool linear() const { return kind == LayerKind::linear_attention; }
  BlockShape for_layer(LayerKind mixer, bool sparse_mlp = false) const {
    BlockShape s = *this;
    s.kind = mixer;
    s.sparse = sparse_mlp;
    s.window = mixer == LayerKind::sliding_attention ? sliding_window : 0;
    return s;
  }
  BlockShape for_layer(const ModelConfig& cfg, int64_t layer_index) const {
    BlockShape s = for_layer(cfg.layer_kind(layer_index), cfg.sparse_layer(layer_index));
    s.layer = layer_index;
    return s;
  }
  DeltaMixerShape mixer() const { return DeltaMixerShape{B, T, C, Hk, Hv, dk, dv, K, eps, lora, layer}; }
  // Where an adapter's dropout mask of this layer comes from (rows from row0: an MLP chunk's first token).
  LoraSite lora_site(const TokenInfo& tok, Adapted a, int64_t row0 = 0) const;
  // Bytes of one layer boundary [N, C] in the storage dtype.
  size_t boundary_bytes() const { return size_t(N() * C) * dtype_size(act); }
  static BlockShape make(const ModelConfig& cfg, int64_t B, int64_t T, DType act = DType::f32,
                         int64_t mlp_chunk = 0);
};

// Per-step token metadata shared by all blocks.
struct TokenInfo {
  const int32_t* pos = nullptr;      // [N] RoPE position of each token
  const int32_t* doc_ids = nullptr;  // [B, T] document of each token when packing; nullptr = plain causal
  // Mixture-of-Experts models: the batch's load-balancing loss (model/moe_ffn.h), or null. block_forward adds each
  // sparse layer's routing to it; block_backward adds its gradient to the router's. Host memory: the CPU block only.
  MoeAuxLoss* moe_aux = nullptr;
  // LoRA dropout (model/lora.h): the batch's key (Batch::dropout_key), mixed with each layer and linear.
  uint64_t dropout_key = 0;
};

// Weights of one block. Matrices in f32 or the compute dtype; vectors always f32; absent biases null. A
// linear-attention layer has `delta` instead of the attention weights (null there).
struct BlockView {
  LayerKind kind = LayerKind::full_attention;
  const float* ln1;                  // [C]
  WeightRef wq, wk, wv, wo;          // [QPD, C], [KVD, C], [KVD, C], [C, QD]
  const float *bq, *bk, *bv, *bo;    // [QPD], [KVD], [KVD], [C]
  const float *q_norm, *k_norm;      // [D] (Qwen3, Qwen3.5)
  const float* sinks;                // [Hq] (GPT-OSS; null elsewhere)
  DeltaMixerView delta;              // Gated DeltaNet's (linear_attn.*)
  const float* ln2;                  // [C]
  WeightRef wgate, wup, wdown;       // [I, C], [I, C], [C, I]
  const float *bgate, *bup, *bdown;  // [I], [I], [C]
  MoeView moe;                       // a sparse layer's router and experts (wgate .. null there)
  LayerAdapters lora;                // LoRA adapters of the linears that have one (model/lora.h)
  int64_t layer = -1;                // the layer's index where the binder knows it (keys LoRA's dropout)
  bool sparse() const { return !moe.experts.empty(); }
  // Binds to a slab laid out by `layout` starting at `base` (the layout's entries say the kind).
  static BlockView bind(const SlabLayout& layout, const void* base);
};

// Parameter gradients of one block, f32, accumulated (+=). Bound to a grad slab (master layout).
struct BlockGrads {
  float* ln1;
  float *wq, *wk, *wv, *wo;
  float *bq, *bk, *bv, *bo;
  float *q_norm, *k_norm;
  float* sinks;
  DeltaMixerGrads delta;
  float* ln2;
  float *wgate, *wup, *wdown;
  float *bgate, *bup, *bdown;
  MoeGrads moe;
  LayerAdapterGrads lora;
  static BlockGrads bind(const SlabLayout& layout, void* base);
};

// The working copy: the activations a block's backward needs ("internals") in f32, bound into one caller-owned
// buffer so the executor can place them in device memory (the step's "working copy" buffer). x_in and x_out (the
// layer boundaries) are not in here. Two layouts: the working copy proper (bind: gate, up, h for one MLP chunk, x32
// at bf16 storage) and the full one (bind_full: every token's — a layer's kept internals at f32 storage, which are
// its working copy kept in place).
struct WorkingCopy {
  float* n1;          // [N, C]    input_layernorm output
  float* rstd1;       // [N]
  float* q;           // [N, QD]   attention input (after q_norm and RoPE)
  float* k;           // [N, KVD]  (after k_norm and RoPE)
  float* v;           // [N, KVD]
  float* q_raw;       // [N, QPD]  q_proj output before q_norm (Qwen3 / Qwen3.5 only, else null; with the gate)
  float* k_raw;       // [N, KVD]  (Qwen3 only)
  float* q_rstd;      // [N, Hq]   (Qwen3 only)
  float* k_rstd;      // [N, Hkv]  (Qwen3 only)
  float* att;         // [N, QD]   attention output
  float* gated;       // [N, QD]   att × σ(gate), o_proj's input (out_gate only; a forward temporary, not stored)
  DeltaMixerActs delta;  // a linear-attention layer's mixer internals (its q .. lse, q_raw .. are null)
  float* lse;         // [B, Hq, T]
  float* x_mid;       // [N, C]    residual after attention
  float* n2;          // [N, C]    post_attention_layernorm output
  float* rstd2;       // [N]
  float* gate;        // [mlp_rows, I]  (one chunk in the working copy, all N rows in the full layout)
  float* up;          // [mlp_rows, I]
  float* h;           // [mlp_rows, I]  silu(gate) * up
  float* x32;         // [N, C]    bf16 storage only: the block input widened to f32, then x_out before rounding
  MoeRouting moe;     // a sparse layer's routing of one slice (gate / up / h are then [mlp_rows·k, Ie])
  int64_t mlp_rows;   // tokens gate / up / h hold
  static size_t floats(const BlockShape& s);
  static WorkingCopy bind(float* buffer, const BlockShape& s);
  static size_t full_floats(const BlockShape& s);
  static WorkingCopy bind_full(float* buffer, const BlockShape& s);
};

// Temporaries of the backward pass, bound into one caller-owned f32 buffer.
struct BlockScratch {
  float *dn, *dtmp;          // [N, C]
  float *dh, *dgate, *dup;   // [mlp_rows, I]: one MLP chunk
  float* dx_mid;             // [N, C]
  float *datt, *dq, *dk, *dv, *dq_raw, *dk_raw;  // [N, QD], [N, QD], [N, KVD] x2, [N, QPD], [N, KVD]
  float* qtmp;               // [N, QD] out_gate only: the gated output, d att, the query before q_norm
  DeltaMixerScratch delta;   // a linear-attention layer's (the attention fields above are null there)
  MoeScratch moe;            // a sparse layer's (dh, dgate, dup are null there)
  static size_t floats(const BlockShape& s);
  static BlockScratch bind(float* buffer, const BlockShape& s);
};

// What a kept layer holds (bytes): at f32 storage the full WorkingCopy layout (WorkingCopy::bind_full), at bf16
// the stored internals — the bf16 activations and their f32 statistics for every token.
size_t block_stored_bytes(const BlockShape& s);
// The part of them a layer that does not keep its internals writes (bf16 storage): everything before the MLP's
// gate / up / h (they lead the layout's tail), which its forward and its backward run chunk by chunk in scratch —
// the CUDA block's "recompute internals" buffer. At f32 storage, block_stored_bytes.
size_t block_recompute_stored_bytes(const BlockShape& s);

// Byte offsets of each stored internal in the buffer block_stored_bytes sizes (bf16 storage), for code other
// than block_forward that writes or reads them (the CUDA block, cuda/layers/block.inl); -1 for the fields a
// shape has not (q_raw .. k_rstd without qk_norm; the attention's in a Gated DeltaNet layer, the mixer's in an
// attention layer). Activations bf16, statistics and gates f32.
struct StoredOffsets {
  int64_t n1 = -1, rstd1 = -1, q = -1, k = -1, v = -1, q_raw = -1, k_raw = -1, q_rstd = -1, k_rstd = -1, att = -1,
          lse = -1, x_mid = -1, n2 = -1, rstd2 = -1, gate = -1, up = -1, h = -1;
  // Gated DeltaNet (model/delta_mixer.h's DeltaMixerActs): bf16 qkv_pre, qkv, qk_hat, z, o, y; f32 the rest.
  int64_t qkv_pre = -1, qkv = -1, qk_hat = -1, q_rnorm = -1, k_rnorm = -1, z = -1, b = -1, a = -1, beta = -1,
          g = -1, o = -1, rstd_o = -1, y = -1;
};
StoredOffsets block_stored_offsets(const BlockShape& s);

// Where the backward finds the forward's internals.
enum class Saved : uint8_t {
  in_working_copy,  // the working copy holds them all, gate / up / h for every token (bind_full, or a working copy of one chunk)
  stored,     // in `stored`, the forward's bf16 stored internals: widened into the working copy (the MLP's by chunk)
  recompute,  // the working copy holds the attention half and n2 (block_recompute_internals); the MLP's are recomputed
};

// One layer's internals as the block reads and writes them, from the kept buffer (block_stored_bytes, or null
// when the plan recomputes them) and the f32 working copy (WorkingCopy::floats): at f32 storage a kept layer
// computes in place in its kept buffer (bind_full); at bf16 it computes in the working copy and stores into the
// kept buffer; a recomputed layer has only the working copy. Pass working and stored to block_forward, and working,
// saved and stored to the backward.
struct LayerInternals {
  WorkingCopy working;
  void* stored;  // the bf16 stored internals, or null
  Saved saved;
};
LayerInternals bind_internals(void* kept, float* work, const BlockShape& s);

// x_out[N, C] from x_in[N, C] (both in s.act); fills the working copy. At bf16 storage, `stored` (block_stored_bytes, or
// null when the internals are not kept) receives the bf16 internals; at f32 it must be null (a kept layer's
// working copy is then bound with bind_full).
void block_forward(void* x_out, WorkingCopy& working, const void* x_in, const BlockView& w, const TokenInfo& tok,
                   const BlockShape& s, void* stored = nullptr);

// A layer's token mixer core replaced, for generation's one-token steps against a cache (model/generate.cpp): the
// full-attention core over this step's rows of q, k, v ([N, Hq, D], [N, Hkv, D] each, after norms and RoPE) into
// att [N, Hq, D] — the layer's sliding window (s.window) and sinks (w.sinks) included: GPT-OSS's are the override's
// to apply — or a linear-attention layer's whole mixer, out [N, C] from n1 [N, C] (Gated DeltaNet). Everything else
// of the layer is block_forward's own composition.
struct MixerOverride {
  std::function<void(float* att, const float* q, const float* k, const float* v)> attention;
  std::function<void(float* out, const float* n1)> linear;
};
// block_forward at f32 storage with the token mixer's core from `mixer` (working.lse is not written by it).
void block_forward_with(float* x_out, WorkingCopy& working, const float* x_in, const BlockView& w, const TokenInfo& tok,
                        const BlockShape& s, const MixerOverride& mixer);

// The internals of a layer that did not keep them, for its backward with Saved::recompute: the attention half
// and n2 exactly as block_forward computes them, nothing of the MLP (its backward recomputes that per chunk).
void block_recompute_internals(WorkingCopy& working, const void* x_in, const BlockView& w, const TokenInfo& tok,
                               const BlockShape& s);

// dx_in[N, C] written from dx_out[N, C] (f32 activation gradients); parameter gradients accumulated into g.
// x_in must be the block's input; the forward's internals are found as `saved` says.
void block_backward(float* dx_in, BlockGrads& g, BlockScratch& scratch, const float* dx_out, const void* x_in,
                    const WorkingCopy& working, const BlockView& w, const TokenInfo& tok, const BlockShape& s,
                    Saved saved = Saved::in_working_copy, const void* stored = nullptr);

// block_backward in its two halves, the same operations in the same order: the MLP half completes the
// gradients of post_attention_layernorm and the MLP (the tail of the layer slab, kMlpGradsFirst onwards) and
// leaves dx_mid in the scratch; the attention half does the rest. The executor downloads the MLP gradients
// while the attention half runs.
inline constexpr const char* kMlpGradsFirst = "post_attention_layernorm.weight";
// The MLP half finds the internals as `saved` says; the attention half widens a bf16 x_in into working.x32.
void block_backward_mlp(BlockGrads& g, BlockScratch& scratch, const float* dx_out, const WorkingCopy& working,
                        const BlockView& w, const TokenInfo& tok, const BlockShape& s,
                        Saved saved = Saved::in_working_copy, const void* stored = nullptr);
void block_backward_attention(float* dx_in, BlockGrads& g, BlockScratch& scratch, const void* x_in,
                              const WorkingCopy& working, const BlockView& w, const TokenInfo& tok, const BlockShape& s);

}  // namespace lt
