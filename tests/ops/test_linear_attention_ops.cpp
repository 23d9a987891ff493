// The ops Qwen3.5/3.6's hybrid layers add: Gated DeltaNet's short conv, q/k L2 norm, beta/decay gates and gated
// RMSNorm; gated attention's sigmoid output gate and partial RoPE. Each against a plain double reference written
// here on seeded odd shapes, every gradient by finite differences, the gradient contract (parameter grads +=,
// activation grads =), bits equal with 1 and 2 threads, the conv's document boundaries, and bad sizes.
//
// Legend: B rows, T tokens per row, N = B·T, Cc conv channels, K conv kernel width, H heads, D head dimension,
// Hv value heads, dv value head dimension, R rotated dims. u = 2^-24 ≈ 6e-8 (f32 unit roundoff).
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/delta_gates.h"
#include "ops/gated_rmsnorm.h"
#include "ops/l2norm.h"
#include "ops/rope.h"
#include "ops/short_conv.h"
#include "ops/sigmoid_gate.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

using testing::dot;
using testing::bits_equal;
using testing::grad_check;
using testing::random_vector;
using Vec = std::vector<float>;

bool all_written(const Vec& v) {
  for (float x : v)
    if (std::isnan(x)) return false;
  return true;
}

// Runs fn() with 1 and then 2 threads and returns both results.
template <typename Fn>
std::pair<Vec, Vec> with_1_and_2_threads(Fn fn) {
  const int saved = num_threads();
  set_num_threads(1);
  Vec a = fn();
  set_num_threads(2);
  Vec b = fn();
  set_num_threads(saved);
  return {a, b};
}

Vec concat(std::initializer_list<const Vec*> parts) {
  Vec all;
  for (const Vec* p : parts) all.insert(all.end(), p->begin(), p->end());
  return all;
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu_ref(double x) { return x * sigmoid_ref(x); }
double dsilu_ref(double x) {
  const double s = sigmoid_ref(x);
  return s * (1.0 + x * (1.0 - s));
}

// ---------------------------------------------------------------------------------------------------------
// Short conv (causal depthwise conv1d + SiLU, documents never mixed)
// ---------------------------------------------------------------------------------------------------------

// Document ids (model/batch.cpp's doc_ids) of B rows of T tokens: row r holds documents of the given lengths,
// numbered on from the row before; when continues[r], its first document keeps the previous row's last id (a
// document split across rows: the row start must cut it all the same).
std::vector<int32_t> packed_doc_ids(int64_t T, const std::vector<std::vector<int64_t>>& docs,
                                    const std::vector<bool>& continues) {
  std::vector<int32_t> ids;
  int32_t next = 0;
  for (size_t r = 0; r < docs.size(); ++r) {
    int64_t used = 0;
    for (size_t d = 0; d < docs[r].size(); ++d) {
      const int32_t id = (d == 0 && continues[r] && next > 0) ? next - 1 : next++;
      ids.insert(ids.end(), size_t(docs[r][d]), id);
      used += docs[r][d];
    }
    EXPECT_EQ(used, T) << "row " << r << " lengths must add up to T";
  }
  return ids;
}

// Rows of 37: documents of 1, 2, 5 and 29 tokens (shorter than K, and long); a row continuing row 0's last
// document then one of 27 tokens; one unpacked row.
constexpr int64_t kConvB = 3, kConvT = 37, kConvN = kConvB * kConvT, kConvC = 53;
std::vector<int32_t> conv_doc_ids() { return packed_doc_ids(kConvT, {{1, 2, 5, 29}, {10, 27}, {37}}, {false, true, false}); }

// Tokens a and b in one document: the same row and the same id.
bool same_doc(const std::vector<int32_t>& docs, int64_t T, int64_t a, int64_t b) {
  return a / T == b / T && docs[size_t(a)] == docs[size_t(b)];
}

// pre[N, Cc] in double: taps j = 0..K-1 of the same document only.
std::vector<double> conv_pre_ref(const Vec& x, const Vec& w, const std::vector<int32_t>& docs, int64_t T, int64_t Cc,
                                 int64_t K, std::vector<double>* abs_sum = nullptr) {
  const int64_t N = int64_t(docs.size());
  std::vector<double> pre(size_t(N * Cc), 0.0);
  if (abs_sum) abs_sum->assign(pre.size(), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K && j <= n; ++j) {
      if (!same_doc(docs, T, n - j, n)) break;
      for (int64_t c = 0; c < Cc; ++c) {
        const double t = double(w[size_t(c * K + K - 1 - j)]) * x[size_t((n - j) * Cc + c)];
        pre[size_t(n * Cc + c)] += t;
        if (abs_sum) (*abs_sum)[size_t(n * Cc + c)] += std::fabs(t);
      }
    }
  return pre;
}

TEST(ShortConv, ForwardMatchesReference) {
  const auto docs = conv_doc_ids();
  for (int64_t K : {4, 1, 2, 6}) {
    SCOPED_TRACE("K = " + std::to_string(K));
    Vec x = random_vector(size_t(kConvN * kConvC), 101, -2.f, 2.f), w = random_vector(size_t(kConvC * K), 102);
    Vec out(x.size(), NAN);
    short_conv_forward(out.data(), x.data(), w.data(), docs.data(), kConvN, kConvT, kConvC, K);
    std::vector<double> abs_sum;
    const auto pre = conv_pre_ref(x, w, docs, kConvT, kConvC, K, &abs_sum);
    // pre: at most K products and K adds in f32, error <= 2K·u·Σ|w·x| (7.2e-7·Σ|w·x| at K = 6); silu'
    // <= 1.1 carries it to out, and silu itself adds <= 3.7u + 1u (ops/swiglu_math.h). Bound: 1e-6 of
    // Σ|w·x| plus 1e-6 relative; measured worst 0.1 of the bound.
    for (size_t i = 0; i < out.size(); ++i) {
      const double ref = silu_ref(pre[i]);
      ASSERT_NEAR(out[i], ref, 1e-6 * abs_sum[i] + 1e-6 * std::fabs(ref)) << "element " << i;
    }
  }
}

TEST(ShortConv, GradientsMatchReferenceAndFiniteDifferences) {
  const auto docs = conv_doc_ids();
  const int64_t K = 4;
  Vec x = random_vector(size_t(kConvN * kConvC), 103, -2.f, 2.f), w = random_vector(size_t(kConvC * K), 104);
  Vec proj = random_vector(x.size(), 105), out(x.size());
  Vec dx(x.size(), NAN), dw(w.size(), 0.f);
  short_conv_backward(dx.data(), dw.data(), proj.data(), x.data(), w.data(), docs.data(), kConvN, kConvT, kConvC, K);
  // Closed form in double (ops/short_conv.h). f32 evaluation: dpre carries pre's f32 error through silu''
  // and a few roundings; dx sums <= K terms, dw sums N terms in double. Relative L2 over the tensor, 1e-5
  // (measured 8.6e-8 and 8.5e-8).
  const auto pre = conv_pre_ref(x, w, docs, kConvT, kConvC, K);
  Vec dx_ref(dx.size(), 0.f), dw_ref(dw.size());
  std::vector<double> dx_acc(dx.size(), 0.0), dw_acc(dw.size(), 0.0);
  for (int64_t n = 0; n < kConvN; ++n)
    for (int64_t j = 0; j < K && j <= n && same_doc(docs, kConvT, n - j, n); ++j)
      for (int64_t c = 0; c < kConvC; ++c) {
        const size_t i = size_t(n * kConvC + c), m = size_t((n - j) * kConvC + c), k = size_t(c * K + K - 1 - j);
        const double dpre = double(proj[i]) * dsilu_ref(pre[i]);
        dx_acc[m] += dpre * w[k];
        dw_acc[k] += dpre * x[m];
      }
  for (size_t i = 0; i < dx.size(); ++i) dx_ref[i] = float(dx_acc[i]);
  for (size_t i = 0; i < dw.size(); ++i) dw_ref[i] = float(dw_acc[i]);
  EXPECT_LT(testing::rel_l2(dx.data(), dx_ref.data(), dx.size()), 1e-5);
  EXPECT_LT(testing::rel_l2(dw.data(), dw_ref.data(), dw.size()), 1e-5);

  auto loss = [&] {
    short_conv_forward(out.data(), x.data(), w.data(), docs.data(), kConvN, kConvT, kConvC, K);
    return dot(out, proj);
  };
  // h = 1e-2. An x element feeds <= K outputs through silu: truncation h²/6·|Σ proj·w³·silu'''| ~ 1e-5 and
  // rounding ~K·u·|out|/(2h) ~ 1e-5, against gradients O(0.01..1) and the 1e-2 floor. A weight feeds N = 111
  // outputs with x up to 2: truncation h²/6·|Σ proj·x³·silu'''| ~ 1e-4 absolute (rounding ~sqrt(N)·u·|out|/(2h)
  // ~ 3e-5) on gradients O(0.1..3). Measured worst 2.8e-4 (dx), 6.8e-4 (dw: 9e-5 absolute on 0.067). Bound
  // 3e-3; a tap taken from the wrong side (w[c, j] for w[c, K-1-j]) is off by O(1).
  EXPECT_GRAD_OK(grad_check(x, dx, loss, 106, 256), 3e-3, "dx");
  EXPECT_GRAD_OK(grad_check(w, dw, loss, 107, 256), 3e-3, "dweight");
}

TEST(ShortConv, WeightGradAccumulatesInputGradOverwrites) {
  const auto docs = conv_doc_ids();
  const int64_t K = 4;
  Vec x = random_vector(size_t(kConvN * kConvC), 108), w = random_vector(size_t(kConvC * K), 109);
  Vec g = random_vector(x.size(), 110), dx(x.size(), NAN), dw(w.size(), 0.f);
  short_conv_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), docs.data(), kConvN, kConvT, kConvC, K);
  ASSERT_TRUE(all_written(dx)) << "dx not fully written";
  Vec dx1 = dx, dw2 = dw;
  std::fill(dx.begin(), dx.end(), NAN);
  short_conv_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), docs.data(), kConvN, kConvT, kConvC, K);
  for (auto& v : dw2) v += v;  // one f32 add per call: exactly 2x
  EXPECT_TRUE(bits_equal(dw, dw2));
  EXPECT_TRUE(bits_equal(dx, dx1));
}

