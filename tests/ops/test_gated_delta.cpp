// The gated delta rule: the f64 recurrence (the reference) by finite differences; the chunked fast path against
// it (forward and backward, chunk boundaries inside and across documents, grouped value heads, head dims that are
// not powers of two, T not a multiple of the chunk); strided rows; determinism across thread counts; documents
// never leaking into each other; bad shapes.
//
// Legend: B rows, T tokens per row, N = B·T, Hk key heads, Hv value heads, dk / dv head dims.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/gated_delta.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

using testing::bits_equal;
using testing::grad_check;
using testing::random_vector;
using testing::rel_l2;
using Vec = std::vector<float>;

// Inputs as a Gated DeltaNet layer makes them: q, k L2-normalised per head, β = sigmoid(·) ∈ (0, 1), g ≤ 0 with
// some tokens near 0 (long memory) and some strongly negative (e^g underflowing towards 0).
struct Inputs {
  DeltaShape s;
  Vec q, k, v, beta, g, dout;
  std::vector<int32_t> doc_ids;  // empty: each row one sequence
  const int32_t* docs() const { return doc_ids.empty() ? nullptr : doc_ids.data(); }
};

void l2_normalise_heads(Vec& x, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(x[size_t(r * d + i)]) * x[size_t(r * d + i)];
    const float inv = float(1.0 / std::sqrt(ss + 1e-6));
    for (int64_t i = 0; i < d; ++i) x[size_t(r * d + i)] *= inv;
  }
}

Inputs make_inputs(int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, uint64_t seed,
                   bool normalise = true) {
  Inputs in;
  in.s = DeltaShape::packed(B, T, Hk, Hv, dk, dv, float(1.0 / std::sqrt(double(dk))));
  const int64_t N = B * T;
  in.q = random_vector(size_t(N * Hk * dk), seed);
  in.k = random_vector(size_t(N * Hk * dk), seed + 1);
  in.v = random_vector(size_t(N * Hv * dv), seed + 2);
  if (normalise) {
    l2_normalise_heads(in.q, N * Hk, dk);
    l2_normalise_heads(in.k, N * Hk, dk);
  }
  Vec b = random_vector(size_t(N * Hv), seed + 3, -3.f, 3.f);
  Vec a = random_vector(size_t(N * Hv), seed + 4, -6.f, 2.f);
  in.beta.resize(b.size());
  in.g.resize(a.size());
  for (size_t i = 0; i < b.size(); ++i) {
    in.beta[i] = 1.f / (1.f + std::exp(-b[i]));
    in.g[i] = -std::log1p(std::exp(a[i]));  // −softplus: in (−2.2, 0), mostly small
  }
  in.dout = random_vector(size_t(N * Hv * dv), seed + 5);
  return in;
}

Vec forward(const Inputs& in, bool chunked) {
  Vec o(size_t(in.s.N() * in.s.Hv * in.s.dv));
  (chunked ? gated_delta_forward : gated_delta_forward_recurrent)(o.data(), in.q.data(), in.k.data(), in.v.data(),
                                                                 in.beta.data(), in.g.data(), in.docs(), in.s);
  return o;
}

struct Grads {
  Vec dq, dk, dv, dbeta, dg;
};

Grads backward(const Inputs& in, bool chunked) {
  Grads r;
  r.dq.assign(in.q.size(), NAN);  // written, never read: NaN shows any element left unwritten
  r.dk.assign(in.k.size(), NAN);
  r.dv.assign(in.v.size(), NAN);
  r.dbeta.assign(in.beta.size(), NAN);
  r.dg.assign(in.g.size(), NAN);
  (chunked ? gated_delta_backward : gated_delta_backward_recurrent)(
      r.dq.data(), r.dk.data(), r.dv.data(), r.dbeta.data(), r.dg.data(), in.dout.data(), in.q.data(),
      in.k.data(), in.v.data(), in.beta.data(), in.g.data(), in.docs(), in.s);
  return r;
}

