#include "model/lora.h"

#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace lt {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The calling thread's temporaries, grown as needed (the CPU block's; a layer's adapters run one after another).
struct Scratch {
  std::vector<float> xd, u, t, du, dxd;
};
thread_local Scratch scratch;

float* take(std::vector<float>& v, int64_t n) {
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
    const uint64_t row = uint64_t(site.row0 + n) * uint64_t(in_f);
    for (int64_t i = 0; i < in_f; ++i)
      xd[n * in_f + i] = lora_keep(site.key, row + uint64_t(i), s.dropout) ? in[n * in_f + i] * keep_scale : 0.0f;
  });
  return xd;
}

}  // namespace

const char* adapted_entry(Adapted a) {
  static const char* const names[kAdapted] = {
      "self_attn.q_proj",      "self_attn.k_proj",    "self_attn.v_proj",    "self_attn.o_proj",
      "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.in_proj_a",
      "linear_attn.out_proj",  "mlp.gate_proj",       "mlp.up_proj",         "mlp.down_proj"};
  LT_CHECK(int(a) < kAdapted, "adapted_entry: no linear {}", int(a));
  return names[int(a)];
}

uint64_t lora_site_key(uint64_t batch_key, int64_t layer, Adapted a) {
  return splitmix64(batch_key ^ splitmix64(uint64_t(layer) * 16 + uint64_t(a) + 1));
}

uint64_t lora_batch_key(uint64_t seed, int64_t step, int64_t micro) {
  return splitmix64(splitmix64(seed ^ 0x4c6f5241ull) ^ splitmix64(uint64_t(step) << 20 ^ uint64_t(micro)));
}

bool lora_keep(uint64_t key, uint64_t index, float p) {
  const uint64_t h = splitmix64(key ^ splitmix64(index));
  return float(double(h >> 40) * 0x1.0p-24) >= p;  // 24 random bits: u in [0, 1) exactly representable in f32
}

void lora_forward(float* out, const float* in, const LoraView& l, const LoraShape& s, LoraSite site, int64_t N,
                  int64_t in_f, int64_t out_f) {
  if (!l.present() || N == 0) return;
  LT_CHECK(s.rank > 0, "lora_forward: an adapter but no rank in the block's shape");
  Scratch& sc = scratch;
  const float* xd = dropped(in, s, site, N, in_f, sc.xd);
  float* u = take(sc.u, N * s.rank);  // [N, r]
  float* t = take(sc.t, N * out_f);   // [N, out]
  linear_forward(u, xd, l.A, nullptr, N, in_f, s.rank);
  linear_forward(t, u, l.B, nullptr, N, s.rank, out_f);
  const float scale = s.scale;
  parallel_for(N, [&](int64_t n) {
    for (int64_t j = 0; j < out_f; ++j) out[n * out_f + j] += scale * t[n * out_f + j];
  });
}

void lora_backward(float* din, const LoraGrads& g, const float* dout, const float* in, const LoraView& l,
                   const LoraShape& s, LoraSite site, int64_t N, int64_t in_f, int64_t out_f) {
  if (!l.present() || N == 0) return;
  Scratch& sc = scratch;
  const float* xd = dropped(in, s, site, N, in_f, sc.xd);
  float* u = take(sc.u, N * s.rank);    // [N, r]: the forward's bits again
  float* dt = take(sc.t, N * out_f);    // [N, out]
  float* du = take(sc.du, N * s.rank);  // [N, r]
  linear_forward(u, xd, l.A, nullptr, N, in_f, s.rank);
  const float scale = s.scale;
  parallel_for(N, [&](int64_t n) {
    for (int64_t j = 0; j < out_f; ++j) dt[n * out_f + j] = scale * dout[n * out_f + j];
  });
  linear_backward(du, g.B, nullptr, dt, u, l.B, N, s.rank, out_f);
  float* dxd = din ? take(sc.dxd, N * in_f) : nullptr;  // [N, in]
  linear_backward(dxd, g.A, nullptr, du, xd, l.A, N, in_f, s.rank);
  if (!din) return;
  const float keep_scale = s.dropout == 0 ? 1.0f : 1.0f / (1.0f - s.dropout);
  parallel_for(N, [&](int64_t n) {
    const uint64_t row = uint64_t(site.row0 + n) * uint64_t(in_f);
    for (int64_t i = 0; i < in_f; ++i) {
      const bool keep = s.dropout == 0 || lora_keep(site.key, row + uint64_t(i), s.dropout);
      if (keep) din[n * in_f + i] += s.dropout == 0 ? dxd[n * in_f + i] : dxd[n * in_f + i] * keep_scale;
    }
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