TEST(ShortConv, NothingCrossesADocumentOrRowBoundary) {
  const auto docs = conv_doc_ids();  // row 0: docs [0,1) [1,3) [3,8) [8,37); row 1: [37,47) [47,74); row 2
  const int64_t K = 4;
  Vec x = random_vector(size_t(kConvN * kConvC), 111), w = random_vector(size_t(kConvC * K), 112);
  auto forward = [&](const Vec& in) {
    Vec out(in.size());
    short_conv_forward(out.data(), in.data(), w.data(), docs.data(), kConvN, kConvT, kConvC, K);
    return out;
  };
  const Vec base = forward(x);
  auto token_equal = [&](const Vec& a, int64_t n) {
    return std::memcmp(&a[size_t(n * kConvC)], &base[size_t(n * kConvC)], size_t(kConvC) * 4) == 0;
  };
  // Change the last token of a document (every channel): the next document's outputs keep their bits, the
  // changed token's own output moves. Documents [3, 8) -> [8, 37), [1, 3) -> [3, 8) (shorter than K), and
  // the last token of row 0 -> row 1, whose first document has the same id (a document split across rows).
  const std::tuple<int64_t, int64_t, int64_t> cases[] = {
      {7, 8, 37}, {2, 3, 8}, {36, 37, 47}, {46, 47, 74}, {73, 74, 111}};  // changed token, next document
  for (auto [last, next_begin, next_end] : cases) {
    Vec y = x;
    for (int64_t c = 0; c < kConvC; ++c) y[size_t(last * kConvC + c)] += 0.5f;
    const Vec out = forward(y);
    EXPECT_FALSE(token_equal(out, last)) << "token " << last;
    for (int64_t n = next_begin; n < next_end; ++n)
      ASSERT_TRUE(token_equal(out, n)) << "changed " << last << ", token " << n;
  }
  // Backward: a gradient only on document [8, 37) leaves exactly zero on every other token's dx.
  Vec g(x.size(), 0.f), dx(x.size(), NAN), dw(w.size(), 0.f);
  const Vec r = random_vector(x.size(), 113);
  for (size_t i = size_t(8 * kConvC); i < size_t(37 * kConvC); ++i) g[i] = r[i];
  short_conv_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), docs.data(), kConvN, kConvT, kConvC, K);
  for (int64_t n = 0; n < kConvN; ++n)
    for (int64_t c = 0; c < kConvC; ++c) {
      const float v = dx[size_t(n * kConvC + c)];
      if (n >= 8 && n < 37) ASSERT_NE(v, 0.f) << "token " << n;
      else ASSERT_EQ(v, 0.f) << "token " << n << " outside the document got gradient";
    }
}

TEST(ShortConv, BitsIndependentOfThreadCount) {
  const int64_t B = 4, T = 500, C = 67, K = 4, N = B * T;  // 32 gradient chunks of 63 tokens
  Rng rng(114);
  std::vector<std::vector<int64_t>> docs(static_cast<size_t>(B));
  for (auto& row : docs) {
    int64_t left = T;
    while (left > 0) {
      const int64_t len = std::min<int64_t>(left, 1 + int64_t(rng.below(90)));
      row.push_back(len);
      left -= len;
    }
  }
  const auto ids = packed_doc_ids(T, docs, {false, true, false, false});
  Vec x = random_vector(size_t(N * C), 115), w = random_vector(size_t(C * K), 116), g = random_vector(x.size(), 117);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec out(x.size()), dx(x.size()), dw(w.size(), 0.25f);
    short_conv_forward(out.data(), x.data(), w.data(), ids.data(), N, T, C, K);
    short_conv_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), ids.data(), N, T, C, K);
    return concat({&out, &dx, &dw});
  });
  EXPECT_TRUE(bits_equal(a, b));
}

TEST(ShortConv, WithoutDocIdsEachRowIsOneDocument) {
  // Null doc_ids == one id per row (even an id shared by every row: rows never mix) — bit for bit, both
  // directions; and a packed row differs from it.
  const int64_t K = 4;
  Vec x = random_vector(size_t(kConvN * kConvC), 118), w = random_vector(size_t(kConvC * K), 119);
  Vec g = random_vector(x.size(), 120);
  auto run = [&](const int32_t* ids) {
    Vec out(x.size()), dx(x.size()), dw(w.size(), 0.f);
    short_conv_forward(out.data(), x.data(), w.data(), ids, kConvN, kConvT, kConvC, K);
    short_conv_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), ids, kConvN, kConvT, kConvC, K);
    return concat({&out, &dx, &dw});
  };
  const std::vector<int32_t> shared(size_t(kConvN), 5);
  const std::vector<int32_t> per_row = packed_doc_ids(kConvT, {{37}, {37}, {37}}, {false, false, false});
  const Vec unpacked = run(nullptr);
  EXPECT_TRUE(bits_equal(unpacked, run(shared.data())));
  EXPECT_TRUE(bits_equal(unpacked, run(per_row.data())));
  EXPECT_FALSE(bits_equal(unpacked, run(conv_doc_ids().data())));
}

