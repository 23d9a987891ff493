#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/aligned.h"
#include "core/error.h"
#include "model/block.h"
#include "ops/ops.h"

namespace lt {
namespace {

// One layer's cache. Full attention: keys and values for every position so far, [T_max, Hkv, D] each. Gated
// DeltaNet: the conv's last K-1 inputs [K-1, Dc] and the delta rule's state [Hv, dk, dv].
struct LayerCache {
  std::vector<float> k, v;
  std::vector<float> conv, state;
};

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

// A norm's weight as the model multiplies by: as stored, or 1 + w for Qwen3.5's zero-centred norms.
const float* norm_weight(const float* w, int64_t n, bool zero_centred, std::vector<float>& shifted) {
  if (!zero_centred || w == nullptr) return w;
  shifted.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) shifted[size_t(i)] = 1.0f + w[i];
  return shifted.data();
}

// The head on one hidden state: final norm, lm_head, argmax.
int32_t next_token(const ModelSlabs& params, const float* x, std::vector<float>& scratch) {
  const ModelConfig& cfg = params.config();
  const int64_t C = cfg.hidden_size, V = cfg.vocab_size;
  scratch.resize(size_t(C + V + 1));
  float* xn = scratch.data();
  float* logits = xn + C;
  float rstd;
  std::vector<float> shifted;
  const float* w = norm_weight(params.tensor(SlabKind::head, 0, "norm.weight").ptr<float>(), C,
                               cfg.zero_centred_norms, shifted);
  rmsnorm_forward(xn, &rstd, x, w, 1, C, float(cfg.rms_norm_eps));
  TensorView lm = params.lm_head();
  linear_forward(logits, xn, WeightRef{lm.data, lm.dtype}, nullptr, 1, C, V);
  return argmax(logits, V);
}

DeltaShape one_token(const DeltaMixerShape& m) {
  return DeltaShape{1, 1, m.Hk, m.Hv, m.dk, m.dv, float(1.0 / std::sqrt(double(m.dk))), 2 * m.key_dim(),
                    2 * m.key_dim(), m.conv_dim()};
}

// The Gated DeltaNet cache after the prompt's P tokens, from the prefill's internals: the conv's last K-1 inputs,
// and the state by the recurrence over the prompt (the prefill's chunked form gives the outputs, not the state).
void fill_delta_cache(LayerCache& c, const DeltaMixerActs& a, const DeltaMixerShape& m, int64_t P) {
  const int64_t Dc = m.conv_dim(), KD = m.key_dim();
  c.conv.assign(size_t((m.K - 1) * Dc), 0.f);
  for (int64_t r = 0; r < m.K - 1; ++r) {
    const int64_t t = P - (m.K - 1) + r;
    if (t >= 0) std::memcpy(&c.conv[size_t(r * Dc)], a.qkv_pre + t * Dc, size_t(Dc) * 4);
  }
  c.state.assign(size_t(m.Hv * m.dk * m.dv), 0.f);
  std::vector<float> o(static_cast<size_t>(m.value_dim()));
  const DeltaShape s = one_token(m);
  for (int64_t t = 0; t < P; ++t)
    gated_delta_step(o.data(), c.state.data(), a.qk_hat + t * 2 * KD, a.qk_hat + t * 2 * KD + KD,
                     a.qkv + t * Dc + 2 * KD, a.beta + t * m.Hv, a.g + t * m.Hv, s);
}

// One token through a Gated DeltaNet mixer on its cache: out[C] from n1[C] (model/delta_mixer.h's steps).
void delta_mixer_step(float* out, LayerCache& c, const float* n1, const DeltaMixerView& w, const DeltaMixerShape& m) {
  const int64_t C = m.C, Dc = m.conv_dim(), KD = m.key_dim(), VD = m.value_dim(), K = m.K;
  // The conv over the cached K-1 inputs and this one: rows [K, Dc] as one document, the last row's output.
  auto vec = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  auto rows = vec(K * Dc), conv_out = vec(K * Dc), qk = vec(2 * KD), rnorm = vec(2 * m.Hk);
  std::copy(c.conv.begin(), c.conv.end(), rows.begin());
  linear_forward(&rows[size_t((K - 1) * Dc)], n1, w.in_qkv, nullptr, 1, C, Dc);
  short_conv_forward(conv_out.data(), rows.data(), w.conv, /*doc_ids=*/nullptr, K, K, Dc, K);
  std::copy(rows.begin() + Dc, rows.end(), c.conv.begin());
  const float* qkv = &conv_out[size_t((K - 1) * Dc)];
  l2norm_forward(qk.data(), rnorm.data(), qkv, 1, m.Hk, m.dk, 2 * KD, Dc, 1e-6f);
  l2norm_forward(qk.data() + KD, rnorm.data() + m.Hk, qkv + KD, 1, m.Hk, m.dk, 2 * KD, Dc, 1e-6f);
  auto z = vec(VD), o = vec(VD), y = vec(VD), ba = vec(4 * m.Hv), rstd = vec(m.Hv);
  float *b = ba.data(), *a = b + m.Hv, *beta = a + m.Hv, *g = beta + m.Hv;
  linear_forward(z.data(), n1, w.in_z, nullptr, 1, C, VD);
  linear_forward(b, n1, w.in_b, nullptr, 1, C, m.Hv);
  linear_forward(a, n1, w.in_a, nullptr, 1, C, m.Hv);
  delta_gates_forward(beta, g, b, a, w.A_log, w.dt_bias, 1, m.Hv);
  gated_delta_step(o.data(), c.state.data(), qk.data(), qk.data() + KD, qkv + 2 * KD, beta, g, one_token(m));
  gated_rmsnorm_forward(y.data(), rstd.data(), o.data(), z.data(), w.norm, m.Hv, m.dv, m.eps);
  linear_forward(out, y.data(), w.out, nullptr, 1, VD, C);
}

// Attention of one token at position t over the cached keys and values of positions 0..t (its own stored first):
// softmax(q·K / sqrt(D)) · V per query head, k and v [Hkv, D], q and att [Hq, D]. GPT-OSS: a sliding layer sees the
// last `s.window` positions (t − W < j <= t, ops/attention.h), and a head's sink logit joins its softmax's
// denominator (sinks [Hq], or null).
void cached_attention(float* att, const float* q, const float* k, const float* v, LayerCache& c, int64_t t,
                      const BlockShape& s, const float* sinks) {
  const int64_t Hq = s.Hq, Hkv = s.Hkv, D = s.D, KVD = s.KVD();
  std::memcpy(c.k.data() + t * KVD, k, size_t(KVD) * 4);
  std::memcpy(c.v.data() + t * KVD, v, size_t(KVD) * 4);
  const int64_t j0 = s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
  std::vector<float> scores(static_cast<size_t>(t + 1));
  const float scale = 1.0f / std::sqrt(float(D));
  for (int64_t hq = 0; hq < Hq; ++hq) {
    const int64_t hk = hq / (Hq / Hkv);
    const float* qh = q + hq * D;
    float m = sinks ? sinks[hq] : -INFINITY;
    for (int64_t j = j0; j <= t; ++j) {
      const float* kj = c.k.data() + j * KVD + hk * D;
      float sdot = 0;
      for (int64_t d = 0; d < D; ++d) sdot += qh[d] * kj[d];
      scores[size_t(j)] = sdot * scale;
      m = std::max(m, scores[size_t(j)]);
    }
    float sum = sinks ? std::exp(sinks[hq] - m) : 0.0f;
    for (int64_t j = j0; j <= t; ++j) sum += (scores[size_t(j)] = std::exp(scores[size_t(j)] - m));
    float* oh = att + hq * D;
    std::fill(oh, oh + D, 0.f);
    for (int64_t j = j0; j <= t; ++j) {
      const float pj = scores[size_t(j)] / sum;
      const float* vj = c.v.data() + j * KVD + hk * D;
      for (int64_t d = 0; d < D; ++d) oh[d] += pj * vj[d];
    }
  }
}

// The whole prompt through the training kernels, each layer's cache filled from its internals; x [Pp, C] ends as the
// last layer's output. The prompt is padded to a multiple of 64 tokens: causality keeps the padding from touching
// the prompt's positions, and a few lengths mean a few GEMM shapes (oneDNN builds a kernel per shape).
std::vector<float> prefill(const ModelSlabs& params, const std::vector<int32_t>& prompt, int64_t T_max,
                           std::vector<LayerCache>& cache) {
  const ModelConfig& cfg = params.config();
  const int64_t L = cfg.num_layers, C = cfg.hidden_size, P = int64_t(prompt.size());
  const int64_t Pp = (P + 63) / 64 * 64;
  std::vector<int32_t> padded = prompt;
  padded.resize(size_t(Pp), 0);
  BlockShape sp = BlockShape::make(cfg, 1, Pp);
  sp.lora.dropout = 0;  // inference: LoRA's dropout off
  std::vector<float> x(static_cast<size_t>(Pp * C)), y(static_cast<size_t>(Pp * C));
  std::vector<int32_t> pos(static_cast<size_t>(Pp));
  for (int64_t t = 0; t < Pp; ++t) pos[size_t(t)] = int32_t(t);
  embedding_forward(x.data(), padded.data(), params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>(),
                    Pp, C, cfg.vocab_size);
  size_t working = 0;
  for (int64_t l = 0; l < L; ++l) working = std::max(working, WorkingCopy::floats(sp.for_layer(cfg, l)));
  AlignedBuffer<float> working_copy(working, 64, Fill::none);
  for (int64_t l = 0; l < L; ++l) {
    const BlockShape sl = sp.for_layer(cfg, l);
    WorkingCopy a = WorkingCopy::bind(working_copy.data(), sl);
    block_forward(y.data(), a, x.data(), BlockView::bind(params.layout(SlabKind::layer, l), params.layer(l)),
                  TokenInfo{pos.data(), nullptr}, sl);
    LayerCache& c = cache[size_t(l)];
    if (sl.linear()) {
      fill_delta_cache(c, a.delta, sl.mixer(), P);
    } else {
      const int64_t KVD = sl.KVD();
      c.k.assign(size_t(T_max * KVD), 0.f);
      c.v.assign(size_t(T_max * KVD), 0.f);
      std::memcpy(c.k.data(), a.k, size_t(P * KVD) * 4);
      std::memcpy(c.v.data(), a.v, size_t(P * KVD) * 4);
    }
    std::swap(x, y);
  }
  return x;
}

}  // namespace