// Packed rows: row 0 holds documents of 70, 5 and the rest of T tokens; row 1 one of 1 token and the rest.
std::vector<int32_t> packed_docs(int64_t B, int64_t T) {
  std::vector<int32_t> ids(size_t(B * T));
  for (int64_t t = 0; t < T; ++t) {
    ids[size_t(t)] = t < 70 ? 0 : t < 75 ? 1 : 2;
    if (B > 1) ids[size_t(T + t)] = t < 1 ? 0 : 1;
  }
  return ids;
}

// Finite differences of loss = Σ o ⊙ dout through `chunked`'s forward, against its backward.
void check_gradients_by_finite_differences(bool chunked) {
  // T = 80: row 1 runs over a chunk boundary (the carried state's gradient); row 0 holds two documents.
  Inputs in = make_inputs(2, 80, 2, 4, 5, 3, 100, /*normalise=*/false);
  in.s = DeltaShape::packed(2, 80, 2, 4, 5, 3, 0.6f);
  in.doc_ids.assign(size_t(2 * 80), 0);
  for (int64_t t = 20; t < 80; ++t) in.doc_ids[size_t(t)] = 1;
  // Scale k so the state's feedback (k·k ≈ 1) matters without making the recurrence stiff.
  for (float& x : in.k) x *= 0.5f;
  const Grads gr = backward(in, chunked);
  auto loss = [&] {
    Vec o = forward(in, chunked);
    return testing::dot(o, in.dout);
  };
  // The recurrence runs in f64 and rounds o once to f32: with h = 1e-2 the central difference's truncation error
  // (O(h²) of O(1) third derivatives) dominates, ~1e-4 relative; bound 2e-3 with the default floor 1e-2. The
  // chunked form runs in f32: its rounding adds ~eps_f32·|L|/h ≈ 6e-8·20/2e-2 ≈ 6e-5 absolute to every
  // difference (measured 4e-5 on a dg element whose gradient is ~0), so its floor is 0.1 (≤ 6e-4 relative).
  const double bound = 2e-3, floor = chunked ? 0.1 : 1e-2;
  EXPECT_GRAD_OK(grad_check(in.q, gr.dq, loss, 1, 80, 1e-2f, floor), bound, "dq");
  EXPECT_GRAD_OK(grad_check(in.k, gr.dk, loss, 2, 80, 1e-2f, floor), bound, "dk");
  EXPECT_GRAD_OK(grad_check(in.v, gr.dv, loss, 3, 80, 1e-2f, floor), bound, "dv");
  EXPECT_GRAD_OK(grad_check(in.beta, gr.dbeta, loss, 4, 80, 1e-2f, floor), bound, "dbeta");
  EXPECT_GRAD_OK(grad_check(in.g, gr.dg, loss, 5, 80, 1e-2f, floor), bound, "dg");
}

TEST(GatedDelta, RecurrenceGradientsMatchFiniteDifferences) { check_gradients_by_finite_differences(false); }

TEST(GatedDelta, ChunkedGradientsMatchFiniteDifferences) { check_gradients_by_finite_differences(true); }

// The chunked form against the recurrence on realistic inputs: the f32 rounding of a chunk's products. Measured
// relative L2 errors 4e-7 .. 1.2e-6 (dg, the reverse cumulative sum of dγ, is the largest); bounds 1e-5 forward
// and 2e-5 backward, ~10× above, far below any real defect (a dropped term gives ~1).
void expect_chunked_matches_recurrence(const Inputs& in, const std::string& what) {
  const Vec o_ref = forward(in, false), o = forward(in, true);
  EXPECT_LT(rel_l2(o.data(), o_ref.data(), o.size()), 1e-5) << what << ": o";
  const Grads ref = backward(in, false), got = backward(in, true);
  std::printf("%s: relative L2 o %.1e dq %.1e dk %.1e dv %.1e dbeta %.1e dg %.1e\n", what.c_str(),
              rel_l2(o.data(), o_ref.data(), o.size()), rel_l2(got.dq.data(), ref.dq.data(), ref.dq.size()),
              rel_l2(got.dk.data(), ref.dk.data(), ref.dk.size()), rel_l2(got.dv.data(), ref.dv.data(), ref.dv.size()),
              rel_l2(got.dbeta.data(), ref.dbeta.data(), ref.dbeta.size()),
              rel_l2(got.dg.data(), ref.dg.data(), ref.dg.size()));
  EXPECT_LT(rel_l2(got.dq.data(), ref.dq.data(), ref.dq.size()), 2e-5) << what << ": dq";
  EXPECT_LT(rel_l2(got.dk.data(), ref.dk.data(), ref.dk.size()), 2e-5) << what << ": dk";
  EXPECT_LT(rel_l2(got.dv.data(), ref.dv.data(), ref.dv.size()), 2e-5) << what << ": dv";
  EXPECT_LT(rel_l2(got.dbeta.data(), ref.dbeta.data(), ref.dbeta.size()), 2e-5) << what << ": dbeta";
  EXPECT_LT(rel_l2(got.dg.data(), ref.dg.data(), ref.dg.size()), 2e-5) << what << ": dg";
}