TEST(ShortConv, BadSizesAreErrors) {
  Vec x(40, 1.f), w(8, 1.f), out(40);
  EXPECT_THROW(short_conv_forward(out.data(), x.data(), w.data(), nullptr, 10, 3, 4, 2), Error);  // N % T
  EXPECT_THROW(short_conv_forward(out.data(), x.data(), w.data(), nullptr, 10, 5, 4, 0), Error);  // K = 0
  EXPECT_THROW(short_conv_backward(out.data(), w.data(), x.data(), x.data(), w.data(), nullptr, 10, 0, 4, 2), Error);
}

// ---------------------------------------------------------------------------------------------------------
// L2 norm (per head, over D)
// ---------------------------------------------------------------------------------------------------------

constexpr float kL2Eps = 1e-6f;

struct L2Case {
  int64_t N, H, D, ld_in;  // ld_in > H·D: heads read as a slice of a wider row
};

class L2Norm : public ::testing::TestWithParam<L2Case> {};

TEST_P(L2Norm, ForwardMatchesReference) {
  const auto [N, H, D, ld] = GetParam();
  Vec in = random_vector(size_t(N * ld), 201, -2.f, 2.f);
  std::fill(in.begin() + 3 * ld + D, in.begin() + 3 * ld + 2 * D, 0.f);  // token 3, head 1: all zero
  Vec out(size_t(N * H * D), NAN), rn(size_t(N * H), NAN);
  l2norm_forward(out.data(), rn.data(), in.data(), N, H, D, H * D, ld, kL2Eps);
  EXPECT_EQ(rn[size_t(3 * H + 1)], 1.0f / std::sqrt(kL2Eps)) << "zero row: r = 1/sqrt(eps)";
  // Error budget: Σx² in 16 lanes of ceil(D/16) terms and a 4-level tree, relative <= (D/16 + 5)·u; sqrt
  // halves it, +eps, sqrt and the division add ~3u; y one more: <= 10u ≈ 6e-7 for D <= 128. Bound 2e-6
  // relative; measured worst 0.09 of it.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const float* x = &in[size_t(n * ld + h * D)];
      const double r = 1.0 / std::sqrt(testing::dot_self(x, D) + double(kL2Eps));
      ASSERT_NEAR(rn[size_t(n * H + h)], r, 2e-6 * r) << "token " << n << " head " << h;
      for (int64_t d = 0; d < D; ++d) {
        const double ref = double(x[d]) * r;
        ASSERT_NEAR(out[size_t((n * H + h) * D + d)], ref, 2e-6 * std::fabs(ref)) << n << " " << h << " " << d;
      }
    }
}

TEST_P(L2Norm, GradientMatchesReferenceAndFiniteDifferences) {
  const auto [N, H, D, ld] = GetParam();
  Vec in = random_vector(size_t(N * ld), 202, -2.f, 2.f), proj = random_vector(size_t(N * H * D), 203);
  Vec out(proj.size()), rn(size_t(N * H));
  auto loss = [&] {
    l2norm_forward(out.data(), rn.data(), in.data(), N, H, D, H * D, ld, kL2Eps);
    return dot(out, proj);
  };
  loss();
  // din strided like in (the layer writes it into the conv output's gradient); untouched gaps stay NaN.
  Vec din(in.size(), NAN);
  l2norm_backward(din.data(), proj.data(), in.data(), rn.data(), N, H, D, ld, H * D, ld);
  Vec dx(in.size(), 0.f), dx_ref(in.size(), 0.f);  // the heads' part of din, zero in the gaps
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < ld; ++i) {
      const size_t k = size_t(n * ld + i);
      if (i < H * D) dx[k] = din[k];
      else ASSERT_TRUE(std::isnan(din[k])) << "wrote outside the heads at token " << n << " offset " << i;
    }
  ASSERT_TRUE(all_written(dx));
  // Closed form in double: dx = r (g − x r² Σ g x). The dot cancels, so relative L2 over the tensor: 1e-5
  // (measured 8e-8).
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const float* x = &in[size_t(n * ld + h * D)];
      const float* g = &proj[size_t((n * H + h) * D)];
      double gx = 0;
      for (int64_t d = 0; d < D; ++d) gx += double(g[d]) * x[d];
      const double r = 1.0 / std::sqrt(testing::dot_self(x, D) + double(kL2Eps));
      for (int64_t d = 0; d < D; ++d) dx_ref[size_t(n * ld + h * D + d)] = float(r * (g[d] - x[d] * r * r * gx));
    }
  EXPECT_LT(testing::rel_l2(dx.data(), dx_ref.data(), dx.size()), 1e-5);
  // h = 1e-2 on rows of norm ~sqrt(D·4/3) ≈ 9..13: truncation ~(h/|x|)² ~ 1e-6 relative. Rounding: one
  // element moves r, coherent over the row's D outputs, ~sqrt(D/16)·u·|Σ proj y|/(2h) ~ 1e-5 absolute, on
  // gradients O(0.03..0.1), so a floor of 3e-2 (measured worst 2.4e-4). Bound 3e-3; dropping the r² Σ g x term
  // gives O(0.1..1). The gaps of the strided rows have no gradient: probes there see fd = 0 = analytic.
  EXPECT_GRAD_OK(grad_check(in, dx, loss, 204, 256, 1e-2f, 3e-2), 3e-3, "din");
}

TEST_P(L2Norm, InputGradIsWrittenAndMayOverwriteDout) {
  const auto [N, H, D, ld] = GetParam();
  Vec in = random_vector(size_t(N * ld), 205), g = random_vector(size_t(N * H * D), 206);
  Vec out(g.size()), rn(size_t(N * H));
  l2norm_forward(out.data(), rn.data(), in.data(), N, H, D, H * D, ld, kL2Eps);
  Vec din(g.size(), NAN);
  l2norm_backward(din.data(), g.data(), in.data(), rn.data(), N, H, D, H * D, H * D, ld);
  ASSERT_TRUE(all_written(din));
  Vec again(g.size(), 7.f), inplace = g;
  l2norm_backward(again.data(), g.data(), in.data(), rn.data(), N, H, D, H * D, H * D, ld);
  l2norm_backward(inplace.data(), inplace.data(), in.data(), rn.data(), N, H, D, H * D, H * D, ld);
  EXPECT_TRUE(bits_equal(din, again));
  EXPECT_TRUE(bits_equal(din, inplace));
  // Forward in place on a contiguous copy: the same bits as out of place.
  Vec packed(size_t(N * H * D));
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(&packed[size_t(n * H * D)], &in[size_t(n * ld)], size_t(H * D) * 4);
  Vec out2(packed.size()), y = packed;
  l2norm_forward(out2.data(), rn.data(), packed.data(), N, H, D, H * D, H * D, kL2Eps);
  l2norm_forward(y.data(), rn.data(), y.data(), N, H, D, H * D, H * D, kL2Eps);
  EXPECT_TRUE(bits_equal(out, out2));
  EXPECT_TRUE(bits_equal(out, y));
}

INSTANTIATE_TEST_SUITE_P(Shapes, L2Norm,
                         ::testing::Values(L2Case{37, 5, 67, 5 * 67}, L2Case{37, 3, 128, 2 * 3 * 128 + 96},
                                           L2Case{29, 4, 16, 4 * 16 + 5}, L2Case{7, 2, 5, 10}));

