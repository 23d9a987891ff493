// cuda/layers/block.inl — the decoder block (model/block.h) as a sequence of launches on the GPU kernels and
// cuBLASLt calls: host code compiled into both namespaces, like the head (cuda/layers/head.inl). Activations stored in bf16 (the
// GPU's storage, docs/activations.md) into the layer's stored-internals buffer in model/block.h's layout
// (block_stored_offsets), so a kept layer holds exactly what the CPU block keeps and the backward reads it
// from there; the backward's gradients are f32.
//
// The CPU block's rounding points are kept: every stored activation is rounded to bf16 where it is produced
// and the next op computes on the rounded value. A kernel with bf16 output computes in f32 and rounds once
// on store, so most steps are one launch; where the CPU block applies two ops in f32 before rounding (RoPE
// after the projection or the q/k norm, the residual adds) the CUDA block runs them in f32 scratch and rounds
// once after. GEMMs read bf16 operands (activation gradients are rounded first, as the CPU linear does) or
// f32 ones in f32 mode, and write f32. Results agree with the CPU block to f32 rounding of the GEMMs' and
// attention's sums, plus a rounding that may fall the other way near a bf16 boundary; with the kernels'
// determinism, the same inputs give the same bits on every run.
//
// A layer that does not keep its internals recomputes the attention half and n2 into a stored buffer
// (block_recompute_internals) and its MLP chunk by chunk inside the backward (Saved::recompute), as the CPU
// block does; the backward then gives the kept layer's bits.
//
// Qwen3.5 / Qwen3.6 layers (BlockShape::for_layer): a Gated DeltaNet layer runs its mixer (mixer_forward /
// mixer_backward: model/delta_mixer.cpp's op sequence on the kernels of cuda/kernels/linear_attention.cuh and
// gated_delta.cuh) where an attention layer runs attention; gated attention takes q_proj's [query | gate] rows,
// gathers the queries, and multiplies the attention output by σ(gate) before o_proj (that product is not stored:
// the backward recomputes it, as the CPU block does); zero-centred norms scale by 1 + w, made on the device into
// the scratch; RoPE rotates the first `rotary` dims (the step's table is built for them). The delta rule sums in
// another order than the CPU op's GEMMs, so those layers agree with the CPU block to f32 rounding.
//
// The MLP runs over token chunks of BlockShape::mlp_rows() (multiples of kTokenSlice), as the CPU block's, so
// its scratch is O(chunk·I), not O(N·I), and every chunk size gives the same bits (the GEMMs' rows do not
// depend on the call's M, and the weight gradients' token slices are the same). The executor's working set
// counts this scratch ("block scratch", cuda_block_scratch_bytes) when the step runs the CUDA block.
#pragma once

#include <algorithm>

#include "cuda/layers.h"
#include "cuda/layers/head.inl"
#include "cuda/layers/linear.inl"
#include "cuda/layers/moe.inl"
#include "cuda/scratch.h"
#include "model/block.h"

