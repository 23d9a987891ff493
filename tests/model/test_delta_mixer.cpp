// The Gated DeltaNet token mixer (model/delta_mixer.h): every gradient by finite differences through the whole
// chain of ops (projections, conv, L2 norms, gates, the chunked delta rule, the gated norm), on odd sizes with
// packed documents and a row longer than one chunk; the gradient contract; documents never leak.
//
// Legend: B rows, T tokens per row, N = B·T, C hidden, Hk / Hv key / value heads, dk / dv dims, K conv width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "model/block.h"
#include "model/delta_mixer.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

using testing::grad_check;
using testing::random_vector;
using Vec = std::vector<float>;

struct Mixer {
  DeltaMixerShape s;
  Vec n1, in_qkv, in_z, in_b, in_a, out, conv, dt_bias, A_log, norm, proj;
  std::vector<int32_t> pos, doc_ids;

  Mixer() {
    // T = 70: row 1 crosses a chunk boundary; row 0 packs documents of 30, 1 and 39 tokens.
    s = DeltaMixerShape{2, 70, 24, 2, 4, 6, 5, 4, 1e-6f};
    const int64_t N = s.N();
    n1 = random_vector(size_t(N * s.C), 1);
    const float r = 0.4f;  // projections of O(1) inputs stay O(1)
    in_qkv = random_vector(size_t(s.conv_dim() * s.C), 2, -r, r);
    in_z = random_vector(size_t(s.value_dim() * s.C), 3, -r, r);
    in_b = random_vector(size_t(s.Hv * s.C), 4, -r, r);
    in_a = random_vector(size_t(s.Hv * s.C), 5, -r, r);
    out = random_vector(size_t(s.C * s.value_dim()), 6, -r, r);
    conv = random_vector(size_t(s.conv_dim() * s.K), 7, -0.6f, 0.6f);
    dt_bias = random_vector(size_t(s.Hv), 8, -2.f, 0.f);
    A_log = random_vector(size_t(s.Hv), 9, -1.f, 1.5f);
    norm = random_vector(size_t(s.dv), 10, 0.5f, 1.5f);
    proj = random_vector(size_t(N * s.C), 11);
    pos.resize(size_t(N));
    doc_ids.resize(size_t(N));
    for (int64_t t = 0; t < s.T; ++t) {
      const int32_t doc = t < 30 ? 0 : t < 31 ? 1 : 2;
      const int64_t start = doc == 0 ? 0 : doc == 1 ? 30 : 31;
      pos[size_t(t)] = int32_t(t - start);
      doc_ids[size_t(t)] = doc;
      pos[size_t(s.T + t)] = int32_t(t);
      doc_ids[size_t(s.T + t)] = 0;
    }
  }
  DeltaMixerView view() const {
    return {WeightRef{in_qkv.data()}, WeightRef{in_z.data()}, WeightRef{in_b.data()}, WeightRef{in_a.data()},
            WeightRef{out.data()},    conv.data(),            dt_bias.data(),         A_log.data(),
            norm.data()};
  }
  TokenInfo tok() const { return TokenInfo{pos.data(), doc_ids.data()}; }

  Vec forward(Vec* acts_out = nullptr) const {
    Vec acts(DeltaMixerActs::floats(s)), y(size_t(s.N() * s.C));
    DeltaMixerActs a = DeltaMixerActs::bind(acts.data(), s);
    delta_mixer_forward(y.data(), a, n1.data(), view(), tok(), s);
    if (acts_out) *acts_out = acts;
    return y;
  }
};

struct MixerGrads {
  Vec dn1, in_qkv, in_z, in_b, in_a, out, conv, dt_bias, A_log, norm;
};

MixerGrads backward(const Mixer& m, float prefill = 0.f) {
  Vec acts;
  m.forward(&acts);
  DeltaMixerActs a = DeltaMixerActs::bind(acts.data(), m.s);
  MixerGrads r;
  r.dn1.assign(m.n1.size(), NAN);
  auto fill = [&](Vec& v, size_t n) { v.assign(n, prefill); };
  fill(r.in_qkv, m.in_qkv.size()), fill(r.in_z, m.in_z.size()), fill(r.in_b, m.in_b.size());
  fill(r.in_a, m.in_a.size()), fill(r.out, m.out.size()), fill(r.conv, m.conv.size());
  fill(r.dt_bias, m.dt_bias.size()), fill(r.A_log, m.A_log.size()), fill(r.norm, m.norm.size());
  DeltaMixerGrads g{r.in_qkv.data(), r.in_z.data(),    r.in_b.data(),  r.in_a.data(), r.out.data(),
                    r.conv.data(),   r.dt_bias.data(), r.A_log.data(), r.norm.data()};
  Vec scratch(DeltaMixerScratch::floats(m.s));
  DeltaMixerScratch sc = DeltaMixerScratch::bind(scratch.data(), m.s);
  delta_mixer_backward(r.dn1.data(), g, sc, m.proj.data(), m.n1.data(), a, m.view(), m.tok(), m.s);
  return r;
}