TEST(L2Norm, BitsIndependentOfThreadCount) {
  const int64_t N = 1000, H = 4, D = 67;
  Vec in = random_vector(size_t(N * H * D), 207), g = random_vector(in.size(), 208);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec out(in.size()), rn(size_t(N * H)), din(in.size());
    l2norm_forward(out.data(), rn.data(), in.data(), N, H, D, H * D, H * D, kL2Eps);
    l2norm_backward(din.data(), g.data(), in.data(), rn.data(), N, H, D, H * D, H * D, H * D);
    return concat({&out, &rn, &din});
  });
  EXPECT_TRUE(bits_equal(a, b));
}

TEST(L2Norm, BadSizesAreErrors) {
  Vec x(64, 1.f), y(64), r(8);
  EXPECT_THROW(l2norm_forward(y.data(), r.data(), x.data(), 4, 2, 8, 16, 15, kL2Eps), Error);  // ld < H·D
  EXPECT_THROW(l2norm_forward(y.data(), r.data(), x.data(), 4, 2, 0, 16, 16, kL2Eps), Error);
  EXPECT_THROW(l2norm_backward(y.data(), x.data(), x.data(), r.data(), 4, 2, 8, 16, 16, 8), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Delta gates (beta = σ(b), g = −exp(A_log)·softplus(a + dt_bias))
// ---------------------------------------------------------------------------------------------------------

constexpr int64_t kGateN = 37, kGateHv = 7;

// The true softplus (no threshold): torch's x above 20 differs from it by < 2e-9.
double softplus_ref(double x) { return std::log1p(std::exp(x)); }

struct GateInputs {
  Vec b, a, A_log, dt_bias;
};

// b and a span the sigmoid's and softplus's ranges: random in [-8, 8], then tails (±30, ±100) and a + dt_bias
// beyond the threshold 20 (a = 25, 60) and far below it (a = −30, −100: e^x near and in f32's denormals).
// A_log as HF's init: log of uniform [0.01, 16).
GateInputs gate_inputs(int64_t N, int64_t Hv, uint64_t seed, bool tails = true) {
  GateInputs in;
  in.b = random_vector(size_t(N * Hv), seed, -8.f, 8.f);
  in.a = random_vector(size_t(N * Hv), seed + 1, -8.f, 8.f);
  in.A_log = random_vector(size_t(Hv), seed + 2, 0.01f, 16.f);
  for (auto& v : in.A_log) v = std::log(v);
  in.dt_bias = random_vector(size_t(Hv), seed + 3, -2.f, 2.f);
  if (tails) {
    const float b_tails[] = {30.f, -30.f, 100.f, -100.f, 0.f}, a_tails[] = {25.f, 60.f, -30.f, -100.f, 0.f};
    for (size_t i = 0; i < 5; ++i) in.b[3 * i + 1] = b_tails[i], in.a[5 * i + 2] = a_tails[i];
  }
  return in;
}

TEST(DeltaGates, ForwardMatchesReference) {
  const GateInputs in = gate_inputs(kGateN, kGateHv, 301);
  Vec beta(in.b.size(), NAN), g(in.b.size(), NAN);
  delta_gates_forward(beta.data(), g.data(), in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), kGateN,
                      kGateHv);
  for (int64_t n = 0; n < kGateN; ++n)
    for (int64_t h = 0; h < kGateHv; ++h) {
      const size_t i = size_t(n * kGateHv + h);
      // σ: swiglu_math's, measured <= 3.7u relative; bound 5e-7 (8u). The 1e-37 floor covers b < −87.3,
      // where ours is 0 and the true value is below 1e-37. Measured worst 0.31 of the bound (g: 0.13).
      const double beta_ref = sigmoid_ref(in.b[i]);
      ASSERT_NEAR(beta[i], beta_ref, 5e-7 * beta_ref + 1e-37) << "b " << in.b[i];
      ASSERT_GE(beta[i], 0.f);
      // g from the f32 sum x = a + dt_bias as HF rounds it (the spec); then expf, log1pf, −exp(A_log) and a
      // product, each <= 1 ulp: <= 4u ≈ 2.4e-7. Bound 1e-6 relative, with a 1e-38 floor where e^x is
      // denormal in f32 (x < −87), the true |g| there is below 16·e^-87 ≈ 3e-37.
      const double x = double(in.a[i] + in.dt_bias[size_t(h)]);
      const double g_ref = -std::exp(double(in.A_log[size_t(h)])) * softplus_ref(x);
      ASSERT_NEAR(g[i], g_ref, 1e-6 * std::fabs(g_ref) + 1e-36) << "a " << in.a[i];
      ASSERT_LE(g[i], 0.f);
    }
}

TEST(DeltaGates, GradientsMatchReferenceAndFiniteDifferences) {
  GateInputs in = gate_inputs(kGateN, kGateHv, 302);
  const Vec p_beta = random_vector(in.b.size(), 303), p_g = random_vector(in.b.size(), 304);
  Vec db(in.b.size(), NAN), da(in.b.size(), NAN), dA(size_t(kGateHv), 0.f), ddt(size_t(kGateHv), 0.f);
  delta_gates_backward(db.data(), da.data(), dA.data(), ddt.data(), p_beta.data(), p_g.data(), in.b.data(),
                       in.a.data(), in.A_log.data(), in.dt_bias.data(), kGateN, kGateHv);
  // Closed form in double (ops/delta_gates.h), softplus' = σ(x) (torch's 1 above 20 differs from σ by
  // < 2e-9). Per element: db has σ's 4u and two products, da expf/(z+1)/products: bound 1e-6 relative with a
  // 1e-36 floor (denormals). dA_log, ddt_bias sum N terms in double: bound 1e-6 of Σ|terms|. Measured worst
  // 0.25 (db), 0.14 (da), 0.04 (dA_log) and 0.03 (ddt_bias) of the bounds.
  std::vector<double> dA_acc(size_t(kGateHv), 0.0), ddt_acc(size_t(kGateHv), 0.0), dA_abs(dA_acc), ddt_abs(dA_acc);
  for (int64_t n = 0; n < kGateN; ++n)
    for (int64_t h = 0; h < kGateHv; ++h) {
      const size_t i = size_t(n * kGateHv + h);
      const double s = sigmoid_ref(in.b[i]), db_ref = p_beta[i] * s * sigmoid_ref(-double(in.b[i]));
      ASSERT_NEAR(db[i], db_ref, 1e-6 * std::fabs(db_ref) + 1e-36) << "b " << in.b[i];
      const double x = double(in.a[i] + in.dt_bias[size_t(h)]), na = -std::exp(double(in.A_log[size_t(h)]));
      const double da_ref = p_g[i] * na * sigmoid_ref(x);
      ASSERT_NEAR(da[i], da_ref, 1e-6 * std::fabs(da_ref) + 1e-36) << "a " << in.a[i];
      dA_acc[size_t(h)] += p_g[i] * na * softplus_ref(x);
      dA_abs[size_t(h)] += std::fabs(p_g[i] * na * softplus_ref(x));
      ddt_acc[size_t(h)] += da_ref;
      ddt_abs[size_t(h)] += std::fabs(da_ref);
    }
  for (int64_t h = 0; h < kGateHv; ++h) {
    EXPECT_NEAR(dA[size_t(h)], dA_acc[size_t(h)], 1e-6 * dA_abs[size_t(h)]) << "dA_log head " << h;
    EXPECT_NEAR(ddt[size_t(h)], ddt_acc[size_t(h)], 1e-6 * ddt_abs[size_t(h)]) << "ddt_bias head " << h;
  }

  Vec beta(in.b.size()), g(in.b.size());
  auto loss = [&] {
    delta_gates_forward(beta.data(), g.data(), in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), kGateN,
                        kGateHv);
    return dot(beta, p_beta) + dot(g, p_g);
  };
  // h = 1e-2. b, a: one output each, smooth: truncation h²/6·|f'''/f'| <= 2e-5 relative; rounding
  // u·|out|/(2h): 5e-4 absolute where |g| reaches 16·(8 + 2) and the gradient is O(10), 3e-3 at the a = 60
  // tail (gradient ≈ 16, relative 2e-4); floor 1e-2. The
  // kink of torch's threshold (softplus(20) − 20 = 2e-9) is far below that. A_log: g scales by e^(±h), N
  // outputs, truncation h²/6 ≈ 2e-5 relative. dt_bias: like a, N outputs. Measured worst 4.6e-4 (db), 3e-5
  // (da, dA_log, ddt_bias). Bound 3e-3; a sign or a missing factor (σ for softplus, g for exp(A_log)) is off
  // by O(1).
  EXPECT_GRAD_OK(grad_check(in.b, db, loss, 305, 128), 3e-3, "db");
  EXPECT_GRAD_OK(grad_check(in.a, da, loss, 306, 128), 3e-3, "da");
  EXPECT_GRAD_OK(grad_check(in.A_log, dA, loss, 307), 3e-3, "dA_log");
  EXPECT_GRAD_OK(grad_check(in.dt_bias, ddt, loss, 308), 3e-3, "ddt_bias");
}

