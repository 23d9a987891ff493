#include "model/lora.h"

#include <vector>

#include "core/error.h"
#include "core/dtype.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/gemm.h"

namespace lt {
namespace {

// The calling thread's temporaries, grown as needed (the CPU block's; a layer's adapters run one after another).
struct Scratch {
  std::vector<float> xd, u, du, dxd;
  std::vector<bf16_t> xb, ub, dyb, dub;
};
thread_local Scratch scratch;

template <typename T>
T* take(std::vector<T>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
  return v.data();
}

// drop(in) [N, in_f] into `buf` (kept elements × 1 / (1 - p), as torch.nn.Dropout scales), or `in` itself at p = 0.
const float* dropped(const float* in, const LoraShape& s, LoraSite site, int64_t N, int64_t in_f,
                     std::vector<float>& buf) {
  if (s.dropout == 0) return in;
  float* xd = take(buf, N * in_f);
  const float keep_scale = 1.0f / (1.0f - s.dropout);
  parallel_for(N, [&](int64_t n) {
    const uint64_t row = uint64_t(site.row(n)) * uint64_t(in_f);
    for (int64_t i = 0; i < in_f; ++i)
      xd[n * in_f + i] = lora_keep(site.key, row + uint64_t(i), s.dropout) ? in[n * in_f + i] * keep_scale : 0.0f;
  });
  return xd;
}

// An activation as a GEMM operand against weight `w`: itself (f32), or rounded to bf16 into `buf` (bf16 weights),
// as every linear reads its input (ops/linear.h).
const void* operand(const float* x, int64_t n, const WeightRef& w, std::vector<bf16_t>& buf) {
  if (w.dtype != DType::bf16) return x;
  bf16_t* b = take(buf, n);
  parallel_chunks(n, 1 << 16, [&](int64_t i0, int64_t i1) { convert_f32_to_bf16(b + i0, x + i0, size_t(i1 - i0)); });
  return b;
}

// C[M, N] (+)= op(A) · op(B) with A an operand from `operand` and B the weight `w`, in the weight's dtype.
void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const void* a, int64_t lda, const WeightRef& w,
          int64_t ldb, float* c, int64_t ldc, Accumulate acc) {
  if (w.dtype == DType::bf16)
    gemm_bf16(ta, tb, M, N, K, static_cast<const bf16_t*>(a), lda, w.bf16(), ldb, c, ldc, acc);
  else
    gemm_f32(ta, tb, M, N, K, static_cast<const float*>(a), lda, w.f32(), ldb, c, ldc, acc);
}
// The same with both operands activations (a weight gradient): `like` says their dtype.
void gemm_acts(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const void* a, int64_t lda, const void* b,
               int64_t ldb, float* c, int64_t ldc, const WeightRef& like) {
  if (like.dtype == DType::bf16)
    gemm_bf16(ta, tb, M, N, K, static_cast<const bf16_t*>(a), lda, static_cast<const bf16_t*>(b), ldb, c, ldc,
              Accumulate::yes);
  else
    gemm_f32(ta, tb, M, N, K, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb, c, ldc,
             Accumulate::yes);
}

// u_s = s · (drop(x) · Aᵀ) [N, r] into sc.u, and the GEMM operands of drop(x) (returned) and of u_s (sc.ub / sc.u).
struct Down {
  const float* xd;
  const void* xop;  // drop(x) as A's operand
  const void* uop;  // u_s as B's operand
};
Down down_project(const float* in, const LoraView& l, const LoraShape& s, LoraSite site, int64_t N, int64_t in_f,
                  Scratch& sc) {
  Down d;
  d.xd = dropped(in, s, site, N, in_f, sc.xd);
  d.xop = operand(d.xd, N * in_f, l.A, sc.xb);
  float* u = take(sc.u, N * s.rank);
  gemm(Trans::no, Trans::yes, N, s.rank, in_f, d.xop, in_f, l.A, in_f, u, s.rank, Accumulate::no);
  const float scale = s.scale;
  for (int64_t i = 0; i < N * s.rank; ++i) u[i] *= scale;
  d.uop = operand(u, N * s.rank, l.B, sc.ub);
  return d;
}
}  // namespace

const char* adapted_entry(Adapted a) {
  static const char* const names[kAdapted] = {
      "self_attn.q_proj",      "self_attn.k_proj",    "self_attn.v_proj",    "self_attn.o_proj",
      "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.in_proj_a",
      "linear_attn.out_proj",  "mlp.gate_proj",       "mlp.up_proj",         "mlp.down_proj",
      "mlp.gate",              "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
      "mlp.shared_expert.down_proj", "mlp.shared_expert_gate"};
  LT_CHECK(int(a) < kAdapted, "adapted_entry: no linear {}", int(a));
  return names[int(a)];
}

std::string expert_entry(int64_t expert, Adapted a) {
  LT_CHECK(a == Adapted::gate_proj || a == Adapted::up_proj || a == Adapted::down_proj,
           "expert_entry: an expert has gate_proj, up_proj and down_proj, not {}", adapted_entry(a));
  const std::string linear = adapted_entry(a);  // "mlp.gate_proj"
  return "mlp.experts." + std::to_string(expert) + linear.substr(3);
}