TEST(DeltaMixer, GradientsMatchFiniteDifferences) {
  Mixer m;
  const MixerGrads gr = backward(m);
  auto loss = [&] { return testing::dot(m.forward(), m.proj); };
  // f32 throughout. Measured: the forward's rounding puts ~2e-6 of noise on the loss (|L| ~ 30), i.e. ~2e-6/(2h)
  // on each central difference; and the q/k path is strongly curved (the L2 norm of a short head whose silu
  // outputs are small: FD errors fall as h², 0.057 at h = 1e-2 on one conv weight, 0.005 at 3e-3). So the
  // tensors feeding q and k (n1, in_proj_qkv, conv1d) take h = 2e-3 (truncation ~2e-3, noise ~5e-4), the rest
  // h = 1e-2 (noise ~1e-4, truncation ~4e-4 on dt_bias). Floor 0.1 and bound 1e-2: at most ~1e-3 absolute on a
  // small gradient, while a dropped or mis-signed term gives O(1) (each op's own tests bound its gradients
  // tighter; this one checks the wiring).
  const double bound = 1e-2, floor = 0.1;
  const float h_qk = 2e-3f, h = 1e-2f;
  EXPECT_GRAD_OK(grad_check(m.n1, gr.dn1, loss, 1, 48, h_qk, floor), bound, "dn1");
  EXPECT_GRAD_OK(grad_check(m.in_qkv, gr.in_qkv, loss, 2, 48, h_qk, floor), bound, "in_proj_qkv");
  EXPECT_GRAD_OK(grad_check(m.in_z, gr.in_z, loss, 3, 32, h, floor), bound, "in_proj_z");
  EXPECT_GRAD_OK(grad_check(m.in_b, gr.in_b, loss, 4, 32, h, floor), bound, "in_proj_b");
  EXPECT_GRAD_OK(grad_check(m.in_a, gr.in_a, loss, 5, 32, h, floor), bound, "in_proj_a");
  EXPECT_GRAD_OK(grad_check(m.out, gr.out, loss, 6, 32, h, floor), bound, "out_proj");
  EXPECT_GRAD_OK(grad_check(m.conv, gr.conv, loss, 7, 48, h_qk, floor), bound, "conv1d");
  EXPECT_GRAD_OK(grad_check(m.dt_bias, gr.dt_bias, loss, 8, 4, h, floor), bound, "dt_bias");
  EXPECT_GRAD_OK(grad_check(m.A_log, gr.A_log, loss, 9, 4, h, floor), bound, "A_log");
  EXPECT_GRAD_OK(grad_check(m.norm, gr.norm, loss, 10, 5, h, floor), bound, "norm");
}

TEST(DeltaMixer, ParameterGradientsAccumulate) {
  // Parameter gradients +=: starting from 1 gives 1 + the gradient; the activation gradient is written.
  Mixer m;
  const MixerGrads zero = backward(m, 0.f), one = backward(m, 1.f);
  auto check = [](const Vec& a, const Vec& b, const char* what) {
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(b[i], 1.f + a[i]) << what << " element " << i;
  };
  check(zero.in_qkv, one.in_qkv, "in_proj_qkv");
  check(zero.conv, one.conv, "conv1d");
  check(zero.A_log, one.A_log, "A_log");
  check(zero.norm, one.norm, "norm");
  EXPECT_EQ(std::memcmp(zero.dn1.data(), one.dn1.data(), zero.dn1.size() * 4), 0);
}