TEST(DeltaGates, ParameterGradsAccumulateActivationGradsOverwrite) {
  const GateInputs in = gate_inputs(kGateN, kGateHv, 309);
  const Vec dbeta = random_vector(in.b.size(), 310), dg = random_vector(in.b.size(), 311);
  Vec db(in.b.size(), NAN), da(in.b.size(), NAN), dA(size_t(kGateHv), 0.f), ddt(size_t(kGateHv), 0.f);
  auto backward = [&](float* db_, float* da_, const float* dbeta_, const float* dg_) {
    delta_gates_backward(db_, da_, dA.data(), ddt.data(), dbeta_, dg_, in.b.data(), in.a.data(), in.A_log.data(),
                         in.dt_bias.data(), kGateN, kGateHv);
  };
  backward(db.data(), da.data(), dbeta.data(), dg.data());
  ASSERT_TRUE(all_written(db) && all_written(da));
  Vec db1 = db, da1 = da, dA2 = dA, ddt2 = ddt;
  std::fill(db.begin(), db.end(), NAN);
  std::fill(da.begin(), da.end(), NAN);
  backward(db.data(), da.data(), dbeta.data(), dg.data());
  for (auto& v : dA2) v += v;  // one f32 add per call: exactly 2x
  for (auto& v : ddt2) v += v;
  EXPECT_TRUE(bits_equal(dA, dA2));
  EXPECT_TRUE(bits_equal(ddt, ddt2));
  EXPECT_TRUE(bits_equal(db, db1));
  EXPECT_TRUE(bits_equal(da, da1));
  // In place (db = dbeta, da = dg): the same bits.
  Vec ib = dbeta, ia = dg;
  backward(ib.data(), ia.data(), ib.data(), ia.data());
  EXPECT_TRUE(bits_equal(ib, db1));
  EXPECT_TRUE(bits_equal(ia, da1));
}

TEST(DeltaGates, BitsIndependentOfThreadCount) {
  const int64_t N = 5000, Hv = 7;  // 20 gradient chunks of 256 tokens
  const GateInputs in = gate_inputs(N, Hv, 312);
  const Vec dbeta = random_vector(in.b.size(), 313), dg = random_vector(in.b.size(), 314);
  auto [x, y] = with_1_and_2_threads([&] {
    Vec beta(in.b.size()), g(in.b.size()), db(in.b.size()), da(in.b.size());
    Vec dA(size_t(Hv), 0.5f), ddt(size_t(Hv), 0.5f);
    delta_gates_forward(beta.data(), g.data(), in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv);
    delta_gates_backward(db.data(), da.data(), dA.data(), ddt.data(), dbeta.data(), dg.data(), in.b.data(),
                         in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv);
    return concat({&beta, &g, &db, &da, &dA, &ddt});
  });
  EXPECT_TRUE(bits_equal(x, y));
}

// ---------------------------------------------------------------------------------------------------------
// Gated RMSNorm (HF Qwen3_5RMSNormGated)
// ---------------------------------------------------------------------------------------------------------

constexpr float kNormEps = 1e-6f;

struct GNormShape {
  int64_t rows, dv;
};

class GatedRmsNorm : public ::testing::TestWithParam<GNormShape> {};

TEST_P(GatedRmsNorm, ForwardMatchesReference) {
  const auto [rows, dv] = GetParam();
  Vec x = random_vector(size_t(rows * dv), 401, -2.f, 2.f), z = random_vector(x.size(), 402, -6.f, 6.f);
  Vec w = random_vector(size_t(dv), 403, 0.5f, 1.5f);
  std::fill(x.begin() + 2 * dv, x.begin() + 3 * dv, 0.f);  // an all-zero row: rstd = 1/sqrt(eps), out = 0
  Vec y(x.size(), NAN), rstd(size_t(rows), NAN);
  gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, dv, kNormEps);
  // rstd: rmsnorm's budget, (dv/16 + 5)·u on Σx², halved by sqrt, ~4u more: <= 3e-6 for dv <= 1000. y: three
  // roundings and silu's <= 4.7u. Bound 6e-6 relative; measured worst 0.05 of it.
  for (int64_t r = 0; r < rows; ++r) {
    const double s = 1.0 / std::sqrt(testing::dot_self(&x[size_t(r * dv)], dv) / double(dv) + double(kNormEps));
    ASSERT_NEAR(rstd[size_t(r)], s, 5e-6 * s) << "row " << r;
    for (int64_t d = 0; d < dv; ++d) {
      const size_t i = size_t(r * dv + d);
      const double ref = double(x[i]) * s * w[size_t(d)] * silu_ref(z[i]);
      ASSERT_NEAR(y[i], ref, 6e-6 * std::fabs(ref)) << "row " << r << " d " << d;
    }
  }
}