std::vector<int32_t> generate_greedy(const ModelSlabs& params, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& o) {
  const ModelConfig& cfg = params.config();
  LT_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  const int64_t L = cfg.num_layers, C = cfg.hidden_size, P = int64_t(prompt.size());
  const float* table = params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>();
  std::vector<LayerCache> cache(static_cast<size_t>(L));
  const std::vector<float> x = prefill(params, prompt, P + o.max_new_tokens, cache);
  std::vector<float> head_scratch;
  std::vector<int32_t> out;
  int32_t tok = next_token(params, x.data() + (P - 1) * C, head_scratch);

  // Decode: one token at a time, each layer the block's own composition on one row with its mixer on the cache.
  BlockShape s1 = BlockShape::make(cfg, 1, 1);
  s1.lora.dropout = 0;
  size_t working = 0;
  for (int64_t l = 0; l < L; ++l) working = std::max(working, WorkingCopy::floats(s1.for_layer(cfg, l)));
  AlignedBuffer<float> working_copy(working, 64, Fill::none);
  std::vector<float> h(static_cast<size_t>(C)), h_next(static_cast<size_t>(C));
  for (int64_t t = P;; ++t) {
    out.push_back(tok);
    bool stop = false;
    for (int32_t s : o.stop_ids) stop |= tok == s;
    if (stop || int64_t(out.size()) >= o.max_new_tokens) break;
    embedding_forward(h.data(), &tok, table, 1, C, cfg.vocab_size);
    const int32_t p = int32_t(t);
    for (int64_t l = 0; l < L; ++l) {
      const BlockShape sl = s1.for_layer(cfg, l);
      const BlockView w = BlockView::bind(params.layout(SlabKind::layer, l), params.layer(l));
      LayerCache& c = cache[size_t(l)];
      MixerOverride mixer;
      mixer.attention = [&](float* att, const float* q, const float* k, const float* v) {
        cached_attention(att, q, k, v, c, t, sl, w.sinks);
      };
      mixer.linear = [&](float* out_c, const float* n1) { delta_mixer_step(out_c, c, n1, w.delta, sl.mixer()); };
      WorkingCopy a = WorkingCopy::bind(working_copy.data(), sl);
      block_forward_with(h_next.data(), a, h.data(), w, TokenInfo{&p, nullptr}, sl, mixer);
      std::swap(h, h_next);
    }
    tok = next_token(params, h.data(), head_scratch);
  }
  return out;
}

}  // namespace lt
