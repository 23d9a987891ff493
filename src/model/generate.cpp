#include "model/generate.h"

#include <cmath>
#include <cstring>

#include "core/aligned.h"
#include "core/error.h"
#include "model/block.h"
#include "ops/ops.h"

namespace lt {
namespace {

// Keys and values of one layer for every position so far: [T_max, Hkv, D] each.
struct LayerCache {
  std::vector<float> k, v;
};

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

// The head on one hidden state: final norm, lm_head, argmax.
int32_t next_token(const ModelSlabs& params, const float* x, std::vector<float>& scratch) {
  const ModelConfig& cfg = params.config();
  const int64_t C = cfg.hidden_size, V = cfg.vocab_size;
  scratch.resize(size_t(C + V + 1));
  float* xn = scratch.data();
  float* logits = xn + C;
  float rstd;
  rmsnorm_forward(xn, &rstd, x, params.tensor(SlabKind::head, 0, "norm.weight").ptr<float>(), 1, C,
                  float(cfg.rms_norm_eps));
  TensorView lm = params.lm_head();
  linear_forward(logits, xn, WeightRef{lm.data, lm.dtype}, nullptr, 1, C, V);
  return argmax(logits, V);
}

}  // namespace

std::vector<int32_t> generate_greedy(const ModelSlabs& params, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& o) {
  const ModelConfig& cfg = params.config();
  LT_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  check_uniform_layers(cfg, "generation (model/generate.cpp: no conv / delta-rule state cache yet)");
  const int64_t L = cfg.num_layers, C = cfg.hidden_size, P = int64_t(prompt.size());
  const int64_t T_max = P + o.max_new_tokens;
  const BlockShape s1 = BlockShape::make(cfg, 1, 1);
  const int64_t Hq = s1.Hq, Hkv = s1.Hkv, D = s1.D, KVD = s1.KVD(), QD = s1.QD(), I = s1.I;
  const SlabLayout& layout = params.layout(SlabKind::layer);
  const float* table = params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>();

  // --- prefill: the whole prompt through the training kernels, keeping k and v ---
  // The prompt is padded to a multiple of 64 tokens: causal attention keeps the padding from touching
  // the prompt's positions, and a few lengths mean a few GEMM shapes (oneDNN builds a kernel per shape).
  const int64_t Pp = (P + 63) / 64 * 64;
  std::vector<int32_t> padded = prompt;
  padded.resize(size_t(Pp), 0);
  std::vector<LayerCache> cache(static_cast<size_t>(L));
  const BlockShape sp = BlockShape::make(cfg, 1, Pp);
  std::vector<float> x(static_cast<size_t>(Pp * C)), y(static_cast<size_t>(Pp * C));
  std::vector<int32_t> pos(static_cast<size_t>(Pp));
  for (int64_t t = 0; t < Pp; ++t) pos[size_t(t)] = int32_t(t);
  embedding_forward(x.data(), padded.data(), table, Pp, C, cfg.vocab_size);
  AlignedBuffer<float> acts_buf(BlockActs::floats(sp), 64, Fill::none);
  for (int64_t l = 0; l < L; ++l) {
    BlockActs a = BlockActs::bind(acts_buf.data(), sp);
    block_forward(y.data(), a, x.data(), BlockView::bind(layout, params.layer(l)), TokenInfo{pos.data(), nullptr}, sp);
    cache[size_t(l)].k.assign(size_t(T_max * KVD), 0.f);
    cache[size_t(l)].v.assign(size_t(T_max * KVD), 0.f);
    std::memcpy(cache[size_t(l)].k.data(), a.k, size_t(P * KVD) * 4);
    std::memcpy(cache[size_t(l)].v.data(), a.v, size_t(P * KVD) * 4);
    std::swap(x, y);
  }
  std::vector<float> head_scratch;
  std::vector<int32_t> out;
  int32_t tok = next_token(params, x.data() + (P - 1) * C, head_scratch);

  // --- decode: one token at a time against the cache ---
  auto vec = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  auto h = vec(C), n1 = vec(C), q = vec(QD), k = vec(KVD), v = vec(KVD), qn = vec(QD), kn = vec(KVD), att = vec(QD),
       tmp = vec(C), mid = vec(C), n2 = vec(C), gate = vec(I), up = vec(I), hid = vec(I), scores = vec(T_max),
       rs = vec(Hq + Hkv + 2);
  const float scale = 1.0f / std::sqrt(float(D));
  for (int64_t t = P; ; ++t) {
    out.push_back(tok);
    bool stop = false;
    for (int32_t s : o.stop_ids) stop |= tok == s;
    if (stop || int64_t(out.size()) >= o.max_new_tokens) break;
    embedding_forward(h.data(), &tok, table, 1, C, cfg.vocab_size);
    const int32_t p = int32_t(t);
    for (int64_t l = 0; l < L; ++l) {
      BlockView w = BlockView::bind(layout, params.layer(l));
      rmsnorm_forward(n1.data(), &rs[0], h.data(), w.ln1, 1, C, s1.eps);
      linear_forward(q.data(), n1.data(), w.wq, w.bq, 1, C, QD);
      linear_forward(k.data(), n1.data(), w.wk, w.bk, 1, C, KVD);
      linear_forward(v.data(), n1.data(), w.wv, w.bv, 1, C, KVD);
      float* qa = q.data();
      float* ka = k.data();
      if (s1.qk_norm) {
        rmsnorm_forward(qn.data(), &rs[1], q.data(), w.q_norm, Hq, D, s1.eps);
        rmsnorm_forward(kn.data(), &rs[1 + Hq], k.data(), w.k_norm, Hkv, D, s1.eps);
        qa = qn.data();
        ka = kn.data();
      }
      rope_forward(qa, &p, 1, Hq, D, s1.rope_theta);
      rope_forward(ka, &p, 1, Hkv, D, s1.rope_theta);
      LayerCache& c = cache[size_t(l)];
      std::memcpy(c.k.data() + t * KVD, ka, size_t(KVD) * 4);
      std::memcpy(c.v.data() + t * KVD, v.data(), size_t(KVD) * 4);
      for (int64_t hq = 0; hq < Hq; ++hq) {  // softmax(q·K / sqrt(D)) · V over positions 0..t
        const int64_t hk = hq / (Hq / Hkv);
        const float* qh = qa + hq * D;
        float m = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          const float* kj = c.k.data() + j * KVD + hk * D;
          float sdot = 0;
          for (int64_t d = 0; d < D; ++d) sdot += qh[d] * kj[d];
          scores[size_t(j)] = sdot * scale;
          m = std::max(m, scores[size_t(j)]);
        }
        float sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += (scores[size_t(j)] = std::exp(scores[size_t(j)] - m));
        float* oh = att.data() + hq * D;
        std::fill(oh, oh + D, 0.f);
        for (int64_t j = 0; j <= t; ++j) {
          const float pj = scores[size_t(j)] / sum;
          const float* vj = c.v.data() + j * KVD + hk * D;
          for (int64_t d = 0; d < D; ++d) oh[d] += pj * vj[d];
        }
      }
      linear_forward(tmp.data(), att.data(), w.wo, w.bo, 1, QD, C);
      for (int64_t i = 0; i < C; ++i) mid[size_t(i)] = h[size_t(i)] + tmp[size_t(i)];
      rmsnorm_forward(n2.data(), &rs[0], mid.data(), w.ln2, 1, C, s1.eps);
      linear_forward(gate.data(), n2.data(), w.wgate, w.bgate, 1, C, I);
      linear_forward(up.data(), n2.data(), w.wup, w.bup, 1, C, I);
      swiglu_forward(hid.data(), gate.data(), up.data(), I);
      linear_forward(tmp.data(), hid.data(), w.wdown, w.bdown, 1, I, C);
      for (int64_t i = 0; i < C; ++i) h[size_t(i)] = mid[size_t(i)] + tmp[size_t(i)];
    }
    tok = next_token(params, h.data(), head_scratch);
  }
  return out;
}

}  // namespace lt