TEST_P(GatedRmsNorm, GradientsMatchReferenceAndFiniteDifferences) {
  const auto [rows, dv] = GetParam();
  Vec x = random_vector(size_t(rows * dv), 404, -2.f, 2.f), z = random_vector(x.size(), 405, -6.f, 6.f);
  Vec w = random_vector(size_t(dv), 406, 0.5f, 1.5f), proj = random_vector(x.size(), 407);
  Vec y(x.size()), rstd(static_cast<size_t>(rows));
  auto loss = [&] {
    gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, dv, kNormEps);
    return dot(y, proj);
  };
  loss();
  Vec dx(x.size(), NAN), dz(x.size(), NAN), dw(size_t(dv), 0.f);
  gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), proj.data(), x.data(), z.data(), w.data(), rstd.data(),
                         rows, dv);
  // Closed form in double (ops/gated_rmsnorm.h). dx's mean cancels, so all three as relative L2 over the
  // tensor: 1e-5 (measured <= 1e-7).
  Vec dx_ref(dx.size()), dz_ref(dz.size()), dw_ref(dw.size());
  std::vector<double> dw_acc(size_t(dv), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t o = size_t(r * dv);
    const double s = 1.0 / std::sqrt(testing::dot_self(&x[o], dv) / double(dv) + double(kNormEps));
    double m = 0;
    for (int64_t d = 0; d < dv; ++d)
      m += double(w[size_t(d)]) * proj[o + size_t(d)] * silu_ref(z[o + size_t(d)]) * x[o + size_t(d)] / double(dv);
    for (int64_t d = 0; d < dv; ++d) {
      const size_t i = o + size_t(d);
      const double G = proj[i] * silu_ref(z[i]);
      dx_ref[i] = float(s * (w[size_t(d)] * G - x[i] * s * s * m));
      dz_ref[i] = float(proj[i] * x[i] * s * w[size_t(d)] * dsilu_ref(z[i]));
      dw_acc[size_t(d)] += G * x[i] * s;
    }
  }
  for (int64_t d = 0; d < dv; ++d) dw_ref[size_t(d)] = float(dw_acc[size_t(d)]);
  EXPECT_LT(testing::rel_l2(dx.data(), dx_ref.data(), dx.size()), 1e-5);
  EXPECT_LT(testing::rel_l2(dz.data(), dz_ref.data(), dz.size()), 1e-5);
  EXPECT_LT(testing::rel_l2(dw.data(), dw_ref.data(), dw.size()), 1e-5);
  // Finite differences. dx: as rmsnorm's din, a step moves rstd, whose f32 rounding (~sqrt(dv/16)·u) is
  // coherent over the row's dv outputs, so the noise grows with dv: at dv = 1000 and h = 1e-2 it reached 3.6e-3
  // at a 0.1 floor (gradients O(0.01..1)). x enters y linearly apart from rstd, which a step moves by only
  // ~h·x/(dv·mean x²), so truncation stays below 1e-4 even at h = 5e-2: dx takes h = 5e-2 and the 0.1 floor,
  // measured worst 7.9e-4. dz (h = 1e-2): one output, silu smooth, truncation h²/6·|silu'''| ≈ 1e-5, measured
  // 4.2e-4. dw: linear, rounding only, measured 4.3e-5. Bound 3e-3; silu for silu' or a dropped mean term is
  // off by O(0.1..1).
  EXPECT_GRAD_OK(grad_check(x, dx, loss, 408, 128, 5e-2f, 0.1), 3e-3, "dx");
  EXPECT_GRAD_OK(grad_check(z, dz, loss, 409, 128), 3e-3, "dz");
  EXPECT_GRAD_OK(grad_check(w, dw, loss, 410), 3e-3, "dweight");
}

TEST_P(GatedRmsNorm, WeightGradAccumulatesInputGradsOverwrite) {
  const auto [rows, dv] = GetParam();
  Vec x = random_vector(size_t(rows * dv), 411), z = random_vector(x.size(), 412, -4.f, 4.f);
  Vec w = random_vector(size_t(dv), 413), g = random_vector(x.size(), 414);
  Vec y(x.size()), rstd(static_cast<size_t>(rows));
  gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, dv, kNormEps);
  Vec dx(x.size(), NAN), dz(x.size(), NAN), dw(size_t(dv), 0.f);
  gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), g.data(), x.data(), z.data(), w.data(), rstd.data(), rows,
                         dv);
  ASSERT_TRUE(all_written(dx) && all_written(dz));
  Vec dx1 = dx, dz1 = dz, dw2 = dw;
  std::fill(dx.begin(), dx.end(), NAN);
  std::fill(dz.begin(), dz.end(), NAN);
  gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), g.data(), x.data(), z.data(), w.data(), rstd.data(), rows,
                         dv);
  for (auto& v : dw2) v += v;  // one f32 add per call: exactly 2x
  EXPECT_TRUE(bits_equal(dw, dw2));
  EXPECT_TRUE(bits_equal(dx, dx1));
  EXPECT_TRUE(bits_equal(dz, dz1));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GatedRmsNorm,
                         ::testing::Values(GNormShape{37 * 3, 67}, GNormShape{37, 128}, GNormShape{37 * 5, 16},
                                           GNormShape{5, 1000}));

TEST(GatedRmsNorm, BitsIndependentOfThreadCount) {
  const int64_t rows = 5000, dv = 67;  // several row chunks in both directions
  Vec x = random_vector(size_t(rows * dv), 415), z = random_vector(x.size(), 416, -5.f, 5.f);
  Vec w = random_vector(size_t(dv), 417), g = random_vector(x.size(), 418);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec y(x.size()), rstd(static_cast<size_t>(rows)), dx(x.size()), dz(x.size()), dw(size_t(dv), 0.25f);
    gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, dv, kNormEps);
    gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), g.data(), x.data(), z.data(), w.data(), rstd.data(),
                           rows, dv);
    return concat({&y, &rstd, &dx, &dz, &dw});
  });
  EXPECT_TRUE(bits_equal(a, b));
}

// ---------------------------------------------------------------------------------------------------------
// Sigmoid output gate (gate interleaved in q_proj's output [N, H, 2D])
// ---------------------------------------------------------------------------------------------------------

constexpr int64_t kSgN = 37, kSgH = 5, kSgD = 19, kSgLdTok = kSgH * 2 * kSgD, kSgLdHead = 2 * kSgD;

// The gate of (n, h, d) inside q_proj's output: the second half of head h.
size_t gate_index(int64_t n, int64_t h, int64_t d) { return size_t(n * kSgLdTok + h * kSgLdHead + kSgD + d); }

TEST(SigmoidGate, ForwardMatchesReference) {
  Vec qp = random_vector(size_t(kSgN * kSgLdTok), 501, -10.f, 10.f);  // q_proj output [N, H, 2D]
  qp[gate_index(1, 2, 3)] = 100.f, qp[gate_index(4, 0, 0)] = -100.f, qp[gate_index(5, 1, 7)] = 0.f;
  Vec x = random_vector(size_t(kSgN * kSgH * kSgD), 502), out(x.size(), NAN);
  sigmoid_gate_forward(out.data(), x.data(), qp.data() + kSgD, kSgN, kSgH, kSgD, kSgLdTok, kSgLdHead);
  for (int64_t n = 0; n < kSgN; ++n)
    for (int64_t h = 0; h < kSgH; ++h)
      for (int64_t d = 0; d < kSgD; ++d) {
        const size_t i = size_t((n * kSgH + h) * kSgD + d);
        const double ref = x[i] * sigmoid_ref(qp[gate_index(n, h, d)]);
        // σ <= 3.7u (ops/swiglu_math.h) and one product: bound 5e-7 relative (8u); 1e-37 covers gates below
        // −87.3 where ours is 0. Measured worst 0.38 of the bound.
        ASSERT_NEAR(out[i], ref, 5e-7 * std::fabs(ref) + 1e-37) << n << " " << h << " " << d;
      }
  Vec y = x;  // in place: the same bits
  sigmoid_gate_forward(y.data(), y.data(), qp.data() + kSgD, kSgN, kSgH, kSgD, kSgLdTok, kSgLdHead);
  EXPECT_TRUE(bits_equal(y, out));
}