TEST(DeltaMixer, DocumentsDoNotLeak) {
  // Changing a token of document 0 leaves documents 1 and 2 of the row (tokens 30..69) unchanged, bit for bit.
  Mixer m;
  const Vec before = m.forward();
  for (int64_t c = 0; c < m.s.C; ++c) m.n1[size_t(29 * m.s.C + c)] += 0.5f;
  const Vec after = m.forward();
  EXPECT_NE(std::memcmp(&before[0], &after[0], size_t(30 * m.s.C) * 4), 0);
  EXPECT_EQ(std::memcmp(&before[size_t(30 * m.s.C)], &after[size_t(30 * m.s.C)], size_t(40 * m.s.C) * 4), 0);
}

// The storage hook (bf16 activation storage, model/block.h): it sees each of the 13 internals once, when it is
// produced, and nothing writes a field after its keep(), so what the hook leaves (here: rounded to bf16) is what
// the rest of the forward and the backward read. No hook and a hook that changes nothing give the same bits.
TEST(DeltaMixer, TheStorageHookSeesEachInternalOnceAsItIsProduced) {
  struct Recorder final : DeltaMixerStorage {
    Recorder(const DeltaMixerShape& shape, bool rounds) : s(&shape), round(rounds) {}
    const DeltaMixerShape* s;
    bool round;
    mutable std::vector<float* DeltaMixerActs::*> order;
    mutable std::vector<Vec> at_keep;  // each field's contents as the hook left them
    void keep(float* DeltaMixerActs::*field, float* x) const override {
      order.push_back(field);
      const int64_t N = s->N();
      int64_t row = s->Hv;  // b, a, beta, g, rstd
      if (field == &DeltaMixerActs::qkv_pre || field == &DeltaMixerActs::qkv) row = s->conv_dim();
      if (field == &DeltaMixerActs::qk_hat) row = 2 * s->key_dim();
      if (field == &DeltaMixerActs::z || field == &DeltaMixerActs::o || field == &DeltaMixerActs::y)
        row = s->value_dim();
      if (field == &DeltaMixerActs::q_rnorm || field == &DeltaMixerActs::k_rnorm) row = s->Hk;
      if (round)
        for (int64_t i = 0; i < N * row; ++i) x[i] = round_to_bf16(x[i]);
      at_keep.emplace_back(x, x + N * row);
    }
  };
  Mixer m;
  const DeltaMixerShape& s = m.s;
  auto run = [&](const Recorder* r, Vec& acts) {
    acts.assign(DeltaMixerActs::floats(s), 0.f);
    Vec out(size_t(s.N() * s.C));
    DeltaMixerActs a = DeltaMixerActs::bind(acts.data(), s);
    delta_mixer_forward(out.data(), a, m.n1.data(), m.view(), m.tok(), s, r);
    return out;
  };
  Vec plain_acts, same_acts, rounded_acts;
  const Vec plain = run(nullptr, plain_acts);
  Recorder same(s, false), rounded(s, true);
  const Vec same_out = run(&same, same_acts);
  const Vec rounded_out = run(&rounded, rounded_acts);
  EXPECT_EQ(std::memcmp(plain.data(), same_out.data(), plain.size() * 4), 0);
  EXPECT_EQ(std::memcmp(plain_acts.data(), same_acts.data(), plain_acts.size() * 4), 0);
  EXPECT_NE(std::memcmp(plain.data(), rounded_out.data(), plain.size() * 4), 0);
  const std::vector<float* DeltaMixerActs::*> all = {
      &DeltaMixerActs::qkv_pre, &DeltaMixerActs::qkv, &DeltaMixerActs::qk_hat, &DeltaMixerActs::q_rnorm,
      &DeltaMixerActs::k_rnorm, &DeltaMixerActs::z,   &DeltaMixerActs::b,      &DeltaMixerActs::a,
      &DeltaMixerActs::beta,    &DeltaMixerActs::g,   &DeltaMixerActs::o,      &DeltaMixerActs::rstd,
      &DeltaMixerActs::y};
  ASSERT_EQ(rounded.order.size(), all.size());
  DeltaMixerActs a = DeltaMixerActs::bind(rounded_acts.data(), s);
  for (const auto field : all) {
    const auto it = std::find(rounded.order.begin(), rounded.order.end(), field);
    ASSERT_NE(it, rounded.order.end()) << "a field never kept";
    const Vec& kept = rounded.at_keep[size_t(it - rounded.order.begin())];
    EXPECT_EQ(std::memcmp(kept.data(), a.*field, kept.size() * 4), 0) << "field " << (it - rounded.order.begin())
                                                                      << " written after its keep()";
  }
}

}  // namespace
}  // namespace lt