TEST(GatedDelta, ChunkedMatchesRecurrenceOnOddShapes) {
  // T = 150: two whole chunks and a partial one; value heads twice the key heads; dims not powers of two.
  Inputs in = make_inputs(2, 150, 2, 4, 12, 10, 7);
  expect_chunked_matches_recurrence(in, "unpacked");
  in.doc_ids = packed_docs(2, 150);
  expect_chunked_matches_recurrence(in, "packed");
}

TEST(GatedDelta, ChunkedMatchesRecurrenceAtQwenHeadSize) {
  // Qwen3.5/3.6 heads: dk = dv = 128, three value heads per key head.
  Inputs in = make_inputs(1, 130, 1, 3, 128, 128, 11);
  expect_chunked_matches_recurrence(in, "dk = dv = 128");
}

TEST(GatedDelta, StridedRowsGiveThePackedBits) {
  // q, k, v as slices of one conv output row [Q | K | V | 3 spare], gradients into the same layout.
  const Inputs in = make_inputs(2, 70, 2, 4, 6, 5, 21);
  const DeltaShape& p = in.s;
  const int64_t N = p.N(), qk = p.Hk * p.dk, vd = p.Hv * p.dv, ld = 2 * qk + vd + 3;
  Vec buf(size_t(N * ld), 7.f);
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(&buf[size_t(n * ld)], &in.q[size_t(n * qk)], size_t(qk) * 4);
    std::memcpy(&buf[size_t(n * ld + qk)], &in.k[size_t(n * qk)], size_t(qk) * 4);
    std::memcpy(&buf[size_t(n * ld + 2 * qk)], &in.v[size_t(n * vd)], size_t(vd) * 4);
  }
  DeltaShape s = p;
  s.ldq = s.ldk = s.ldv = ld;
  Vec o(size_t(N * vd));
  gated_delta_forward(o.data(), &buf[0], &buf[size_t(qk)], &buf[size_t(2 * qk)], in.beta.data(), in.g.data(),
                      nullptr, s);
  EXPECT_TRUE(bits_equal(o, forward(in, true)));
  Vec dbuf(size_t(N * ld), 7.f), dbeta(in.beta.size()), dg(in.g.size());
  gated_delta_backward(&dbuf[0], &dbuf[size_t(qk)], &dbuf[size_t(2 * qk)], dbeta.data(), dg.data(),
                       in.dout.data(), &buf[0], &buf[size_t(qk)], &buf[size_t(2 * qk)], in.beta.data(),
                       in.g.data(), nullptr, s);
  const Grads ref = backward(in, true);
  for (int64_t n = 0; n < N; ++n) {
    ASSERT_EQ(std::memcmp(&dbuf[size_t(n * ld)], &ref.dq[size_t(n * qk)], size_t(qk) * 4), 0) << n;
    ASSERT_EQ(std::memcmp(&dbuf[size_t(n * ld + qk)], &ref.dk[size_t(n * qk)], size_t(qk) * 4), 0) << n;
    ASSERT_EQ(std::memcmp(&dbuf[size_t(n * ld + 2 * qk)], &ref.dv[size_t(n * vd)], size_t(vd) * 4), 0) << n;
    for (int64_t x = 2 * qk + vd; x < ld; ++x) ASSERT_EQ(dbuf[size_t(n * ld + x)], 7.f) << "spare column written";
  }
  EXPECT_TRUE(bits_equal(dbeta, ref.dbeta));
  EXPECT_TRUE(bits_equal(dg, ref.dg));
}