namespace lt::cuda::LT_KERNELS_NS {

namespace detail {

// The block's scratch for one layer shape (a kind's: BlockShape::for_layer). Common: the f32 working buffers p
// ([N, W], W the widest projection output the layer has, and at least one MLP chunk) and p2 ([N, W2], the widest
// GEMM input or mixer output), the MLP chunk's gradients, dn, dtmp, dx_mid, the bf16 GEMM operand, a recomputed
// chunk's internals and the norms' workspace; an attention layer adds its gradients (gated attention a bf16
// [N, QD]); a Gated DeltaNet layer its mixer's gradients and the workspaces of the conv, the gates and the delta
// rule. Buffers whose lives do not overlap are shared (gated attention's gated output lives in dq; the mixer's
// dy in p2, its dpre in p) so the largest layer's scratch stays within what the planner can fit. A sparse layer
// carves no dense MLP chunk (I = 0 there) but its route slice's (MoeScratchCuda, cuda/layers/moe.inl).
struct BlockScratchCuda {
  float *x32, *p, *p2, *pm;                   // [N, C], [max(N·W, R·I)], [N, W], [R, I]
  float *dh, *dgate, *dup;                    // [R, I]: one MLP chunk (R = mlp_rows)
  float *dn, *dtmp, *dx_mid;                  // [N, C]
  float* onew;                                // [2C + 2D]: 1 + w of ln1, ln2, q_norm, k_norm (zero-centred norms)
  float *datt, *dq, *dq_raw, *dk, *dv, *dk_raw;  // [N, QD], [N, QD], [N, QPD], [N, KVD] x3 (attention)
  float* gated;                               // att × σ(gate) (gated attention), in dq: [N, QD]
  float* dsinks;                              // [Hq] the sinks' gradient (GPT-OSS)
  bf16_t *operand, *qb;                       // [max(N·W, R·I)]: dY rounded for the GEMMs; [N, QD] (gated)
  float *m_dy, *m_do, *m_dz, *m_dqk, *m_dqkv, *m_dpre;  // [N, VD] x3 (dy in p2), [N, 2·KD], [N, Dc] x2 (dpre in p)
  float *m_db, *m_da, *m_dbeta, *m_dg;        // [N, Hv] x4
  bf16_t *gate_c, *up_c, *h_c;                // [R, I]: a recomputed layer's MLP internals, one chunk
  void *norm_ws, *attn_ws, *conv_ws, *gates_ws, *delta_ws;
  MoeScratchCuda moe;                         // a sparse layer's
  LoraScratchCuda lora;                       // the adapters' (cuda/layers/lora.inl; none without LoRA)
  size_t bytes;
  static BlockScratchCuda carve(void* base, const BlockShape& s) {
    const int64_t N = s.N(), C = s.C, QD = s.QD(), KVD = s.KVD(), I = s.sparse ? 0 : s.I, R = s.mlp_rows();
    const DeltaMixerShape m = s.mixer();
    const int64_t W = s.linear() ? std::max({C, m.conv_dim(), m.value_dim()}) : std::max({C, s.QPD(), KVD});
    const int64_t W2 = s.linear() ? std::max(C, m.value_dim()) : std::max({C, QD, KVD});
    const int64_t wide = std::max(N * W, R * I);
    ScratchCarver c(base);
    BlockScratchCuda b{};
    b.x32 = c.take<float>(N * C), b.p = c.take<float>(wide), b.p2 = c.take<float>(N * W2);
    b.pm = c.take<float>(R * I);
    b.dh = c.take<float>(R * I), b.dgate = c.take<float>(R * I), b.dup = c.take<float>(R * I);
    b.dn = c.take<float>(N * C), b.dtmp = c.take<float>(N * C), b.dx_mid = c.take<float>(N * C);
    b.onew = c.take<float>(s.zero_centred ? 2 * C + 2 * s.D : 0);
    b.operand = c.take<bf16_t>(wide);
    b.gate_c = c.take<bf16_t>(R * I), b.up_c = c.take<bf16_t>(R * I), b.h_c = c.take<bf16_t>(R * I);
    size_t norm_ws = rmsnorm_backward_workspace_bytes(N, C);
    if (s.linear()) {
      const int64_t Dc = m.conv_dim(), KD = m.key_dim(), VD = m.value_dim(), Hv = m.Hv;
      b.m_dy = b.p2, b.m_dpre = b.p;
      b.m_do = c.take<float>(N * VD), b.m_dz = c.take<float>(N * VD);
      b.m_dqk = c.take<float>(N * 2 * KD), b.m_dqkv = c.take<float>(N * Dc);
      b.m_db = c.take<float>(N * Hv), b.m_da = c.take<float>(N * Hv);
      b.m_dbeta = c.take<float>(N * Hv), b.m_dg = c.take<float>(N * Hv);
      norm_ws = std::max(norm_ws, rmsnorm_backward_workspace_bytes(N * Hv, m.dv));
      b.conv_ws = c.take_bytes(short_conv_backward_workspace_bytes(N, Dc, m.K));
      b.gates_ws = c.take_bytes(delta_gates_backward_workspace_bytes(N, Hv));
      const DeltaShape d = delta_shape(m);
      b.delta_ws = c.take_bytes(std::max(gated_delta_forward_workspace_bytes(d), gated_delta_backward_workspace_bytes(d)));
    } else {
      b.datt = c.take<float>(N * QD), b.dq = c.take<float>(N * QD), b.dq_raw = c.take<float>(N * s.QPD());
      b.dk = c.take<float>(N * KVD), b.dv = c.take<float>(N * KVD), b.dk_raw = c.take<float>(N * KVD);
      b.dsinks = c.take<float>(s.sinks ? s.Hq : 0);
      if (s.out_gate) {
        b.gated = b.dq;
        b.qb = c.take<bf16_t>(N * QD);
      }
      norm_ws = std::max({norm_ws, rmsnorm_backward_workspace_bytes(N * s.Hq, s.D),
                          rmsnorm_backward_workspace_bytes(N * s.Hkv, s.D)});
      b.attn_ws = c.take_bytes(attention_backward_workspace_bytes(AttentionShape{s.B, s.T, s.Hq, s.Hkv, s.D}));
    }
    b.norm_ws = c.take_bytes(norm_ws);
    if (s.sparse) b.moe = MoeScratchCuda::carve(c, s);
    // An adapter's input is n1 or n2 [N, C], att [N, QD], y [N, VD], one chunk's h [R, I] (all within `wide`), or a
    // route slice's expert rows ([R, C] within it; [R, Ie] of h) or shared expert's h [R, Is].
    const int64_t expert_in = s.sparse ? R * std::max(s.Ie, s.Is) : 0;
    b.lora = LoraScratchCuda::carve(c, s.lora, std::max(N, R), std::max(wide, expert_in));
    b.bytes = c.bytes();
    return b;
  }
};

// The stored internals of a layer, bound from model/block.h's offsets (null for the fields its kind has not).
struct StoredView {
  bf16_t *n1, *q, *k, *v, *q_raw, *k_raw, *att, *x_mid, *n2, *gate, *up, *h;
  float *rstd1, *q_rstd, *k_rstd, *lse, *rstd2;
  bf16_t *qkv_pre, *qkv, *qk_hat, *z, *o, *y;   // Gated DeltaNet
  float *q_rnorm, *k_rnorm, *b, *a, *beta, *g, *rstd_o;
  static StoredView bind(void* base, const BlockShape& s) {
    const StoredOffsets o = block_stored_offsets(s);
    char* p = static_cast<char*>(base);
    auto b16 = [&](int64_t off) { return off < 0 ? nullptr : reinterpret_cast<bf16_t*>(p + off); };
    auto f32 = [&](int64_t off) { return off < 0 ? nullptr : reinterpret_cast<float*>(p + off); };
    return {b16(o.n1),      b16(o.q),       b16(o.k),      b16(o.v),       b16(o.q_raw),  b16(o.k_raw),
            b16(o.att),     b16(o.x_mid),   b16(o.n2),     b16(o.gate),    b16(o.up),     b16(o.h),
            f32(o.rstd1),   f32(o.q_rstd),  f32(o.k_rstd), f32(o.lse),     f32(o.rstd2),  b16(o.qkv_pre),
            b16(o.qkv),     b16(o.qk_hat),  b16(o.z),      b16(o.o),       b16(o.y),      f32(o.q_rnorm),
            f32(o.k_rnorm), f32(o.b),       f32(o.a),      f32(o.beta),    f32(o.g),      f32(o.rstd_o)};
  }
};

// The norms' weights as the block applies them: w, or 1 + w made on the device (zero-centred norms).
struct NormWeightsGpu {
  const float *ln1, *ln2, *q_norm, *k_norm;
  static NormWeightsGpu make(Stream s, const BlockShape& sh, const BlockView& w, const BlockScratchCuda& b) {
    if (!sh.zero_centred) return {w.ln1, w.ln2, w.q_norm, w.k_norm};
    float* p = b.onew;  // [ln1 C | ln2 C | q_norm D | k_norm D]
    norm_weight_one_plus(s, p, w.ln1, sh.C);
    norm_weight_one_plus(s, p + sh.C, w.ln2, sh.C);
    if (w.q_norm) norm_weight_one_plus(s, p + 2 * sh.C, w.q_norm, sh.D);
    if (w.k_norm) norm_weight_one_plus(s, p + 2 * sh.C + sh.D, w.k_norm, sh.D);
    return {p, p + sh.C, w.q_norm ? p + 2 * sh.C : nullptr, w.k_norm ? p + 2 * sh.C + sh.D : nullptr};
  }
};

// The layer's adapter on linear `which` (model/lora.h; none: an AdapterCall that adds nothing), its mask rows from
// row0 (an MLP chunk's first token), with its gradients when `gr` is given (the backward).
inline AdapterCall adapter(const CudaBlock& blk, const BlockScratchCuda& b, Adapted which, int64_t row0 = 0,
                           const BlockGrads* gr = nullptr) {
  AdapterCall a;
  a.view = blk.weights.lora[which];
  if (!a.present()) return a;
  if (gr) a.grads = gr->lora[which];
  a.shape = blk.shape.lora;
  a.site = blk.shape.lora_site(blk.tok, which, row0);
  a.scratch = b.lora;
  return a;
}

// A sparse layer's adapters at the route slice from token t0 (cuda/layers/moe.inl).
inline MoeAdapters moe_adapters(const CudaBlock& blk, const BlockScratchCuda& b, int64_t t0) {
  MoeAdapters ad;
  ad.shape = &blk.shape;
  ad.routing.order = b.moe.order;
  ad.routing.t0 = t0;
  ad.routing.dropout_key = blk.tok.dropout_key;
  ad.scratch = b.lora;
  return ad;
}

}  // namespace detail

namespace detail {

// Gated DeltaNet's mixer forward (model/delta_mixer.cpp's order, bf16 storage): its output [N, C] (f32) into
// `out`, its internals into the store.
inline void mixer_forward(const GemmContext& g, Stream s, const CudaBlock& blk, const BlockScratchCuda& b,
                          const StoredView& st, float* out) {
  const DeltaMixerShape m = blk.shape.mixer();
  const DeltaMixerView& w = blk.weights.delta;
  const int64_t N = m.N(), C = m.C, Dc = m.conv_dim(), KD = m.key_dim(), VD = m.value_dim(), Hv = m.Hv;
  const int32_t* doc = blk.tok.doc_ids;
  gpu_linear(g, s, b.p, st.n1, w.in_qkv, nullptr, N, C, Dc, b.x32, adapter(blk, b, Adapted::in_proj_qkv));
  // qkv_pre = bf16(p), qkv = conv + SiLU, qk_hat and the rnorms: one pass (convert, conv, the q and k norms' bits).
  conv_l2norm_forward(s, st.qkv_pre, st.qkv, st.qk_hat, st.q_rnorm, st.k_rnorm, b.p, w.conv, doc, N, m.T, Dc, m.K,
                      m.Hk, m.dk, kQkNormEps);
  gpu_linear(g, s, b.p, st.n1, w.in_z, nullptr, N, C, VD, b.x32, adapter(blk, b, Adapted::in_proj_z));
  convert(s, st.z, b.p, N * VD);
  gpu_linear(g, s, st.b, st.n1, w.in_b, nullptr, N, C, Hv, b.x32, adapter(blk, b, Adapted::in_proj_b));  // b, a: f32
  gpu_linear(g, s, st.a, st.n1, w.in_a, nullptr, N, C, Hv, b.x32, adapter(blk, b, Adapted::in_proj_a));
  delta_gates_forward(s, st.beta, st.g, st.b, st.a, w.A_log, w.dt_bias, N, Hv);
  gated_delta_forward(s, st.o, st.qk_hat, st.qk_hat + KD, st.qkv + 2 * KD, st.beta, st.g, doc, delta_shape(m),
                      b.delta_ws);
  gated_rmsnorm_forward(s, st.y, st.rstd_o, st.o, st.z, w.norm, N * Hv, m.dv, m.eps);
  gpu_linear(g, s, out, st.y, w.out, nullptr, N, VD, C, b.p2, adapter(blk, b, Adapted::out_proj));
}

// Gated DeltaNet's mixer backward: dn1 [N, C] written from dout [N, C] (the mixer output's gradient), the
// mixer's parameter gradients accumulated; n1's four projections' input gradients summed in the CPU's order.
inline void mixer_backward(const GemmContext& g, Stream s, const CudaBlock& blk, const BlockScratchCuda& b,
                           const StoredView& st, BlockGrads& gr, float* dn1, const float* dout) {
  const DeltaMixerShape m = blk.shape.mixer();
  const DeltaMixerView& w = blk.weights.delta;
  DeltaMixerGrads& gd = gr.delta;
  const int64_t N = m.N(), C = m.C, Dc = m.conv_dim(), KD = m.key_dim(), VD = m.value_dim(), Hv = m.Hv;
  const int32_t* doc = blk.tok.doc_ids;
  // Widening buffers (f32 GEMM mode): y into p before dpre (which lives there) is written; n1 into x32.
  gpu_linear_backward(g, s, b.m_dy, gd.out, nullptr, dout, st.y, w.out, N, VD, C, b.operand, b.p,
                      adapter(blk, b, Adapted::out_proj, 0, &gr));
  gated_rmsnorm_backward(s, b.m_do, b.m_dz, gd.norm, b.m_dy, st.o, st.z, w.norm, st.rstd_o, N * Hv, m.dv, b.norm_ws);
  // dq̂ | dk̂ into m_dqk; dv straight into its place in the conv output's gradient.
  gated_delta_backward(s, b.m_dqk, b.m_dqk + KD, b.m_dqkv + 2 * KD, b.m_dbeta, b.m_dg, b.m_do, st.qk_hat,
                       st.qk_hat + KD, st.qkv + 2 * KD, st.beta, st.g, doc, delta_shape(m), b.delta_ws);
  // The q and k norms' backward and the conv's (the l2norm_backward and short_conv_backward bits; m_dqkv's q and
  // k channels are its scratch).
  conv_l2norm_backward(s, b.m_dpre, gd.conv, b.m_dqkv, b.m_dqk, st.qkv_pre, st.q_rnorm, st.k_rnorm, w.conv, doc, N,
                       m.T, Dc, m.K, m.Hk, m.dk, b.conv_ws);
  delta_gates_backward(s, b.m_db, b.m_da, gd.A_log, gd.dt_bias, b.m_dbeta, b.m_dg, st.b, st.a, w.A_log, w.dt_bias,
                       N, Hv, b.gates_ws);
  gpu_linear_backward(g, s, dn1, gd.in_qkv, nullptr, b.m_dpre, st.n1, w.in_qkv, N, C, Dc, b.operand, b.x32,
                      adapter(blk, b, Adapted::in_proj_qkv, 0, &gr));
  gpu_linear_backward(g, s, b.dtmp, gd.in_z, nullptr, b.m_dz, st.n1, w.in_z, N, C, VD, b.operand, b.x32,
                      adapter(blk, b, Adapted::in_proj_z, 0, &gr));
  accumulate(s, dn1, b.dtmp, N * C);
  gpu_linear_backward(g, s, b.dtmp, gd.in_b, nullptr, b.m_db, st.n1, w.in_b, N, C, Hv, b.operand, b.x32,
                      adapter(blk, b, Adapted::in_proj_b, 0, &gr));
  accumulate(s, dn1, b.dtmp, N * C);
  gpu_linear_backward(g, s, b.dtmp, gd.in_a, nullptr, b.m_da, st.n1, w.in_a, N, C, Hv, b.operand, b.x32,
                      adapter(blk, b, Adapted::in_proj_a, 0, &gr));
  accumulate(s, dn1, b.dtmp, N * C);
}

// The attention half and n2 (everything before the MLP) into the stored internals, as the forward computes them.
inline void forward_attention_half(const GemmContext& g, Stream s, const CudaBlock& blk, const BlockScratchCuda& b,
                                   const StoredView& st, const bf16_t* x_in) {
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, QD = sh.QD(), KVD = sh.KVD(), R = sh.rotary;
  const NormWeightsGpu nw = NormWeightsGpu::make(s, sh, w, b);
  rmsnorm_forward(s, st.n1, st.rstd1, x_in, nw.ln1, N, C, sh.eps);
  if (sh.linear()) {
    mixer_forward(g, s, blk, b, st, b.p);  // the mixer's output in p
  } else {
    // q and k: projection (f32) → [rounded q_raw (gated: queries gathered) → norm per head (f32)] → RoPE (f32)
    // → rounded into the store.
    auto query_key = [&](const WeightRef& W, const float* bias, Adapted which, const float* norm_w, bf16_t* raw,
                         float* rstd, bf16_t* out, int64_t width, int64_t heads, bool gated) {
      gpu_linear(g, s, b.p, st.n1, W, bias, N, C, width, b.x32, adapter(blk, b, which));
      float* x = b.p;
      if (sh.qk_norm) {
        convert(s, raw, b.p, N * width);
        convert(s, b.p, raw, N * width);  // computing on from the rounded value
        const float* in = b.p;
        if (gated) {  // [query | gate] per head: the queries [N·Hq, D] into p2
          gather_queries(s, b.p2, b.p, N * heads, sh.D);
          in = b.p2;
        }
        float* normed = gated ? b.p : b.p2;
        rmsnorm_forward(s, normed, rstd, in, norm_w, N * heads, sh.D, sh.eps);
        x = normed;
      }
      rope_partial_forward(s, x, blk.tok.pos, blk.rope_cos, blk.rope_sin, N, heads, sh.D, R);
      convert(s, out, x, N * heads * sh.D);
    };
    query_key(w.wq, w.bq, Adapted::q_proj, nw.q_norm, st.q_raw, st.q_rstd, st.q, sh.QPD(), sh.Hq, sh.out_gate);
    query_key(w.wk, w.bk, Adapted::k_proj, nw.k_norm, st.k_raw, st.k_rstd, st.k, KVD, sh.Hkv, false);
    gpu_linear(g, s, b.p, st.n1, w.wv, w.bv, N, C, KVD, b.x32, adapter(blk, b, Adapted::v_proj));
    convert(s, st.v, b.p, N * KVD);
    // GPT-OSS: a sliding layer's window, and the sinks applied where att is stored (rounded once, as the CPU block).
    attention_forward(s, st.att, st.lse, st.q, st.k, st.v, blk.tok.doc_ids,
                      AttentionShape{sh.B, sh.T, sh.Hq, sh.Hkv, sh.D, sh.window}, w.sinks);
    if (sh.out_gate) {  // o_proj reads att × σ(gate) in f32, from the rounded att and gate (not stored)
      convert(s, b.gated, st.att, N * QD);
      convert(s, b.p, st.q_raw, N * sh.QPD());
      sigmoid_gate_forward(s, b.gated, b.gated, b.p + sh.D, N, sh.Hq, sh.D, sh.QPD(), 2 * sh.D);
      gpu_linear_f32_input(g, s, b.p, b.gated, w.wo, w.bo, N, QD, C, b.operand, adapter(blk, b, Adapted::o_proj));
    } else {
      gpu_linear(g, s, b.p, st.att, w.wo, w.bo, N, QD, C, b.p2, adapter(blk, b, Adapted::o_proj));
    }
  }
  // x_mid = x_in + the mixer's output (p), in f32, rounded into the store; n2 from the rounded x_mid.
  convert(s, b.x32, x_in, N * C);
  add(s, b.p2, b.x32, b.p, N * C);
  convert(s, st.x_mid, b.p2, N * C);
  rmsnorm_forward(s, st.n2, st.rstd2, st.x_mid, nw.ln2, N, C, sh.eps);
}

// gate, up (rounded) and h = silu(gate)·up of the n tokens from t0 (their n2 rows start at n2), into gate / up / h.
inline void mlp_internals(const GemmContext& g, Stream s, const CudaBlock& blk, const BlockScratchCuda& b, bf16_t* gate,
                          bf16_t* up, bf16_t* h, const bf16_t* n2, int64_t t0, int64_t n) {
  const BlockView& w = blk.weights;
  const int64_t C = blk.shape.C, I = blk.shape.I;
  gpu_linear(g, s, b.pm, n2, w.wgate, w.bgate, n, C, I, b.x32, adapter(blk, b, Adapted::gate_proj, t0));
  convert(s, gate, b.pm, n * I);
  gpu_linear(g, s, b.pm, n2, w.wup, w.bup, n, C, I, b.x32, adapter(blk, b, Adapted::up_proj, t0));
  convert(s, up, b.pm, n * I);
  swiglu_forward(s, h, gate, up, n * I);
}

}  // namespace detail

void block_forward(const GemmContext& g, Stream s, const CudaBlock& blk, bf16_t* x_out, void* stored,
                   const bf16_t* x_in, Saved saved) {
  LT_CHECK(saved == Saved::stored || saved == Saved::recompute,
           "CUDA block forward: the internals are stored (kept) or recomputed, not in an f32 working copy");
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, I = sh.I;
  const detail::BlockScratchCuda b = detail::BlockScratchCuda::carve(blk.scratch, sh);
  const detail::StoredView st = detail::StoredView::bind(stored, sh);
  detail::forward_attention_half(g, s, blk, b, st, x_in);
  // The MLP chunk by chunk: gate, up, h into the store (a layer that keeps them) or the chunk's scratch (one
  // whose backward recomputes them: the store ends before them), y = down(h) into p2's rows; then
  // x_out = y + x_mid (rounded).
  // A sparse layer's chunks are its route slices (model/moe_ffn.h), whose rows are mlp_width() per token.
  const int64_t R = sh.mlp_rows(), Wm = sh.mlp_width();
  const bool keep = saved == Saved::stored;
  for (int64_t t0 = 0; t0 < N; t0 += R) {
    const int64_t n = std::min(R, N - t0);
    bf16_t *gate = keep ? st.gate + t0 * Wm : b.gate_c, *up = keep ? st.up + t0 * Wm : b.up_c,
           *h = keep ? st.h + t0 * Wm : b.h_c;
    const bf16_t* n2 = st.n2 + t0 * C;
    if (sh.sparse) {
      const detail::MoeAdapters ad = detail::moe_adapters(blk, b, t0);
      const std::vector<int64_t> offsets =
          detail::moe_route_slice(g, s, sh, w.moe, b.moe, n2, n, blk.tok.moe_aux, t0, b.x32, ad);
      if (!keep) gate = b.moe.gate_c, up = b.moe.up_c, h = b.moe.h_c;
      detail::moe_internals(g, s, sh, w.moe, b.moe, offsets, gate, up, h, n2, n, b.x32, ad);
      detail::moe_down_combine(g, s, sh, w.moe, b.moe, offsets, b.p2 + t0 * C, h, n2, n, b.x32, ad);
      continue;
    }
    detail::mlp_internals(g, s, blk, b, gate, up, h, n2, t0, n);
    detail::gpu_linear(g, s, b.p2 + t0 * C, h, w.wdown, w.bdown, n, I, C, b.pm,
                       detail::adapter(blk, b, Adapted::down_proj, t0));
  }
  convert(s, b.x32, st.x_mid, N * C);
  accumulate(s, b.p2, b.x32, N * C);
  convert(s, x_out, b.p2, N * C);
}

void block_recompute_internals(const GemmContext& g, Stream s, const CudaBlock& blk, void* stored,
                               const bf16_t* x_in) {
  const detail::BlockScratchCuda b = detail::BlockScratchCuda::carve(blk.scratch, blk.shape);
  detail::forward_attention_half(g, s, blk, b, detail::StoredView::bind(stored, blk.shape), x_in);
}

void block_backward_mlp(const GemmContext& g, Stream s, const CudaBlock& blk, BlockGrads& gr, const float* dx_out,
                        const void* stored, Saved saved) {
  LT_CHECK(saved == Saved::stored || saved == Saved::recompute,
           "CUDA block backward: the internals are stored (kept) or recomputed, not in an f32 working copy");
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, I = sh.I;
  const detail::BlockScratchCuda b = detail::BlockScratchCuda::carve(blk.scratch, sh);
  const detail::StoredView st = detail::StoredView::bind(const_cast<void*>(stored), sh);
  float* wide = b.p;  // f32 widening of stored operands in f32 GEMM mode
  // Chunk by chunk as the forward: x_out = x_mid + down(h).
  const int64_t R = sh.mlp_rows(), Wm = sh.mlp_width();
  for (int64_t t0 = 0; t0 < N; t0 += R) {
    const int64_t n = std::min(R, N - t0);
    const bf16_t* n2 = st.n2 + t0 * C;
    const bf16_t *h = st.h + t0 * Wm, *gate = st.gate + t0 * Wm, *up = st.up + t0 * Wm;
    if (sh.sparse) {  // routed again from n2 (the forward's bits), its internals recomputed where not kept
      const detail::MoeScratchCuda& m = b.moe;
      const detail::MoeAdapters ad = detail::moe_adapters(blk, b, t0);
      const std::vector<int64_t> offsets =
          detail::moe_route_slice(g, s, sh, w.moe, m, n2, n, nullptr, t0, b.x32, ad);
      if (saved == Saved::recompute) {
        detail::moe_internals(g, s, sh, w.moe, m, offsets, m.gate_c, m.up_c, m.h_c, n2, n, b.x32, ad);
        h = m.h_c, gate = m.gate_c, up = m.up_c;
      }
      detail::moe_backward(g, s, sh, w.moe, gr.moe, m, offsets, b.dn + t0 * C, b.dtmp + t0 * C, dx_out + t0 * C, n2,
                           gate, up, h, n, blk.tok.moe_aux, t0, b.x32, ad);
      continue;
    }
    if (saved == Saved::recompute) {  // this chunk's gate, up, h again, as the forward computed them
      detail::mlp_internals(g, s, blk, b, b.gate_c, b.up_c, b.h_c, n2, t0, n);
      h = b.h_c, gate = b.gate_c, up = b.up_c;
    }
    detail::gpu_linear_backward(g, s, b.dh, gr.wdown, gr.bdown, dx_out + t0 * C, h, w.wdown, n, I, C, b.operand,
                                wide, detail::adapter(blk, b, Adapted::down_proj, t0, &gr));
    swiglu_backward(s, b.dgate, b.dup, b.dh, gate, up, n * I);
    detail::gpu_linear_backward(g, s, b.dn + t0 * C, gr.wgate, gr.bgate, b.dgate, n2, w.wgate, n, C, I, b.operand,
                                wide, detail::adapter(blk, b, Adapted::gate_proj, t0, &gr));
    detail::gpu_linear_backward(g, s, b.dtmp + t0 * C, gr.wup, gr.bup, b.dup, n2, w.wup, n, C, I, b.operand, wide,
                                detail::adapter(blk, b, Adapted::up_proj, t0, &gr));
  }
  accumulate(s, b.dn, b.dtmp, N * C);
  const detail::NormWeightsGpu nw = detail::NormWeightsGpu::make(s, sh, w, b);
  rmsnorm_backward(s, b.dx_mid, gr.ln2, b.dn, st.x_mid, nw.ln2, st.rstd2, N, C, b.norm_ws);
  accumulate(s, b.dx_mid, dx_out, N * C);
}

void block_backward_attention(const GemmContext& g, Stream s, const CudaBlock& blk, float* dx_in, BlockGrads& gr,
                              const bf16_t* x_in, const void* stored) {
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, QD = sh.QD(), KVD = sh.KVD(), R = sh.rotary;
  const detail::BlockScratchCuda b = detail::BlockScratchCuda::carve(blk.scratch, sh);
  const detail::StoredView st = detail::StoredView::bind(const_cast<void*>(stored), sh);
  const detail::NormWeightsGpu nw = detail::NormWeightsGpu::make(s, sh, w, b);
  float* wide = b.p;
  // x_mid = x_in + mixer(n1), from the MLP half's dx_mid (in the scratch); the mixer input's gradient into dn.
  if (sh.linear()) {
    detail::mixer_backward(g, s, blk, b, st, gr, b.dn, b.dx_mid);
  } else {
    const float* datt = b.datt;
    if (sh.out_gate) {
      // o_proj read att × σ(gate): recomputed (the same bits, in dq before the attention backward writes it);
      // datt holds its gradient, then in place att's, and the gate's goes into dq_raw's gate halves.
      convert(s, b.gated, st.att, N * QD);
      convert(s, b.p, st.q_raw, N * sh.QPD());
      sigmoid_gate_forward(s, b.gated, b.gated, b.p + sh.D, N, sh.Hq, sh.D, sh.QPD(), 2 * sh.D);
      detail::gpu_linear_backward_f32_input(g, s, b.datt, gr.wo, gr.bo, b.dx_mid, b.gated, w.wo, N, QD, C,
                                            b.operand, b.qb, detail::adapter(blk, b, Adapted::o_proj, 0, &gr));
      sigmoid_gate_backward(s, b.datt, b.dq_raw + sh.D, b.datt, st.att, st.q_raw + sh.D, N, sh.Hq, sh.D, sh.QPD(),
                            2 * sh.D);
    } else {
      detail::gpu_linear_backward(g, s, b.datt, gr.wo, gr.bo, b.dx_mid, st.att, w.wo, N, QD, C, b.operand, wide,
                                  detail::adapter(blk, b, Adapted::o_proj, 0, &gr));
    }
    const AttentionShape as{sh.B, sh.T, sh.Hq, sh.Hkv, sh.D, sh.window};
    attention_backward(s, b.dq, b.dk, b.dv, datt, st.att, st.lse, st.q, st.k, st.v, blk.tok.doc_ids, as, b.attn_ws);
    if (w.sinks && gr.sinks) {  // the sinks' gradient from the same stored att and lse (ops/attention.h); frozen: none
      attention_sinks_backward(s, b.dsinks, datt, st.att, st.lse, w.sinks, as);
      accumulate(s, gr.sinks, b.dsinks, sh.Hq);
    }
    rope_partial_backward(s, b.dq, blk.tok.pos, blk.rope_cos, blk.rope_sin, N, sh.Hq, sh.D, R);
    rope_partial_backward(s, b.dk, blk.tok.pos, blk.rope_cos, blk.rope_sin, N, sh.Hkv, sh.D, R);
    const float* dq_proj = b.dq;
    const float* dk_proj = b.dk;
    if (sh.qk_norm) {
      if (sh.out_gate) {  // the queries before q_norm gathered from q_raw; their gradient into its query halves
        gather_queries(s, b.qb, st.q_raw, N * sh.Hq, sh.D);
        rmsnorm_backward(s, b.p2, gr.q_norm, b.dq, b.qb, nw.q_norm, st.q_rstd, N * sh.Hq, sh.D, b.norm_ws);
        scatter_queries(s, b.dq_raw, b.p2, N * sh.Hq, sh.D);
      } else {
        rmsnorm_backward(s, b.dq_raw, gr.q_norm, b.dq, st.q_raw, nw.q_norm, st.q_rstd, N * sh.Hq, sh.D, b.norm_ws);
      }
      rmsnorm_backward(s, b.dk_raw, gr.k_norm, b.dk, st.k_raw, nw.k_norm, st.k_rstd, N * sh.Hkv, sh.D, b.norm_ws);
      dq_proj = b.dq_raw, dk_proj = b.dk_raw;
    }
    detail::gpu_linear_backward(g, s, b.dn, gr.wq, gr.bq, dq_proj, st.n1, w.wq, N, C, sh.QPD(), b.operand, wide,
                                detail::adapter(blk, b, Adapted::q_proj, 0, &gr));
    detail::gpu_linear_backward(g, s, b.dtmp, gr.wk, gr.bk, dk_proj, st.n1, w.wk, N, C, KVD, b.operand, wide,
                                detail::adapter(blk, b, Adapted::k_proj, 0, &gr));
    accumulate(s, b.dn, b.dtmp, N * C);
    detail::gpu_linear_backward(g, s, b.dtmp, gr.wv, gr.bv, b.dv, st.n1, w.wv, N, C, KVD, b.operand, wide,
                                detail::adapter(blk, b, Adapted::v_proj, 0, &gr));
    accumulate(s, b.dn, b.dtmp, N * C);
  }
  rmsnorm_backward(s, dx_in, gr.ln1, b.dn, x_in, nw.ln1, st.rstd1, N, C, b.norm_ws);
  accumulate(s, dx_in, b.dx_mid, N * C);
}

void block_backward(const GemmContext& g, Stream s, const CudaBlock& blk, float* dx_in, BlockGrads& gr,
                    const float* dx_out, const bf16_t* x_in, const void* stored, Saved saved) {
  block_backward_mlp(g, s, blk, gr, dx_out, stored, saved);
  block_backward_attention(g, s, blk, dx_in, gr, x_in, stored);
}

}  // namespace lt::cuda::LT_KERNELS_NS
