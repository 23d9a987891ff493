// model/block.cpp — the decoder block as a list of op calls, forward then backward in reverse.
#include "model/block.h"

#include "core/error.h"
#include "ops/ops.h"

namespace lt {
namespace {

const float* f32_or_null(const SlabLayout& layout, const uint8_t* base, const char* name) {
  const SlabEntry* e = layout.find(name);
  if (!e) return nullptr;
  LT_CHECK(e->dtype == DType::f32, "slab vector '{}' must be f32", name);
  return reinterpret_cast<const float*>(base + e->offset);
}

const float* f32_required(const SlabLayout& layout, const uint8_t* base, const char* name) {
  const SlabEntry& e = layout.entry(name);
  LT_CHECK(e.dtype == DType::f32, "slab vector '{}' must be f32", name);
  return reinterpret_cast<const float*>(base + e.offset);
}

WeightRef matrix(const SlabLayout& layout, const uint8_t* base, const char* name) {
  const SlabEntry& e = layout.entry(name);
  return WeightRef{base + e.offset, e.dtype};
}

float* grad_or_null(const SlabLayout& layout, uint8_t* base, const char* name) {
  const SlabEntry* e = layout.find(name);
  if (!e) return nullptr;
  LT_CHECK(e->dtype == DType::f32, "gradient slab entries must be f32 ('{}')", name);
  return reinterpret_cast<float*>(base + e->offset);
}

float* grad_required(const SlabLayout& layout, uint8_t* base, const char* name) {
  float* p = grad_or_null(layout, base, name);
  LT_CHECK(p != nullptr, "gradient slab has no '{}'", name);
  return p;
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// y = a + b (the residual connection; a separate output keeps the boundary buffers immutable).
void add(float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

}  // namespace

BlockShape BlockShape::make(const ModelConfig& cfg, int64_t B, int64_t T) {
  return BlockShape{B,
                    T,
                    cfg.hidden_size,
                    cfg.num_heads,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    cfg.intermediate_size,
                    float(cfg.rms_norm_eps),
                    cfg.rope_theta,
                    cfg.qk_norm};
}

BlockView BlockView::bind(const SlabLayout& layout, const void* base_ptr) {
  LT_CHECK(layout.kind() == SlabKind::layer, "BlockView binds a layer slab");
  auto* base = static_cast<const uint8_t*>(base_ptr);
  BlockView w;
  w.ln1 = f32_required(layout, base, "input_layernorm.weight");
  w.wq = matrix(layout, base, "self_attn.q_proj.weight");
  w.wk = matrix(layout, base, "self_attn.k_proj.weight");
  w.wv = matrix(layout, base, "self_attn.v_proj.weight");
  w.wo = matrix(layout, base, "self_attn.o_proj.weight");
  w.bq = f32_or_null(layout, base, "self_attn.q_proj.bias");
  w.bk = f32_or_null(layout, base, "self_attn.k_proj.bias");
  w.bv = f32_or_null(layout, base, "self_attn.v_proj.bias");
  w.bo = f32_or_null(layout, base, "self_attn.o_proj.bias");
  w.q_norm = f32_or_null(layout, base, "self_attn.q_norm.weight");
  w.k_norm = f32_or_null(layout, base, "self_attn.k_norm.weight");
  w.ln2 = f32_required(layout, base, "post_attention_layernorm.weight");
  w.wgate = matrix(layout, base, "mlp.gate_proj.weight");
  w.wup = matrix(layout, base, "mlp.up_proj.weight");
  w.wdown = matrix(layout, base, "mlp.down_proj.weight");
  w.bgate = f32_or_null(layout, base, "mlp.gate_proj.bias");
  w.bup = f32_or_null(layout, base, "mlp.up_proj.bias");
  w.bdown = f32_or_null(layout, base, "mlp.down_proj.bias");
  return w;
}

BlockGrads BlockGrads::bind(const SlabLayout& layout, void* base_ptr) {
  auto* base = static_cast<uint8_t*>(base_ptr);
  BlockGrads g;
  g.ln1 = grad_required(layout, base, "input_layernorm.weight");
  g.wq = grad_required(layout, base, "self_attn.q_proj.weight");
  g.wk = grad_required(layout, base, "self_attn.k_proj.weight");
  g.wv = grad_required(layout, base, "self_attn.v_proj.weight");
  g.wo = grad_required(layout, base, "self_attn.o_proj.weight");
  g.bq = grad_or_null(layout, base, "self_attn.q_proj.bias");
  g.bk = grad_or_null(layout, base, "self_attn.k_proj.bias");
  g.bv = grad_or_null(layout, base, "self_attn.v_proj.bias");
  g.bo = grad_or_null(layout, base, "self_attn.o_proj.bias");
  g.q_norm = grad_or_null(layout, base, "self_attn.q_norm.weight");
  g.k_norm = grad_or_null(layout, base, "self_attn.k_norm.weight");
  g.ln2 = grad_required(layout, base, "post_attention_layernorm.weight");
  g.wgate = grad_required(layout, base, "mlp.gate_proj.weight");
  g.wup = grad_required(layout, base, "mlp.up_proj.weight");
  g.wdown = grad_required(layout, base, "mlp.down_proj.weight");
  g.bgate = grad_or_null(layout, base, "mlp.gate_proj.bias");
  g.bup = grad_or_null(layout, base, "mlp.up_proj.bias");
  g.bdown = grad_or_null(layout, base, "mlp.down_proj.bias");
  return g;
}

// Every sub-buffer starts 64-byte aligned (16 floats) so vector loads never straddle.
namespace {
struct Carver {
  float* base;
  size_t used = 0;
  float* take(int64_t n) {
    float* p = base ? base + used : nullptr;
    used += (size_t(n) + 15) / 16 * 16;
    return p;
  }
};
}  // namespace

static BlockActs carve_acts(Carver& c, const BlockShape& s) {
  const int64_t N = s.N();
  BlockActs a{};
  a.n1 = c.take(N * s.C);
  a.rstd1 = c.take(N);
  a.q = c.take(N * s.QD());
  a.k = c.take(N * s.KVD());
  a.v = c.take(N * s.KVD());
  if (s.qk_norm) {
    a.q_raw = c.take(N * s.QD());
    a.k_raw = c.take(N * s.KVD());
    a.q_rstd = c.take(N * s.Hq);
    a.k_rstd = c.take(N * s.Hkv);
  }
  a.att = c.take(N * s.QD());
  a.lse = c.take(s.B * s.Hq * s.T);
  a.x_mid = c.take(N * s.C);
  a.n2 = c.take(N * s.C);
  a.rstd2 = c.take(N);
  a.gate = c.take(N * s.I);
  a.up = c.take(N * s.I);
  a.h = c.take(N * s.I);
  return a;
}

size_t BlockActs::floats(const BlockShape& s) {
  Carver c{nullptr};
  carve_acts(c, s);
  return c.used;
}

BlockActs BlockActs::bind(float* buffer, const BlockShape& s) {
  Carver c{buffer};
  return carve_acts(c, s);
}

static BlockScratch carve_scratch(Carver& c, const BlockShape& s) {
  const int64_t N = s.N();
  BlockScratch b{};
  b.dn = c.take(N * s.C);
  b.dtmp = c.take(N * s.C);
  b.dh = c.take(N * s.I);
  b.dgate = c.take(N * s.I);
  b.dup = c.take(N * s.I);
  b.dx_mid = c.take(N * s.C);
  b.datt = c.take(N * s.QD());
  b.dq = c.take(N * s.QD());
  b.dk = c.take(N * s.KVD());
  b.dv = c.take(N * s.KVD());
  if (s.qk_norm) {
    b.dq_raw = c.take(N * s.QD());
    b.dk_raw = c.take(N * s.KVD());
  }
  return b;
}

size_t BlockScratch::floats(const BlockShape& s) {
  Carver c{nullptr};
  carve_scratch(c, s);
  return c.used;
}

BlockScratch BlockScratch::bind(float* buffer, const BlockShape& s) {
  Carver c{buffer};
  return carve_scratch(c, s);
}

void block_forward(float* x_out, BlockActs& a, const float* x_in, const BlockView& w, const TokenInfo& tok,
                   const BlockShape& s) {
  const int64_t N = s.N(), C = s.C, QD = s.QD(), KVD = s.KVD(), I = s.I;
  // Attention half.
  rmsnorm_forward(a.n1, a.rstd1, x_in, w.ln1, N, C, s.eps);
  if (s.qk_norm) {
    linear_forward(a.q_raw, a.n1, w.wq, w.bq, N, C, QD);
    linear_forward(a.k_raw, a.n1, w.wk, w.bk, N, C, KVD);
    rmsnorm_forward(a.q, a.q_rstd, a.q_raw, w.q_norm, N * s.Hq, s.D, s.eps);  // per head: rows N*Hq of D
    rmsnorm_forward(a.k, a.k_rstd, a.k_raw, w.k_norm, N * s.Hkv, s.D, s.eps);
  } else {
    linear_forward(a.q, a.n1, w.wq, w.bq, N, C, QD);
    linear_forward(a.k, a.n1, w.wk, w.bk, N, C, KVD);
  }
  linear_forward(a.v, a.n1, w.wv, w.bv, N, C, KVD);
  rope_forward(a.q, tok.pos, N, s.Hq, s.D, s.rope_theta);
  rope_forward(a.k, tok.pos, N, s.Hkv, s.D, s.rope_theta);
  attention_forward(a.att, a.lse, a.q, a.k, a.v, tok.doc_ids, AttentionShape{s.B, s.T, s.Hq, s.Hkv, s.D});
  linear_forward(x_out, a.att, w.wo, w.bo, N, QD, C);  // x_out holds o_proj(att) for a moment
  add(a.x_mid, x_in, x_out, N * C);
  // MLP half.
  rmsnorm_forward(a.n2, a.rstd2, a.x_mid, w.ln2, N, C, s.eps);
  linear_forward(a.gate, a.n2, w.wgate, w.bgate, N, C, I);
  linear_forward(a.up, a.n2, w.wup, w.bup, N, C, I);
  swiglu_forward(a.h, a.gate, a.up, N * I);
  linear_forward(x_out, a.h, w.wdown, w.bdown, N, I, C);
  add_inplace(x_out, a.x_mid, N * C);
}

void block_backward(float* dx_in, BlockGrads& g, BlockScratch& b, const float* dx_out, const float* x_in,
                    const BlockActs& a, const BlockView& w, const TokenInfo& tok, const BlockShape& s) {
  block_backward_mlp(g, b, dx_out, a, w, s);
  block_backward_attention(dx_in, g, b, x_in, a, w, tok, s);
}

void block_backward_mlp(BlockGrads& g, BlockScratch& b, const float* dx_out, const BlockActs& a, const BlockView& w,
                        const BlockShape& s) {
  const int64_t N = s.N(), C = s.C, I = s.I;
  // x_out = x_mid + down(h).
  linear_backward(b.dh, g.wdown, g.bdown, dx_out, a.h, w.wdown, N, I, C);
  swiglu_backward(b.dgate, b.dup, b.dh, a.gate, a.up, N * I);
  linear_backward(b.dn, g.wgate, g.bgate, b.dgate, a.n2, w.wgate, N, C, I);
  linear_backward(b.dtmp, g.wup, g.bup, b.dup, a.n2, w.wup, N, C, I);
  add_inplace(b.dn, b.dtmp, N * C);
  rmsnorm_backward(b.dx_mid, g.ln2, b.dn, a.x_mid, w.ln2, a.rstd2, N, C);
  add_inplace(b.dx_mid, dx_out, N * C);
}

void block_backward_attention(float* dx_in, BlockGrads& g, BlockScratch& b, const float* x_in, const BlockActs& a,
                              const BlockView& w, const TokenInfo& tok, const BlockShape& s) {
  const int64_t N = s.N(), C = s.C, QD = s.QD(), KVD = s.KVD();
  // x_mid = x_in + o(att), from dx_mid (the MLP half's).
  linear_backward(b.datt, g.wo, g.bo, b.dx_mid, a.att, w.wo, N, QD, C);
  attention_backward(b.dq, b.dk, b.dv, b.datt, a.att, a.lse, a.q, a.k, a.v, tok.doc_ids,
                     AttentionShape{s.B, s.T, s.Hq, s.Hkv, s.D});
  rope_backward(b.dq, tok.pos, N, s.Hq, s.D, s.rope_theta);
  rope_backward(b.dk, tok.pos, N, s.Hkv, s.D, s.rope_theta);
  const float* dq_proj = b.dq;
  const float* dk_proj = b.dk;
  if (s.qk_norm) {
    rmsnorm_backward(b.dq_raw, g.q_norm, b.dq, a.q_raw, w.q_norm, a.q_rstd, N * s.Hq, s.D);
    rmsnorm_backward(b.dk_raw, g.k_norm, b.dk, a.k_raw, w.k_norm, a.k_rstd, N * s.Hkv, s.D);
    dq_proj = b.dq_raw;
    dk_proj = b.dk_raw;
  }
  linear_backward(b.dn, g.wq, g.bq, dq_proj, a.n1, w.wq, N, C, QD);
  linear_backward(b.dtmp, g.wk, g.bk, dk_proj, a.n1, w.wk, N, C, KVD);
  add_inplace(b.dn, b.dtmp, N * C);
  linear_backward(b.dtmp, g.wv, g.bv, b.dv, a.n1, w.wv, N, C, KVD);
  add_inplace(b.dn, b.dtmp, N * C);
  rmsnorm_backward(dx_in, g.ln1, b.dn, x_in, w.ln1, a.rstd1, N, C);
  add_inplace(dx_in, b.dx_mid, N * C);
}

}  // namespace lt