TEST(SigmoidGate, GradientsMatchReferenceAndFiniteDifferences) {
  Vec qp = random_vector(size_t(kSgN * kSgLdTok), 503, -6.f, 6.f), x = random_vector(size_t(kSgN * kSgH * kSgD), 504);
  const Vec proj = random_vector(x.size(), 505);
  constexpr float kSentinel = 777.f;  // the query halves of q_proj's gradient: not this op's to write
  Vec dqp(qp.size(), kSentinel), dx(x.size(), NAN);
  sigmoid_gate_backward(dx.data(), dqp.data() + kSgD, proj.data(), x.data(), qp.data() + kSgD, kSgN, kSgH, kSgD,
                        kSgLdTok, kSgLdHead);
  Vec dgate_full(qp.size(), 0.f);  // d loss / d q_proj output: zero on the query halves
  for (int64_t n = 0; n < kSgN; ++n)
    for (int64_t h = 0; h < kSgH; ++h)
      for (int64_t d = 0; d < kSgD; ++d) {
        const size_t i = size_t((n * kSgH + h) * kSgD + d), gi = gate_index(n, h, d);
        ASSERT_EQ(dqp[gi - size_t(kSgD)], kSentinel) << "wrote a query element";
        const double s = sigmoid_ref(qp[gi]);
        // dx: σ and a product, 5e-7 as the forward. dgate: σ·σ(−g) (each <= 3.7u, no cancellation) and two
        // products: bound 1e-6 relative. Measured worst 0.35 (dx) and 0.30 (dgate) of the bounds.
        const double dx_ref = proj[i] * s, dg_ref = double(proj[i]) * x[i] * s * sigmoid_ref(-double(qp[gi]));
        ASSERT_NEAR(dx[i], dx_ref, 5e-7 * std::fabs(dx_ref) + 1e-37) << n << " " << h << " " << d;
        ASSERT_NEAR(dqp[gi], dg_ref, 1e-6 * std::fabs(dg_ref) + 1e-37) << n << " " << h << " " << d;
        dgate_full[gi] = dqp[gi];
      }
  Vec out(x.size());
  auto loss = [&] {
    sigmoid_gate_forward(out.data(), x.data(), qp.data() + kSgD, kSgN, kSgH, kSgD, kSgLdTok, kSgLdHead);
    return dot(out, proj);
  };
  // h = 1e-2. x: linear, rounding of one output only (~u·|out|/(2h) ≈ 3e-6). gate: one output, σ smooth:
  // truncation h²/6·|σ'''| <= 2e-6, rounding as x. Query elements: fd exactly 0 = analytic. Measured worst
  // 2.7e-4 (dgate), 2e-6 (dx). Bound 3e-3; σ for σ' is off by O(1).
  EXPECT_GRAD_OK(grad_check(x, dx, loss, 506, 256), 3e-3, "dx");
  EXPECT_GRAD_OK(grad_check(qp, dgate_full, loss, 507, 256), 3e-3, "dgate");
}

TEST(SigmoidGate, GradsAreWrittenAndDxMayOverwriteDout) {
  const Vec qp = random_vector(size_t(kSgN * kSgLdTok), 508, -6.f, 6.f);
  const Vec x = random_vector(size_t(kSgN * kSgH * kSgD), 509), g = random_vector(x.size(), 510);
  Vec dx(x.size(), NAN), dqp(qp.size(), NAN);
  sigmoid_gate_backward(dx.data(), dqp.data() + kSgD, g.data(), x.data(), qp.data() + kSgD, kSgN, kSgH, kSgD,
                        kSgLdTok, kSgLdHead);
  ASSERT_TRUE(all_written(dx));
  for (int64_t n = 0; n < kSgN; ++n)
    for (int64_t h = 0; h < kSgH; ++h)
      for (int64_t d = 0; d < kSgD; ++d)
        ASSERT_FALSE(std::isnan(dqp[gate_index(n, h, d)])) << n << " " << h << " " << d;
  Vec dx2 = g, dqp2(qp.size(), 3.f);
  sigmoid_gate_backward(dx2.data(), dqp2.data() + kSgD, dx2.data(), x.data(), qp.data() + kSgD, kSgN, kSgH, kSgD,
                        kSgLdTok, kSgLdHead);
  EXPECT_TRUE(bits_equal(dx, dx2));
  for (int64_t n = 0; n < kSgN; ++n)
    for (int64_t h = 0; h < kSgH; ++h)
      for (int64_t d = 0; d < kSgD; ++d) ASSERT_EQ(dqp[gate_index(n, h, d)], dqp2[gate_index(n, h, d)]);
}

TEST(SigmoidGate, BitsIndependentOfThreadCount) {
  const int64_t N = 500, H = 4, D = 33;
  const Vec gate = random_vector(size_t(N * H * D), 511, -8.f, 8.f), x = random_vector(gate.size(), 512);
  const Vec g = random_vector(gate.size(), 513);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec out(x.size()), dx(x.size()), dgate(x.size());
    sigmoid_gate_forward(out.data(), x.data(), gate.data(), N, H, D, H * D, D);
    sigmoid_gate_backward(dx.data(), dgate.data(), g.data(), x.data(), gate.data(), N, H, D, H * D, D);
    return concat({&out, &dx, &dgate});
  });
  EXPECT_TRUE(bits_equal(a, b));
}

