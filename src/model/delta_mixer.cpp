// model/delta_mixer.cpp — Gated DeltaNet's token mixer as a list of op calls, forward then backward in reverse.
#include "model/delta_mixer.h"

#include <cmath>

#include "core/error.h"
#include "model/block.h"
#include "ops/ops.h"

namespace lt {

DeltaShape delta_shape(const DeltaMixerShape& s) {
  // q̂ and k̂ are the two halves of qk_hat's rows; v is the last part of the conv output's rows.
  return DeltaShape{s.B,           s.T,           s.Hk,          s.Hv, s.dk, s.dv, float(1.0 / std::sqrt(double(s.dk))),
                    2 * s.key_dim(), 2 * s.key_dim(), s.conv_dim()};
}

namespace {

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// Carves consecutive [rows, cols] f32 blocks out of one buffer (a null buffer only counts).
struct Carver {
  float* base;
  size_t used = 0;
  float* take(int64_t rows, int64_t cols) {
    float* p = base ? base + used : nullptr;
    used += size_t(rows * cols);
    return p;
  }
};

}  // namespace

DeltaMixerShape DeltaMixerShape::make(const ModelConfig& cfg, int64_t B, int64_t T) {
  LT_CHECK(cfg.linear_num_key_heads > 0 && cfg.linear_num_value_heads > 0 && cfg.linear_key_head_dim > 0 &&
               cfg.linear_value_head_dim > 0 && cfg.linear_conv_kernel_dim > 0,
           "model '{}' has no Gated DeltaNet sizes (linear_num_key_heads etc.)", model_type_name(cfg.type));
  return DeltaMixerShape{B,
                         T,
                         cfg.hidden_size,
                         cfg.linear_num_key_heads,
                         cfg.linear_num_value_heads,
                         cfg.linear_key_head_dim,
                         cfg.linear_value_head_dim,
                         cfg.linear_conv_kernel_dim,
                         float(cfg.rms_norm_eps)};
}

DeltaMixerActs DeltaMixerActs::bind(float* buffer, const DeltaMixerShape& s) {
  const int64_t N = s.N();
  Carver c{buffer};
  DeltaMixerActs a{};
  a.qkv_pre = c.take(N, s.conv_dim());
  a.qkv = c.take(N, s.conv_dim());
  a.qk_hat = c.take(N, 2 * s.key_dim());
  a.q_rnorm = c.take(N, s.Hk);
  a.k_rnorm = c.take(N, s.Hk);
  a.z = c.take(N, s.value_dim());
  a.b = c.take(N, s.Hv);
  a.a = c.take(N, s.Hv);
  a.beta = c.take(N, s.Hv);
  a.g = c.take(N, s.Hv);
  a.o = c.take(N, s.value_dim());
  a.rstd = c.take(N, s.Hv);
  a.y = c.take(N, s.value_dim());
  return a;
}

size_t DeltaMixerActs::floats(const DeltaMixerShape& s) {
  Carver c{nullptr};
  const int64_t N = s.N();
  c.take(N, 2 * s.conv_dim() + 2 * s.key_dim() + 2 * s.Hk + 3 * s.value_dim() + 5 * s.Hv);
  return c.used;
}

DeltaMixerScratch DeltaMixerScratch::bind(float* buffer, const DeltaMixerShape& s) {
  const int64_t N = s.N();
  Carver c{buffer};
  DeltaMixerScratch d{};
  d.dn = c.take(N, s.C);
  d.dy = c.take(N, s.value_dim());
  d.d_o = c.take(N, s.value_dim());
  d.dz = c.take(N, s.value_dim());
  d.dqk = c.take(N, 2 * s.key_dim());
  d.dqkv = c.take(N, s.conv_dim());
  d.dpre = c.take(N, s.conv_dim());
  d.dbeta = c.take(N, s.Hv);
  d.dg = c.take(N, s.Hv);
  d.db = c.take(N, s.Hv);
  d.da = c.take(N, s.Hv);
  return d;
}

size_t DeltaMixerScratch::floats(const DeltaMixerShape& s) {
  return size_t(s.N() * (s.C + 3 * s.value_dim() + 2 * s.key_dim() + 2 * s.conv_dim() + 4 * s.Hv));
}

void delta_mixer_forward(float* out, DeltaMixerActs& a, const float* n1, const DeltaMixerView& w,
                         const TokenInfo& tok, const DeltaMixerShape& s, const DeltaMixerStorage* storage) {
  const int64_t N = s.N(), C = s.C, Dc = s.conv_dim(), KD = s.key_dim(), VD = s.value_dim();
  auto keep = [&](float* DeltaMixerActs::*field) {
    if (storage) storage->keep(field, a.*field);
  };
  auto site = [&](Adapted x) {
    return LoraSite{s.lora.dropout > 0 ? lora_site_key(tok.dropout_key, s.layer, x) : 0, 0};
  };
  adapted_forward(a.qkv_pre, n1, w.in_qkv, nullptr, w.lora[Adapted::in_proj_qkv], s.lora, site(Adapted::in_proj_qkv), N,
                  C, Dc);
  keep(&DeltaMixerActs::qkv_pre);
  short_conv_forward(a.qkv, a.qkv_pre, w.conv, tok.doc_ids, N, s.T, Dc, s.K);
  keep(&DeltaMixerActs::qkv);
  l2norm_forward(a.qk_hat, a.q_rnorm, a.qkv, N, s.Hk, s.dk, 2 * KD, Dc, kQkNormEps);
  l2norm_forward(a.qk_hat + KD, a.k_rnorm, a.qkv + KD, N, s.Hk, s.dk, 2 * KD, Dc, kQkNormEps);
  keep(&DeltaMixerActs::qk_hat);
  keep(&DeltaMixerActs::q_rnorm);
  keep(&DeltaMixerActs::k_rnorm);
  adapted_forward(a.z, n1, w.in_z, nullptr, w.lora[Adapted::in_proj_z], s.lora, site(Adapted::in_proj_z), N, C, VD);
  adapted_forward(a.b, n1, w.in_b, nullptr, w.lora[Adapted::in_proj_b], s.lora, site(Adapted::in_proj_b), N, C, s.Hv);
  adapted_forward(a.a, n1, w.in_a, nullptr, w.lora[Adapted::in_proj_a], s.lora, site(Adapted::in_proj_a), N, C, s.Hv);
  keep(&DeltaMixerActs::z);
  keep(&DeltaMixerActs::b);
  keep(&DeltaMixerActs::a);
  delta_gates_forward(a.beta, a.g, a.b, a.a, w.A_log, w.dt_bias, N, s.Hv);
  keep(&DeltaMixerActs::beta);
  keep(&DeltaMixerActs::g);
  gated_delta_forward(a.o, a.qk_hat, a.qk_hat + KD, a.qkv + 2 * KD, a.beta, a.g, tok.doc_ids, delta_shape(s));
  keep(&DeltaMixerActs::o);
  gated_rmsnorm_forward(a.y, a.rstd, a.o, a.z, w.norm, N * s.Hv, s.dv, s.eps);
  keep(&DeltaMixerActs::rstd);
  keep(&DeltaMixerActs::y);
  adapted_forward(out, a.y, w.out, nullptr, w.lora[Adapted::out_proj], s.lora, site(Adapted::out_proj), N, VD, C);
}

void delta_mixer_backward(float* dn1, DeltaMixerGrads& g, DeltaMixerScratch& d, const float* dout,
                          const float* n1, const DeltaMixerActs& a, const DeltaMixerView& w, const TokenInfo& tok,
                          const DeltaMixerShape& s) {
  const int64_t N = s.N(), C = s.C, Dc = s.conv_dim(), KD = s.key_dim(), VD = s.value_dim();
  auto site = [&](Adapted x) {
    return LoraSite{s.lora.dropout > 0 ? lora_site_key(tok.dropout_key, s.layer, x) : 0, 0};
  };
  adapted_backward(d.dy, g.out, nullptr, g.lora[Adapted::out_proj], dout, a.y, w.out, w.lora[Adapted::out_proj], s.lora,
                   site(Adapted::out_proj), N, VD, C);
  gated_rmsnorm_backward(d.d_o, d.dz, g.norm, d.dy, a.o, a.z, w.norm, a.rstd, N * s.Hv, s.dv);
  // dq̂ | dk̂ into dqk; dv straight into its place in the conv output's gradient.
  gated_delta_backward(d.dqk, d.dqk + KD, d.dqkv + 2 * KD, d.dbeta, d.dg, d.d_o, a.qk_hat, a.qk_hat + KD,
                       a.qkv + 2 * KD, a.beta, a.g, tok.doc_ids, delta_shape(s));
  l2norm_backward(d.dqkv, d.dqk, a.qkv, a.q_rnorm, N, s.Hk, s.dk, Dc, 2 * KD, Dc);
  l2norm_backward(d.dqkv + KD, d.dqk + KD, a.qkv + KD, a.k_rnorm, N, s.Hk, s.dk, Dc, 2 * KD, Dc);
  short_conv_backward(d.dpre, g.conv, d.dqkv, a.qkv_pre, w.conv, tok.doc_ids, N, s.T, Dc, s.K);
  delta_gates_backward(d.db, d.da, g.A_log, g.dt_bias, d.dbeta, d.dg, a.b, a.a, w.A_log, w.dt_bias, N, s.Hv);
  // n1 feeds four projections: their input gradients summed in a fixed order (qkv, z, b, a).
  adapted_backward(dn1, g.in_qkv, nullptr, g.lora[Adapted::in_proj_qkv], d.dpre, n1, w.in_qkv,
                   w.lora[Adapted::in_proj_qkv], s.lora, site(Adapted::in_proj_qkv), N, C, Dc);
  adapted_backward(d.dn, g.in_z, nullptr, g.lora[Adapted::in_proj_z], d.dz, n1, w.in_z, w.lora[Adapted::in_proj_z],
                   s.lora, site(Adapted::in_proj_z), N, C, VD);
  add_inplace(dn1, d.dn, N * C);
  adapted_backward(d.dn, g.in_b, nullptr, g.lora[Adapted::in_proj_b], d.db, n1, w.in_b, w.lora[Adapted::in_proj_b],
                   s.lora, site(Adapted::in_proj_b), N, C, s.Hv);
  add_inplace(dn1, d.dn, N * C);
  adapted_backward(d.dn, g.in_a, nullptr, g.lora[Adapted::in_proj_a], d.da, n1, w.in_a, w.lora[Adapted::in_proj_a],
                   s.lora, site(Adapted::in_proj_a), N, C, s.Hv);
  add_inplace(dn1, d.dn, N * C);
}

}  // namespace lt