uint64_t lora_site_key(uint64_t batch_key, int64_t layer, Adapted a) {
  static_assert(kAdapted < 32, "lora_site_key keys 32 linears a layer");
  return splitmix64(batch_key ^ splitmix64(uint64_t(layer) * 32 + uint64_t(a) + 1));
}

uint64_t lora_expert_key(uint64_t site_key, int64_t expert) {
  return splitmix64(site_key ^ splitmix64(~uint64_t(expert)));
}

uint64_t lora_batch_key(uint64_t seed, int64_t step, int64_t micro) {
  return splitmix64(splitmix64(seed ^ 0x4c6f5241ull) ^ splitmix64(uint64_t(step) << 20 ^ uint64_t(micro)));
}

void lora_forward(float* out, const float* in, const LoraView& l, const LoraShape& s, LoraSite site, int64_t N,
                  int64_t in_f, int64_t out_f) {
  if (!l.present() || N == 0) return;
  LT_CHECK(s.rank > 0, "lora_forward: an adapter but no rank in the block's shape");
  Scratch& sc = scratch;
  const Down d = down_project(in, l, s, site, N, in_f, sc);
  // out[N, out] += u_s · Bᵀ: the scale is folded into u, the update accumulated by the GEMM (no [N, out] temporary).
  gemm(Trans::no, Trans::yes, N, out_f, s.rank, d.uop, s.rank, l.B, s.rank, out, out_f, Accumulate::yes);
}

void lora_backward(float* din, const LoraGrads& g, const float* dout, const float* in, const LoraView& l,
                   const LoraShape& s, LoraSite site, int64_t N, int64_t in_f, int64_t out_f) {
  if (!l.present() || N == 0) return;
  Scratch& sc = scratch;
  const Down d = down_project(in, l, s, site, N, in_f, sc);  // u_s again: the forward's bits
  const int64_t r = s.rank;
  const void* dy = operand(dout, N * out_f, l.B, sc.dyb);
  // du = s · (dy · B) [N, r]; dB += dyᵀ · u_s, token slices of kTokenSlice in order (ops/linear.h: a chunked MLP
  // gives the same bits).
  float* du = take(sc.du, N * r);
  gemm(Trans::no, Trans::no, N, r, out_f, dy, out_f, l.B, r, du, r, Accumulate::no);
  const float scale = s.scale;
  for (int64_t i = 0; i < N * r; ++i) du[i] *= scale;
  const size_t esize = l.B.dtype == DType::bf16 ? 2 : 4;
  for (int64_t t0 = 0; g.B && t0 < N; t0 += kTokenSlice)
    gemm_acts(Trans::yes, Trans::no, out_f, r, std::min(kTokenSlice, N - t0),
              static_cast<const uint8_t*>(dy) + size_t(t0 * out_f) * esize, out_f,
              static_cast<const uint8_t*>(d.uop) + size_t(t0 * r) * esize, r, g.B, r, l.B);
  // dA += duᵀ · drop(x) by token slices; din += du · A (masked and scaled as the dropout was).
  const void* duop = operand(du, N * r, l.A, sc.dub);
  for (int64_t t0 = 0; g.A && t0 < N; t0 += kTokenSlice)
    gemm_acts(Trans::yes, Trans::no, r, in_f, std::min(kTokenSlice, N - t0),
              static_cast<const uint8_t*>(duop) + size_t(t0 * r) * esize, r,
              static_cast<const uint8_t*>(d.xop) + size_t(t0 * in_f) * esize, in_f, g.A, in_f, l.A);
  if (!din) return;
  if (s.dropout == 0) {
    gemm(Trans::no, Trans::no, N, in_f, r, duop, r, l.A, in_f, din, in_f, Accumulate::yes);
    return;
  }
  float* dxd = take(sc.dxd, N * in_f);
  gemm(Trans::no, Trans::no, N, in_f, r, duop, r, l.A, in_f, dxd, in_f, Accumulate::no);
  const float keep_scale = 1.0f / (1.0f - s.dropout);
  parallel_for(N, [&](int64_t n) {
    const uint64_t row = uint64_t(site.row(n)) * uint64_t(in_f);
    for (int64_t i = 0; i < in_f; ++i)
      if (lora_keep(site.key, row + uint64_t(i), s.dropout)) din[n * in_f + i] += dxd[n * in_f + i] * keep_scale;
  });
}

void adapted_forward(float* out, const float* in, WeightRef W, const float* bias, const LoraView& l,
                     const LoraShape& s, LoraSite site, int64_t N, int64_t in_f, int64_t out_f) {
  linear_forward(out, in, W, bias, N, in_f, out_f);
  lora_forward(out, in, l, s, site, N, in_f, out_f);
}

void adapted_backward(float* din, float* dW, float* dbias, const LoraGrads& g, const float* dout, const float* in,
                      WeightRef W, const LoraView& l, const LoraShape& s, LoraSite site, int64_t N, int64_t in_f,
                      int64_t out_f) {
  linear_backward(din, dW, dbias, dout, in, W, N, in_f, out_f);
  lora_backward(din, g, dout, in, l, s, site, N, in_f, out_f);
}

}  // namespace lt