TEST(GatedDelta, SameBitsWithOneAndTwoThreads) {
  Inputs in = make_inputs(2, 100, 2, 4, 8, 6, 31);
  in.doc_ids = packed_docs(2, 100);
  const int saved = num_threads();
  set_num_threads(1);
  const Vec o1 = forward(in, true);
  const Grads g1 = backward(in, true);
  set_num_threads(2);
  const Vec o2 = forward(in, true);
  const Grads g2 = backward(in, true);
  set_num_threads(saved);
  EXPECT_TRUE(bits_equal(o1, o2));
  EXPECT_TRUE(bits_equal(g1.dq, g2.dq) && bits_equal(g1.dk, g2.dk) && bits_equal(g1.dv, g2.dv));
  EXPECT_TRUE(bits_equal(g1.dbeta, g2.dbeta) && bits_equal(g1.dg, g2.dg));
}

TEST(GatedDelta, DocumentsDoNotLeak) {
  // A packed document computes exactly what it computes alone in a row: the state starts from zero at its first
  // token and its chunks are counted from there.
  Inputs packed = make_inputs(1, 150, 1, 2, 7, 5, 41);
  packed.doc_ids = packed_docs(1, 150);  // documents [0, 70), [70, 75), [75, 150)
  const Vec o = forward(packed, true);
  const Grads gp = backward(packed, true);
  const int64_t begin = 75, len = 75, qk = 7, vd = 2 * 5;
  Inputs alone = packed;
  alone.s.T = len;
  alone.doc_ids.clear();
  auto slice = [](const Vec& x, int64_t b, int64_t n, int64_t w) {
    return Vec(x.begin() + b * w, x.begin() + (b + n) * w);
  };
  alone.q = slice(packed.q, begin, len, qk);
  alone.k = slice(packed.k, begin, len, qk);
  alone.v = slice(packed.v, begin, len, vd);
  alone.beta = slice(packed.beta, begin, len, 2);
  alone.g = slice(packed.g, begin, len, 2);
  alone.dout = slice(packed.dout, begin, len, vd);
  EXPECT_TRUE(bits_equal(forward(alone, true), slice(o, begin, len, vd)));
  const Grads ga = backward(alone, true);
  EXPECT_TRUE(bits_equal(ga.dq, slice(gp.dq, begin, len, qk)));
  EXPECT_TRUE(bits_equal(ga.dg, slice(gp.dg, begin, len, 2)));
}

TEST(GatedDelta, StepsOnACarriedStateFollowTheRecurrence) {
  // Generation's cache: a row run token by token from a zero state gives the recurrence's outputs to f32 rounding
  // (measured ~1e-7 relative; bound 1e-5).
  const Inputs in = make_inputs(1, 90, 2, 4, 9, 7, 51);
  const DeltaShape& s = in.s;
  const Vec ref = forward(in, false);
  Vec state(size_t(s.Hv * s.dk * s.dv), 0.f), o(ref.size());
  for (int64_t n = 0; n < s.N(); ++n)
    gated_delta_step(&o[size_t(n * s.Hv * s.dv)], state.data(), &in.q[size_t(n * s.ldq)], &in.k[size_t(n * s.ldk)],
                     &in.v[size_t(n * s.ldv)], &in.beta[size_t(n * s.Hv)], &in.g[size_t(n * s.Hv)], s);
  EXPECT_LT(rel_l2(o.data(), ref.data(), o.size()), 1e-5);
}

TEST(GatedDelta, RefusesBadShapes) {
  Inputs in = make_inputs(1, 4, 2, 3, 4, 4, 1);  // 3 value heads over 2 key heads
  Vec o(size_t(4 * 3 * 4));
  try {
    gated_delta_forward(o.data(), in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), nullptr,
                        in.s);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of key heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lt