TEST(SigmoidGate, OverlappingGateStridesAreErrors) {
  Vec x(64, 1.f), gate(64, 0.f), out(64);
  EXPECT_THROW(sigmoid_gate_forward(out.data(), x.data(), gate.data(), 4, 2, 8, 16, 7), Error);   // head < D
  EXPECT_THROW(sigmoid_gate_forward(out.data(), x.data(), gate.data(), 4, 2, 8, 15, 8), Error);   // token too short
  EXPECT_THROW(sigmoid_gate_backward(out.data(), gate.data(), x.data(), x.data(), gate.data(), 4, 2, 0, 16, 8), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Partial RoPE (the first R of D dims rotated; Qwen3.5 gated attention)
// ---------------------------------------------------------------------------------------------------------

constexpr int64_t kPrN = 37, kPrH = 3;

std::vector<int32_t> rope_positions(int64_t N, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (auto& p : pos) p = int32_t(rng.below(40000));
  pos[0] = 0, pos[1] = 1, pos[2] = 262143;
  return pos;
}

// The f32 recipe ops/cpu/rope.cpp documents, written out again: the rotation of the first R dims must keep
// exactly these bits (rope_forward's bits before partial rope existed, for R = D).
Vec rope_recipe(const Vec& x, const std::vector<int32_t>& pos, int64_t N, int64_t H, int64_t D, int64_t R,
                double theta, float sign) {
  Vec y = x;
  const int64_t h = R / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < h; ++j) {
      const float e = float(2 * j) / float(R);
      const float inv = 1.0f / float(std::pow(double(float(theta)), double(e)));
      const double angle = double(float(pos[size_t(n)]) * inv);
      const float c = float(std::cos(angle)), s = sign * float(std::sin(angle));
      for (int64_t hd = 0; hd < H; ++hd) {
        const size_t i = size_t((n * H + hd) * D + j);
        const float a = x[i], b = x[i + size_t(h)];
        y[i] = a * c - b * s;
        y[i + size_t(h)] = b * c + a * s;
      }
    }
  return y;
}

TEST(PartialRope, FullRotaryDimensionKeepsTheFullRopesBits) {
  for (int64_t D : {16, 64, 128, 256})
    for (double theta : {10000.0, 1e7}) {
      SCOPED_TRACE("D = " + std::to_string(D) + ", theta = " + std::to_string(theta));
      const auto pos = rope_positions(kPrN, 601);
      const Vec x = random_vector(size_t(kPrN * kPrH * D), 602, -3.f, 3.f);
      Vec full = x, partial = x;
      rope_forward(full.data(), pos.data(), kPrN, kPrH, D, theta);
      rope_partial_forward(partial.data(), pos.data(), kPrN, kPrH, D, D, theta);
      EXPECT_TRUE(bits_equal(full, rope_recipe(x, pos, kPrN, kPrH, D, D, theta, 1.f)));
      EXPECT_TRUE(bits_equal(full, partial));
      rope_backward(full.data(), pos.data(), kPrN, kPrH, D, theta);
      rope_partial_backward(partial.data(), pos.data(), kPrN, kPrH, D, D, theta);
      EXPECT_TRUE(bits_equal(full, partial));
      Vec recipe_bwd = rope_recipe(x, pos, kPrN, kPrH, D, D, theta, -1.f), bwd = x;
      rope_backward(bwd.data(), pos.data(), kPrN, kPrH, D, theta);
      EXPECT_TRUE(bits_equal(bwd, recipe_bwd));
    }
}

struct PartialCase {
  int64_t D, R;
};

class PartialRope : public ::testing::TestWithParam<PartialCase> {};

TEST_P(PartialRope, RotatesTheFirstRDimsAndPassesTheRest) {
  const auto [D, R] = GetParam();
  const double theta = 1e7;  // Qwen3.5's rope_theta
  const auto pos = rope_positions(kPrN, 603);
  const Vec x = random_vector(size_t(kPrN * kPrH * D), 604, -3.f, 3.f);
  Vec y = x;
  rope_partial_forward(y.data(), pos.data(), kPrN, kPrH, D, R, theta);
  EXPECT_TRUE(bits_equal(y, rope_recipe(x, pos, kPrN, kPrH, D, R, theta, 1.f)));
  const int64_t h = R / 2;
  for (int64_t n = 0; n < kPrN; ++n)
    for (int64_t hd = 0; hd < kPrH; ++hd) {
      const size_t o = size_t((n * kPrH + hd) * D);
      ASSERT_EQ(0, std::memcmp(&y[o + size_t(R)], &x[o + size_t(R)], size_t(D - R) * 4)) << "dims R..D-1 changed";
      for (int64_t j = 0; j < h; ++j) {
        // The frequency against exact double math, theta^(-2j/R) (HF's dim = R): the f32 exponent 2j/R is off
        // by <= u relative, which moves theta^-e by ln(theta)·e·u <= 16.2u; two roundings more: bound 2e-6
        // relative. The angle of positions up to 262143 then differs by up to ~0.3 rad from exact math, so the
        // rotation is checked at the f32 angle (the spec, HF's f32 recipe) with cos, sin and the products in
        // double: the op's f32 cos, sin and three roundings give <= 5u·(|a| + |b|), bound 1e-6·(|a| + |b|).
        // Measured worst 0.2 (frequency) and 0.1 (rotation) of the bounds.
        const float inv = 1.0f / float(std::pow(theta, double(float(2 * j) / float(R))));
        const double exact = std::pow(theta, -2.0 * double(j) / double(R));
        ASSERT_NEAR(double(inv), exact, 2e-6 * exact) << "j " << j;
        const double angle = double(float(pos[size_t(n)]) * inv), c = std::cos(angle), s = std::sin(angle);
        const double a = x[o + size_t(j)], b = x[o + size_t(j + h)], tol = 1e-6 * (std::fabs(a) + std::fabs(b));
        ASSERT_NEAR(y[o + size_t(j)], a * c - b * s, tol) << "n " << n << " j " << j;
        ASSERT_NEAR(y[o + size_t(j + h)], b * c + a * s, tol) << "n " << n << " j " << j;
      }
    }
}

TEST_P(PartialRope, BackwardIsTheTransposeAndMatchesFiniteDifferences) {
  const auto [D, R] = GetParam();
  const double theta = 1e7;
  const auto pos = rope_positions(kPrN, 605);
  const size_t n = size_t(kPrN * kPrH * D);
  Vec x = random_vector(n, 606), proj = random_vector(n, 607), y(n);
  auto loss = [&] {
    y = x;
    rope_partial_forward(y.data(), pos.data(), kPrN, kPrH, D, R, theta);
    return dot(y, proj);
  };
  Vec dx = proj;  // in place: dout -> din
  rope_partial_backward(dx.data(), pos.data(), kPrN, kPrH, D, R, theta);
  EXPECT_TRUE(bits_equal(dx, rope_recipe(proj, pos, kPrN, kPrH, D, R, theta, -1.f)));
  // Linear in x: no truncation; the rounding of the two outputs an element touches, ~u/(2h) ≈ 1e-5 relative
  // at the 1e-2 floor. Pass-through dims: exact. Measured worst 6.9e-5. Bound 1e-3; the forward rotation in
  // place of its transpose, or a rotated pass-through dim, is off by O(1).
  EXPECT_GRAD_OK(grad_check(x, dx, loss, 608, 256), 1e-3, "dx");
  // Backward undoes forward (an orthogonal rotation) up to f32 rounding, ~4u.
  Vec z = x;
  rope_partial_forward(z.data(), pos.data(), kPrN, kPrH, D, R, theta);
  rope_partial_backward(z.data(), pos.data(), kPrN, kPrH, D, R, theta);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(z[i], x[i], 1e-6) << i;
}

TEST_P(PartialRope, TableOfRIsTheAnglesThePartialRopeTurnsBy) {
  // A head holding a = 1, b = 0 in every pair turns into (cos, sin) exactly (1·c − 0·s = c, 0·c + 1·s = s).
  const auto [D, R] = GetParam();
  const int64_t P = 50, h = R / 2;
  Vec cos_t(size_t(P * h)), sin_t(size_t(P * h));
  rope_table(cos_t.data(), sin_t.data(), P, R, 1e7);
  for (int32_t p = 0; p < P; ++p) {
    Vec x(size_t(D), 0.f);
    for (int64_t j = 0; j < h; ++j) x[size_t(j)] = 1.f;
    rope_partial_forward(x.data(), &p, 1, 1, D, R, 1e7);
    ASSERT_EQ(0, std::memcmp(x.data(), &cos_t[size_t(p * h)], size_t(h) * 4)) << "position " << p;
    ASSERT_EQ(0, std::memcmp(x.data() + h, &sin_t[size_t(p * h)], size_t(h) * 4)) << "position " << p;
  }
}

// Qwen3.5: D = 256, R = 64 (factor 0.25); odd halves; R = D − 2; the smallest R.
INSTANTIATE_TEST_SUITE_P(Shapes, PartialRope,
                         ::testing::Values(PartialCase{256, 64}, PartialCase{38, 14}, PartialCase{16, 14},
                                           PartialCase{10, 2}));

TEST(PartialRope, BitsIndependentOfThreadCount) {
  const int64_t N = 500, H = 4, D = 256, R = 64;
  const auto pos = rope_positions(N, 609);
  const Vec x = random_vector(size_t(N * H * D), 610);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec y = x;
    rope_partial_forward(y.data(), pos.data(), N, H, D, R, 1e7);
    Vec z = y;
    rope_partial_backward(z.data(), pos.data(), N, H, D, R, 1e4);
    return concat({&y, &z});
  });
  EXPECT_TRUE(bits_equal(a, b));
}

TEST(PartialRope, BadRotaryDimensionsAreErrors) {
  Vec x(64, 1.f);
  int32_t pos[2] = {0, 1};
  EXPECT_THROW(rope_partial_forward(x.data(), pos, 2, 1, 16, 7, 1e4), Error);   // odd R
  EXPECT_THROW(rope_partial_forward(x.data(), pos, 2, 1, 16, 18, 1e4), Error);  // R > D
  EXPECT_THROW(rope_partial_forward(x.data(), pos, 2, 1, 16, 0, 1e4), Error);
  EXPECT_THROW(rope_partial_backward(x.data(), pos, 2, 1, 16, -2, 1e4), Error);
}

}  // namespace
}  // namespace lt
