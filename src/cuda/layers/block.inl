// cuda/layers/block.inl — the decoder block (model/block.h) as a sequence of launches on the GPU kernels and
// cuBLASLt calls: host code compiled into both namespaces, like the head (cuda/layers/head.inl). Activations stored in bf16 (the
// GPU's storage, docs/activations.md) into the layer's stored-internals buffer in model/block.h's layout
// (block_stored_offsets), so a kept layer holds exactly what the CPU block keeps and the backward reads it
// from there; the backward's gradients are f32.
//
// The CPU block's rounding points are kept: every stored activation is rounded to bf16 where it is produced
// and the next op computes on the rounded value. A kernel with bf16 output computes in f32 and rounds once
// on store, so most steps are one launch; where the CPU block applies two ops in f32 before rounding (RoPE
// after the projection or the q/k norm, the residual adds) the GPU block runs them in f32 scratch and rounds
// once after. GEMMs read bf16 operands (activation gradients are rounded first, as the CPU linear does) or
// f32 ones in f32 mode, and write f32. Results agree with the CPU block to f32 rounding of the GEMMs' and
// attention's sums, plus a rounding that may fall the other way near a bf16 boundary; with the kernels'
// determinism, the same inputs give the same bits on every run.
//
// A layer that does not keep its internals recomputes the attention half and n2 into a stored buffer
// (block_recompute_internals) and its MLP chunk by chunk inside the backward (Saved::recompute), as the CPU
// block does; the backward then gives the kept layer's bits.
//
// The MLP runs over token chunks of BlockShape::mlp_rows() (multiples of kTokenSlice), as the CPU block's, so
// its scratch is O(chunk·I), not O(N·I), and every chunk size gives the same bits (the GEMMs' rows do not
// depend on the call's M, and the weight gradients' token slices are the same). The executor's working set
// counts this scratch ("block scratch", gpu_block_scratch_bytes) when the step runs the GPU block.
#pragma once

#include <algorithm>

#include "cuda/layers.h"
#include "cuda/layers/head.inl"
#include "cuda/scratch.h"
#include "model/block.h"

namespace lt::cuda::LT_KERNELS_NS {

namespace detail {

struct BlockScratchGpu {
  float *x32, *p, *p2, *pm;                   // [N, C], [max(N·max(QD, C), R·I)], [N, max(QD, C)], [R, I]
  float *dh, *dgate, *dup;                    // [R, I]: one MLP chunk (R = mlp_rows)
  float *dn, *dtmp, *dx_mid;                  // [N, C]
  float *datt, *dq, *dq_raw, *dk, *dv, *dk_raw;  // [N, QD] x3, [N, KVD] x3
  bf16_t* operand;                            // as p: dY rounded for the GEMMs
  bf16_t *gate_c, *up_c, *h_c;                // [R, I]: a recomputed layer's MLP internals, one chunk
  void *norm_ws, *attn_ws;
  size_t bytes;
  static BlockScratchGpu carve(void* base, const BlockShape& s) {
    const int64_t N = s.N(), C = s.C, QD = s.QD(), KVD = s.KVD(), I = s.I, R = s.mlp_rows();
    const int64_t mid = std::max(QD, C), wide = std::max(N * mid, R * I);
    ScratchCarver c(base);
    BlockScratchGpu b;
    b.x32 = c.take<float>(N * C), b.p = c.take<float>(wide), b.p2 = c.take<float>(N * mid);
    b.pm = c.take<float>(R * I);
    b.dh = c.take<float>(R * I), b.dgate = c.take<float>(R * I), b.dup = c.take<float>(R * I);
    b.dn = c.take<float>(N * C), b.dtmp = c.take<float>(N * C), b.dx_mid = c.take<float>(N * C);
    b.datt = c.take<float>(N * QD), b.dq = c.take<float>(N * QD), b.dq_raw = c.take<float>(N * QD);
    b.dk = c.take<float>(N * KVD), b.dv = c.take<float>(N * KVD), b.dk_raw = c.take<float>(N * KVD);
    b.operand = c.take<bf16_t>(wide);
    b.gate_c = c.take<bf16_t>(R * I), b.up_c = c.take<bf16_t>(R * I), b.h_c = c.take<bf16_t>(R * I);
    b.norm_ws = c.take_bytes(std::max({rmsnorm_backward_workspace_bytes(N, C),
                                       rmsnorm_backward_workspace_bytes(N * s.Hq, s.D),
                                       rmsnorm_backward_workspace_bytes(N * s.Hkv, s.D)}));
    b.attn_ws = c.take_bytes(attention_backward_workspace_bytes(AttentionShape{s.B, s.T, s.Hq, s.Hkv, s.D}));
    b.bytes = c.bytes();
    return b;
  }
};

// The stored internals of a layer, bound from model/block.h's offsets.
struct StoredView {
  bf16_t *n1, *q, *k, *v, *q_raw, *k_raw, *att, *x_mid, *n2, *gate, *up, *h;
  float *rstd1, *q_rstd, *k_rstd, *lse, *rstd2;
  static StoredView bind(void* base, const BlockShape& s) {
    const StoredOffsets o = block_stored_offsets(s);
    char* p = static_cast<char*>(base);
    auto b16 = [&](int64_t off) { return off < 0 ? nullptr : reinterpret_cast<bf16_t*>(p + off); };
    auto f32 = [&](int64_t off) { return off < 0 ? nullptr : reinterpret_cast<float*>(p + off); };
    return {b16(o.n1),    b16(o.q),     b16(o.k),      b16(o.v),    b16(o.q_raw), b16(o.k_raw),
            b16(o.att),   b16(o.x_mid), b16(o.n2),     b16(o.gate), b16(o.up),    b16(o.h),
            f32(o.rstd1), f32(o.q_rstd), f32(o.k_rstd), f32(o.lse), f32(o.rstd2)};
  }
};

inline MatType weight_type(const WeightRef& w) { return w.dtype == DType::bf16 ? MatType::bf16 : MatType::f32; }

// out[N, out_f] (f32) = in[N, in_f] (bf16) · Wᵀ + bias. In f32 GEMM mode the operands are widened first
// (into `widened`, [N, in_f] f32).
inline void gpu_linear(const GemmContext& g, Stream s, float* out, const bf16_t* in, const WeightRef& W, const float* bias,
                int64_t N, int64_t in_f, int64_t out_f, float* widened) {
  const MatType t = weight_type(W);
  const void* x = in;
  if (t == MatType::f32) {
    convert(s, widened, in, N * in_f);
    x = widened;
  }
  run_matmul(g, linear_forward_matmul(out, MatType::f32, x, W.data, t, bias, N, out_f, in_f), s);
}

// din = dout · W (written; skipped when null), dW += doutᵀ · in, dbias += Σ dout: dout f32 rounded to bf16 as
// a GEMM operand in bf16 mode (`operand`), `in` the stored bf16 activation (widened into `widened` in f32 mode).
inline void gpu_linear_backward(const GemmContext& g, Stream s, float* din, float* dW, float* dbias, const float* dout,
                         const bf16_t* in, const WeightRef& W, int64_t N, int64_t in_f, int64_t out_f, bf16_t* operand,
                         float* widened) {
  const MatType t = weight_type(W);
  const void* dy = dout;
  const void* x = in;
  if (t == MatType::bf16) {
    convert(s, operand, dout, N * out_f);
    dy = operand;
  } else {
    convert(s, widened, in, N * in_f);
    x = widened;
  }
  if (din) run_matmul(g, linear_dinput_matmul(din, dy, W.data, t, N, out_f, in_f), s);
  for (const Matmul& mm : linear_dweight_matmuls(dW, dy, x, t, N, out_f, in_f)) run_matmul(g, mm, s);
  if (dbias) bias_grad(s, dbias, dout, N, out_f);
}

}  // namespace detail

namespace detail {

// The attention half and n2 (everything before the MLP) into the stored internals, as the forward computes them.
inline void forward_attention_half(const GemmContext& g, Stream s, const GpuBlock& blk, const BlockScratchGpu& b,
                                   const StoredView& st, const bf16_t* x_in) {
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, QD = sh.QD(), KVD = sh.KVD();
  rmsnorm_forward(s, st.n1, st.rstd1, x_in, w.ln1, N, C, sh.eps);
  // q and k: projection (f32) → [rounded q_raw → norm per head (f32)] → RoPE (f32) → rounded into the store.
  auto query_key = [&](const WeightRef& W, const float* bias, const float* norm_w, bf16_t* raw, float* rstd,
                       bf16_t* out, int64_t width, int64_t heads) {
    gpu_linear(g, s, b.p, st.n1, W, bias, N, C, width, b.x32);
    float* x = b.p;
    if (sh.qk_norm) {
      convert(s, raw, b.p, N * width);
      convert(s, b.p, raw, N * width);  // computing on from the rounded value
      rmsnorm_forward(s, b.p2, rstd, b.p, norm_w, N * heads, sh.D, sh.eps);
      x = b.p2;
    }
    rope_forward(s, x, blk.tok.pos, blk.rope_cos, blk.rope_sin, N, heads, sh.D);
    convert(s, out, x, N * width);
  };
  query_key(w.wq, w.bq, w.q_norm, st.q_raw, st.q_rstd, st.q, QD, sh.Hq);
  query_key(w.wk, w.bk, w.k_norm, st.k_raw, st.k_rstd, st.k, KVD, sh.Hkv);
  gpu_linear(g, s, b.p, st.n1, w.wv, w.bv, N, C, KVD, b.x32);
  convert(s, st.v, b.p, N * KVD);
  attention_forward(s, st.att, st.lse, st.q, st.k, st.v, blk.tok.doc_ids,
                    AttentionShape{sh.B, sh.T, sh.Hq, sh.Hkv, sh.D});
  // x_mid = x_in + o_proj(att), in f32, rounded into the store; n2 from the rounded x_mid.
  gpu_linear(g, s, b.p, st.att, w.wo, w.bo, N, QD, C, b.p2);
  convert(s, b.x32, x_in, N * C);
  add(s, b.p2, b.x32, b.p, N * C);
  convert(s, st.x_mid, b.p2, N * C);
  rmsnorm_forward(s, st.n2, st.rstd2, st.x_mid, w.ln2, N, C, sh.eps);
}

// gate, up (rounded) and h = silu(gate)·up of the n tokens whose n2 rows start at n2, into gate / up / h.
inline void mlp_internals(const GemmContext& g, Stream s, const GpuBlock& blk, const BlockScratchGpu& b, bf16_t* gate,
                          bf16_t* up, bf16_t* h, const bf16_t* n2, int64_t n) {
  const BlockView& w = blk.weights;
  const int64_t C = blk.shape.C, I = blk.shape.I;
  gpu_linear(g, s, b.pm, n2, w.wgate, w.bgate, n, C, I, b.x32);
  convert(s, gate, b.pm, n * I);
  gpu_linear(g, s, b.pm, n2, w.wup, w.bup, n, C, I, b.x32);
  convert(s, up, b.pm, n * I);
  swiglu_forward(s, h, gate, up, n * I);
}

}  // namespace detail

void block_forward(const GemmContext& g, Stream s, const GpuBlock& blk, bf16_t* x_out, void* stored,
                   const bf16_t* x_in) {
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, I = sh.I;
  const detail::BlockScratchGpu b = detail::BlockScratchGpu::carve(blk.scratch, sh);
  const detail::StoredView st = detail::StoredView::bind(stored, sh);
  detail::forward_attention_half(g, s, blk, b, st, x_in);
  // The MLP chunk by chunk: gate, up, h into the store, y = down(h) into p2's rows; then x_out = y + x_mid
  // (rounded).
  const int64_t R = sh.mlp_rows();
  for (int64_t t0 = 0; t0 < N; t0 += R) {
    const int64_t n = std::min(R, N - t0);
    detail::mlp_internals(g, s, blk, b, st.gate + t0 * I, st.up + t0 * I, st.h + t0 * I, st.n2 + t0 * C, n);
    detail::gpu_linear(g, s, b.p2 + t0 * C, st.h + t0 * I, w.wdown, w.bdown, n, I, C, b.pm);
  }
  convert(s, b.x32, st.x_mid, N * C);
  accumulate(s, b.p2, b.x32, N * C);
  convert(s, x_out, b.p2, N * C);
}

void block_recompute_internals(const GemmContext& g, Stream s, const GpuBlock& blk, void* stored,
                               const bf16_t* x_in) {
  const detail::BlockScratchGpu b = detail::BlockScratchGpu::carve(blk.scratch, blk.shape);
  detail::forward_attention_half(g, s, blk, b, detail::StoredView::bind(stored, blk.shape), x_in);
}

void block_backward_mlp(const GemmContext& g, Stream s, const GpuBlock& blk, BlockGrads& gr, const float* dx_out,
                        const void* stored, Saved saved) {
  LT_CHECK(saved == Saved::stored || saved == Saved::recompute,
           "GPU block backward: the internals are stored (kept) or recomputed, not in an f32 working copy");
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, I = sh.I;
  const detail::BlockScratchGpu b = detail::BlockScratchGpu::carve(blk.scratch, sh);
  const detail::StoredView st = detail::StoredView::bind(const_cast<void*>(stored), sh);
  float* wide = b.p;  // f32 widening of stored operands in f32 GEMM mode
  // Chunk by chunk as the forward: x_out = x_mid + down(h).
  const int64_t R = sh.mlp_rows();
  for (int64_t t0 = 0; t0 < N; t0 += R) {
    const int64_t n = std::min(R, N - t0);
    const bf16_t* n2 = st.n2 + t0 * C;
    const bf16_t *h = st.h + t0 * I, *gate = st.gate + t0 * I, *up = st.up + t0 * I;
    if (saved == Saved::recompute) {  // this chunk's gate, up, h again, as the forward computed them
      detail::mlp_internals(g, s, blk, b, b.gate_c, b.up_c, b.h_c, n2, n);
      h = b.h_c, gate = b.gate_c, up = b.up_c;
    }
    detail::gpu_linear_backward(g, s, b.dh, gr.wdown, gr.bdown, dx_out + t0 * C, h, w.wdown, n, I, C, b.operand,
                                wide);
    swiglu_backward(s, b.dgate, b.dup, b.dh, gate, up, n * I);
    detail::gpu_linear_backward(g, s, b.dn + t0 * C, gr.wgate, gr.bgate, b.dgate, n2, w.wgate, n, C, I, b.operand,
                                wide);
    detail::gpu_linear_backward(g, s, b.dtmp + t0 * C, gr.wup, gr.bup, b.dup, n2, w.wup, n, C, I, b.operand, wide);
  }
  accumulate(s, b.dn, b.dtmp, N * C);
  rmsnorm_backward(s, b.dx_mid, gr.ln2, b.dn, st.x_mid, w.ln2, st.rstd2, N, C, b.norm_ws);
  accumulate(s, b.dx_mid, dx_out, N * C);
}

void block_backward_attention(const GemmContext& g, Stream s, const GpuBlock& blk, float* dx_in, BlockGrads& gr,
                              const bf16_t* x_in, const void* stored) {
  const BlockShape& sh = blk.shape;
  const BlockView& w = blk.weights;
  const int64_t N = sh.N(), C = sh.C, QD = sh.QD(), KVD = sh.KVD();
  const detail::BlockScratchGpu b = detail::BlockScratchGpu::carve(blk.scratch, sh);
  const detail::StoredView st = detail::StoredView::bind(const_cast<void*>(stored), sh);
  float* wide = b.p;
  // x_mid = x_in + o(att), from the MLP half's dx_mid (in the scratch).
  detail::gpu_linear_backward(g, s, b.datt, gr.wo, gr.bo, b.dx_mid, st.att, w.wo, N, QD, C, b.operand, wide);
  attention_backward(s, b.dq, b.dk, b.dv, b.datt, st.att, st.lse, st.q, st.k, st.v, blk.tok.doc_ids,
                     AttentionShape{sh.B, sh.T, sh.Hq, sh.Hkv, sh.D}, b.attn_ws);
  rope_backward(s, b.dq, blk.tok.pos, blk.rope_cos, blk.rope_sin, N, sh.Hq, sh.D);
  rope_backward(s, b.dk, blk.tok.pos, blk.rope_cos, blk.rope_sin, N, sh.Hkv, sh.D);
  const float* dq_proj = b.dq;
  const float* dk_proj = b.dk;
  if (sh.qk_norm) {
    rmsnorm_backward(s, b.dq_raw, gr.q_norm, b.dq, st.q_raw, w.q_norm, st.q_rstd, N * sh.Hq, sh.D, b.norm_ws);
    rmsnorm_backward(s, b.dk_raw, gr.k_norm, b.dk, st.k_raw, w.k_norm, st.k_rstd, N * sh.Hkv, sh.D, b.norm_ws);
    dq_proj = b.dq_raw, dk_proj = b.dk_raw;
  }
  detail::gpu_linear_backward(g, s, b.dn, gr.wq, gr.bq, dq_proj, st.n1, w.wq, N, C, QD, b.operand, wide);
  detail::gpu_linear_backward(g, s, b.dtmp, gr.wk, gr.bk, dk_proj, st.n1, w.wk, N, C, KVD, b.operand, wide);
  accumulate(s, b.dn, b.dtmp, N * C);
  detail::gpu_linear_backward(g, s, b.dtmp, gr.wv, gr.bv, b.dv, st.n1, w.wv, N, C, KVD, b.operand, wide);
  accumulate(s, b.dn, b.dtmp, N * C);
  rmsnorm_backward(s, dx_in, gr.ln1, b.dn, x_in, w.ln1, st.rstd1, N, C, b.norm_ws);
  accumulate(s, dx_in, b.dx_mid, N * C);
}

void block_backward(const GemmContext& g, Stream s, const GpuBlock& blk, float* dx_in, BlockGrads& gr,
                    const float* dx_out, const bf16_t* x_in, const void* stored, Saved saved) {
  block_backward_mlp(g, s, blk, gr, dx_out, stored, saved);
  block_backward_attention(g, s, blk, dx_in, gr, x_in, stored);
}

}  // namespace lt::cuda::LT_KERNELS_NS
