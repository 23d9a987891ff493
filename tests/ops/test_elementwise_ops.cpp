// Embedding, RMSNorm, RoPE, SwiGLU: forward against plain double references on odd shapes, every gradient by
// finite differences, the gradient contract (parameter grads +=, activation grads =), determinism across
// thread counts, and bad input.
//
// Legend: N tokens, C channels, V vocabulary, H heads, D head dimension, I MLP width.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/embedding.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

using testing::dot;
using testing::bits_equal;
using testing::grad_check;
using testing::random_vector;
using Vec = std::vector<float>;

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

// ---------------------------------------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------------------------------------

constexpr int64_t kEmbN = 74, kEmbC = 67, kEmbV = 101;

// N ids in [0, V), with repeats guaranteed (ids 7 and 3 appear several times).
std::vector<int32_t> random_ids(int64_t N, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& id : ids) id = int32_t(rng.below(uint64_t(V)));
  for (int64_t n = 0; n < N; n += 9) ids[size_t(n)] = n % 2 ? 7 : 3;
  return ids;
}

TEST(Embedding, ForwardCopiesRows) {
  auto ids = random_ids(kEmbN, kEmbV, 1);
  Vec table = random_vector(size_t(kEmbV * kEmbC), 2), out(size_t(kEmbN * kEmbC), NAN);
  embedding_forward(out.data(), ids.data(), table.data(), kEmbN, kEmbC, kEmbV);
  for (int64_t n = 0; n < kEmbN; ++n)
    ASSERT_EQ(0, std::memcmp(&out[size_t(n * kEmbC)], &table[size_t(ids[size_t(n)] * kEmbC)], kEmbC * 4)) << n;
}

TEST(Embedding, BackwardMatchesReferenceBitwise) {
  auto ids = random_ids(kEmbN, kEmbV, 3);
  Vec dout = random_vector(size_t(kEmbN * kEmbC), 4), start = random_vector(size_t(kEmbV * kEmbC), 5);
  Vec dtable = start;
  embedding_backward(dtable.data(), dout.data(), ids.data(), kEmbN, kEmbC, kEmbV);
  // The documented order: per id, its rows summed in double in token order, added once in f32. So the
  // match is exact; rows of ids never seen stay untouched.
  for (int64_t v = 0; v < kEmbV; ++v)
    for (int64_t c = 0; c < kEmbC; ++c) {
      double s = 0;
      for (int64_t n = 0; n < kEmbN; ++n)
        if (ids[size_t(n)] == v) s += double(dout[size_t(n * kEmbC + c)]);
      ASSERT_EQ(dtable[size_t(v * kEmbC + c)], start[size_t(v * kEmbC + c)] + float(s)) << "id " << v << " c " << c;
    }
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  auto ids = random_ids(kEmbN, kEmbV, 6);
  Vec table = random_vector(size_t(kEmbV * kEmbC), 7), proj = random_vector(size_t(kEmbN * kEmbC), 8);
  Vec out(size_t(kEmbN * kEmbC)), dtable(size_t(kEmbV * kEmbC), 0.f);
  auto loss = [&] {
    embedding_forward(out.data(), ids.data(), table.data(), kEmbN, kEmbC, kEmbV);
    return dot(out, proj);
  };
  embedding_backward(dtable.data(), proj.data(), ids.data(), kEmbN, kEmbC, kEmbV);
  // A copy is linear and exact: the difference quotient is exact up to the double loss sum (~1e-15); 1e-6
  // only leaves room for that. Probes 200 elements so repeated ids and unused rows (gradient 0) are hit.
  EXPECT_GRAD_OK(grad_check(table, dtable, loss, 9, 200), 1e-6, "dtable");
}

TEST(Embedding, BackwardAccumulatesExactly) {
  auto ids = random_ids(kEmbN, kEmbV, 10);
  Vec dout = random_vector(size_t(kEmbN * kEmbC), 11), d1(size_t(kEmbV * kEmbC), 0.f);
  embedding_backward(d1.data(), dout.data(), ids.data(), kEmbN, kEmbC, kEmbV);
  Vec d2 = d1;
  embedding_backward(d2.data(), dout.data(), ids.data(), kEmbN, kEmbC, kEmbV);
  for (auto& v : d1) v += v;  // each call adds one f32 value per element: twice is exactly 2x
  EXPECT_TRUE(bits_equal(d1, d2));
}

TEST(Embedding, IdOutOfRangeIsAnErrorNamingIt) {
  Vec table = random_vector(size_t(kEmbV * kEmbC), 12), out(size_t(kEmbN * kEmbC));
  for (int32_t bad : {int32_t(kEmbV), int32_t(-1), int32_t(1 << 30)}) {
    auto ids = random_ids(kEmbN, kEmbV, 13);
    ids[41] = bad;
    Vec dtable = table;
    for (int pass = 0; pass < 2; ++pass) {
      try {
        if (pass == 0) embedding_forward(out.data(), ids.data(), table.data(), kEmbN, kEmbC, kEmbV);
        else embedding_backward(dtable.data(), out.data(), ids.data(), kEmbN, kEmbC, kEmbV);
        ADD_FAILURE() << "no error for id " << bad;
      } catch (const Error& e) {
        std::string msg = e.what();
        EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(msg.find("position 41"), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(kEmbV)), std::string::npos) << msg;
      }
    }
    EXPECT_TRUE(bits_equal(dtable, table)) << "ids are checked before anything is written";
  }
}

TEST(Embedding, BitsIndependentOfThreadCount) {
  const int64_t N = 500, C = 1000, V = 50;  // many repeats, several column blocks
  auto ids = random_ids(N, V, 14);
  Vec dout = random_vector(size_t(N * C), 15);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec d(size_t(V * C), 0.5f);
    embedding_backward(d.data(), dout.data(), ids.data(), N, C, V);
    return d;
  });
  EXPECT_TRUE(bits_equal(a, b));
}

TEST(Embedding, RowsAreEachIdsSummedGradientAndTheirAddIsTheBackward) {
  // The streamed step's halves (ops/embedding.h): rows[i] of id present[i] is its single token's row bit for bit, or
  // its tokens' rows summed in double in token order and rounded once; adding them into the table gives the
  // backward's bits. C 200: not a multiple of the 128-column accumulator block.
  const int64_t N = 300, C = 200, V = 37;
  auto ids = random_ids(N, V, 16);
  ids[5] = int32_t(V - 1);  // an id seen once (the others repeat: 300 tokens over 37 ids, 3 and 7 every 9th)
  for (int64_t n = 0; n < N; ++n)
    if (n != 5 && ids[size_t(n)] == V - 1) ids[size_t(n)] = 0;
  Vec dout = random_vector(size_t(N * C), 17), start = random_vector(size_t(V * C), 18);
  const TokenGroups g = group_tokens_by_id(ids.data(), N, V);
  const int64_t P = int64_t(g.present.size());
  Vec rows(size_t(P * C), NAN);
  embedding_grad_rows(rows.data(), dout.data(), g.start.data(), g.order.data(), P, C);
  bool seen_once = false;
  for (int64_t i = 0; i < P; ++i) {
    const int32_t v = g.present[size_t(i)];
    int64_t count = 0;
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      count = 0;
      for (int64_t n = 0; n < N; ++n)
        if (ids[size_t(n)] == v) sum += double(dout[size_t(n * C + c)]), ++count;
      const float want = float(sum);
      ASSERT_EQ(std::memcmp(&rows[size_t(i * C + c)], &want, 4), 0) << "id " << v << " column " << c;
    }
    seen_once |= count == 1;
  }
  EXPECT_TRUE(seen_once);
  Vec whole = start, added = start;
  embedding_backward(whole.data(), dout.data(), ids.data(), N, C, V);
  embedding_add_rows(added.data(), rows.data(), g.present.data(), P, C, 0, V * C);
  EXPECT_TRUE(bits_equal(whole, added));
}

TEST(Embedding, TheBackwardsBatchesOfIdsGiveTheWholeRowsAdd) {
  // embedding_backward runs the halves on batches of ids (4 MiB of rows, at least 64 ids): at C 16384 a batch is 64
  // ids, so 150 ids present make three, the last one short.
  const int64_t N = 400, C = 16384, V = 150;
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) ids[size_t(n)] = int32_t((n * 7) % V);  // every id, some twice or three times
  Vec dout = random_vector(size_t(N * C), 19), start = random_vector(size_t(V * C), 20);
  const TokenGroups g = group_tokens_by_id(ids.data(), N, V);
  const int64_t P = int64_t(g.present.size());
  ASSERT_EQ(P, V);
  Vec rows(size_t(P * C)), whole = start, batched = start;
  embedding_grad_rows(rows.data(), dout.data(), g.start.data(), g.order.data(), P, C);
  embedding_add_rows(whole.data(), rows.data(), g.present.data(), P, C, 0, V * C);
  embedding_backward(batched.data(), dout.data(), ids.data(), N, C, V);
  EXPECT_TRUE(bits_equal(whole, batched));
}

TEST(Embedding, RowsBitsIndependentOfThreadCount) {
  const int64_t N = 500, C = 1000, V = 50;  // many repeats, several accumulator blocks, several id chunks
  auto ids = random_ids(N, V, 14);
  for (int64_t n = 0; n < N; n += 2) ids[size_t(n)] = int32_t(V + n);  // and many ids seen once
  const int64_t Vw = V + N;
  Vec dout = random_vector(size_t(N * C), 15);
  const TokenGroups g = group_tokens_by_id(ids.data(), N, Vw);
  const int64_t P = int64_t(g.present.size());
  auto [a, b] = with_1_and_2_threads([&] {
    Vec rows(size_t(P * C), NAN), d(size_t(Vw * C), 0.5f);
    embedding_grad_rows(rows.data(), dout.data(), g.start.data(), g.order.data(), P, C);
    embedding_add_rows(d.data(), rows.data(), g.present.data(), P, C, 0, Vw * C);
    rows.insert(rows.end(), d.begin(), d.end());
    return rows;
  });
  EXPECT_TRUE(bits_equal(a, b));
}

TEST(Embedding, RangeAddsExactlyWhatTheWholeAddAddsThereAndNothingElsewhere) {
  // A data-parallel owner adds every rank's rows into its part of the table (dist/data_parallel.h): ranges that cut
  // rows anywhere, empty ones, the whole table.
  const int64_t N = 300, C = 200, V = 37;
  auto ids = random_ids(N, V, 16);
  Vec dout = random_vector(size_t(N * C), 17), start = random_vector(size_t(V * C), 18);
  const TokenGroups g = group_tokens_by_id(ids.data(), N, V);
  const int64_t P = int64_t(g.present.size());
  Vec rows(size_t(P * C));
  embedding_grad_rows(rows.data(), dout.data(), g.start.data(), g.order.data(), P, C);
  Vec whole = start;
  embedding_add_rows(whole.data(), rows.data(), g.present.data(), P, C, 0, V * C);
  for (auto [first, last] : std::vector<std::pair<int64_t, int64_t>>{
           {0, V * C}, {0, 1}, {77, 77}, {C - 3, 2 * C + 5}, {131, 5 * C - 1}, {V * C - 129, V * C}, {1000, 4321}}) {
    Vec part = start;
    embedding_add_rows(part.data(), rows.data(), g.present.data(), P, C, first, last);
    for (int64_t i = 0; i < V * C; ++i) {
      const float want = i >= first && i < last ? whole[size_t(i)] : start[size_t(i)];
      ASSERT_EQ(std::memcmp(&part[size_t(i)], &want, 4), 0) << "range [" << first << ", " << last << ") element " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// RMSNorm
// ---------------------------------------------------------------------------------------------------------

struct NormShape {
  int64_t rows, C;
};

class RmsNorm : public ::testing::TestWithParam<NormShape> {};
constexpr float kEps = 1e-6f;

TEST_P(RmsNorm, ForwardMatchesReference) {
  auto [rows, C] = GetParam();
  Vec x = random_vector(size_t(rows * C), 21, -2.f, 2.f), w = random_vector(size_t(C), 22, 0.5f, 1.5f);
  std::fill(x.begin() + 3 * C, x.begin() + 4 * C, 0.f);  // an all-zero row: rstd = 1/sqrt(eps), out = 0
  Vec y(size_t(rows * C), NAN), rstd(size_t(rows), NAN);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, C, kEps);
  // Error budget (f32, u = 2^-24 ≈ 6e-8): the sum of squares adds positive terms in 16 lanes of ceil(C/16)
  // terms and a 4-level tree, relative error <= (C/16 + 5)·u; mean, +eps, sqrt, 1/x add ~4u and sqrt halves
  // the sum's error. For C <= 1000 that is <= 3e-6 on rstd; out adds two roundings. Bound: 5e-6 relative.
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[size_t(r * C + c)]) * x[size_t(r * C + c)];
    const double s = 1.0 / std::sqrt(ss / double(C) + double(kEps));
    ASSERT_NEAR(rstd[size_t(r)], s, 5e-6 * s) << "row " << r;
    for (int64_t c = 0; c < C; ++c) {
      const double ref = double(x[size_t(r * C + c)]) * s * w[size_t(c)];
      ASSERT_NEAR(y[size_t(r * C + c)], ref, 5e-6 * std::fabs(ref)) << "row " << r << " c " << c;
    }
  }
}

TEST_P(RmsNorm, GradientsMatchFiniteDifferencesAndReference) {
  auto [rows, C] = GetParam();
  Vec x = random_vector(size_t(rows * C), 23, -2.f, 2.f), w = random_vector(size_t(C), 24, 0.5f, 1.5f);
  Vec proj = random_vector(size_t(rows * C), 25);
  Vec y(size_t(rows * C)), rstd(static_cast<size_t>(rows));
  auto loss = [&] {
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, C, kEps);
    return dot(y, proj);
  };
  loss();
  Vec dx(size_t(rows * C), NAN), dw(size_t(C), 0.f);
  rmsnorm_backward(dx.data(), dw.data(), proj.data(), x.data(), w.data(), rstd.data(), rows, C);
  // Against the closed form in double: din = r (w g - x r² mean(w g x)), dw = Σ g x r. f32 evaluation
  // (a C-term dot, a few roundings; din can cancel, so it is measured in L2 over the whole tensor).
  Vec dx_ref(dx.size()), dw_ref(static_cast<size_t>(C));
  std::vector<double> dw_acc(size_t(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x[size_t(r * C)];
    const float* g = &proj[size_t(r * C)];
    double ss = 0, m = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
    const double s = 1.0 / std::sqrt(ss / double(C) + double(kEps));
    for (int64_t c = 0; c < C; ++c) m += double(w[size_t(c)]) * g[c] * xr[c] / double(C);
    for (int64_t c = 0; c < C; ++c) {
      dx_ref[size_t(r * C + c)] = float(s * (double(w[size_t(c)]) * g[c] - double(xr[c]) * s * s * m));
      dw_acc[size_t(c)] += double(g[c]) * xr[c] * s;
    }
  }
  for (int64_t c = 0; c < C; ++c) dw_ref[size_t(c)] = float(dw_acc[size_t(c)]);
  EXPECT_LT(testing::rel_l2(dx.data(), dx_ref.data(), dx.size()), 1e-5);
  EXPECT_LT(testing::rel_l2(dw.data(), dw_ref.data(), dw.size()), 1e-5);
  // Finite differences (h = 1e-2). dweight: the loss is linear in w (no truncation error); only the f32
  // rounding of the `rows` outputs one weight touches, measured <= 7e-5. din: a perturbation moves rstd by
  // ~x·h/(ms·C) relative while rstd's own f32 rounding is ~sqrt(C/16)·u and coherent over the row's C
  // outputs, so the noise grows with C: measured max 6e-4 at C <= 67 and 5e-3 at C = 1000 with the default
  // 1e-2 floor. Gradients here are O(0.3..1), so din uses a 0.1 floor (absolute error <= 3e-4 on small
  // elements); measured then <= 1.3e-3. Bound 3e-3. A wrong term in the formula gives O(0.1..1).
  EXPECT_GRAD_OK(grad_check(x, dx, loss, 26, 128, 1e-2f, 0.1), 3e-3, "din");
  EXPECT_GRAD_OK(grad_check(w, dw, loss, 27), 1e-3, "dweight");
}

TEST_P(RmsNorm, WeightGradAccumulatesInputGradOverwrites) {
  auto [rows, C] = GetParam();
  Vec x = random_vector(size_t(rows * C), 28), w = random_vector(size_t(C), 29), g = random_vector(size_t(rows * C), 30);
  Vec y(size_t(rows * C)), rstd(static_cast<size_t>(rows));
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, C, kEps);
  Vec dx(size_t(rows * C), NAN), dw(size_t(C), 0.f);
  rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), rows, C);
  for (float v : dx) ASSERT_FALSE(std::isnan(v)) << "din not fully written";
  Vec dx1 = dx, dw2 = dw;
  std::fill(dx.begin(), dx.end(), NAN);
  rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), rows, C);
  for (auto& v : dw2) v += v;  // one f32 add per call: exactly 2x
  EXPECT_TRUE(bits_equal(dw, dw2));
  EXPECT_TRUE(bits_equal(dx, dx1));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(NormShape{74, 67}, NormShape{37, 48}, NormShape{37 * 6, 16},
                                           NormShape{5, 1000}));

TEST(RmsNorm, BitsIndependentOfThreadCount) {
  const int64_t rows = 5000, C = 67;  // several row chunks in both directions
  Vec x = random_vector(size_t(rows * C), 31), w = random_vector(size_t(C), 32), g = random_vector(size_t(rows * C), 33);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec y(size_t(rows * C)), rstd(static_cast<size_t>(rows)), dx(size_t(rows * C)), dw(size_t(C), 0.25f);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, C, kEps);
    rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), rows, C);
    Vec all = y;
    all.insert(all.end(), rstd.begin(), rstd.end());
    all.insert(all.end(), dx.begin(), dx.end());
    all.insert(all.end(), dw.begin(), dw.end());
    return all;
  });
  EXPECT_TRUE(bits_equal(a, b));
}

// ---------------------------------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------------------------------

constexpr int64_t kRopeN = 37, kRopeH = 6, kRopeD = 16;
constexpr double kTheta = 10000.0;

std::vector<int32_t> random_positions(int64_t N, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (auto& p : pos) p = int32_t(rng.below(4096));
  pos[0] = 0;
  pos[1] = 1;
  return pos;
}

TEST(Rope, ForwardMatchesReference) {
  auto pos = random_positions(kRopeN, 41);
  Vec x = random_vector(size_t(kRopeN * kRopeH * kRopeD), 42), y = x;
  rope_forward(y.data(), pos.data(), kRopeN, kRopeH, kRopeD, kTheta);
  const int64_t h = kRopeD / 2;
  for (int64_t n = 0; n < kRopeN; ++n)
    for (int64_t j = 0; j < h; ++j) {
      // HF's f32 recipe for the angle (the spec, see rope.h); cos/sin and the rotation in double.
      const float inv = 1.0f / float(std::pow(kTheta, double(float(2 * j) / float(kRopeD))));
      const double angle = double(float(pos[size_t(n)]) * inv), c = std::cos(angle), s = std::sin(angle);
      for (int64_t hd = 0; hd < kRopeH; ++hd) {
        const size_t i = size_t((n * kRopeH + hd) * kRopeD + j);
        const double a = x[i], b = x[i + size_t(h)];
        // f32: cos, sin rounded (u each), two products and a sum (3u): <= 5u·(|a| + |b|) ≈ 3e-7; the sum
        // may cancel, so the bound scales with the inputs, not the output.
        const double tol = 1e-6 * (std::fabs(a) + std::fabs(b));
        ASSERT_NEAR(y[i], a * c - b * s, tol) << "n " << n << " head " << hd << " j " << j;
        ASSERT_NEAR(y[i + size_t(h)], b * c + a * s, tol) << "n " << n << " head " << hd << " j " << j;
      }
    }
}

TEST(Rope, FrequenciesAreThetaPowers) {
  // At position 1 a unit vector (1 in the first half) turns into (cos f_j, sin f_j), f_j = theta^(-2j/D):
  // checks the frequency formula against exact double math, independent of the f32 recipe (within 1e-6).
  const int64_t D = 128, h = D / 2;
  Vec x(size_t(D), 0.f);
  for (int64_t j = 0; j < h; ++j) x[size_t(j)] = 1.f;
  const int32_t pos = 1;
  rope_forward(x.data(), &pos, 1, 1, D, 500000.0);
  for (int64_t j = 0; j < h; ++j) {
    const double f = std::pow(500000.0, -2.0 * double(j) / double(D));
    EXPECT_NEAR(x[size_t(j)], std::cos(f), 1e-6) << j;
    EXPECT_NEAR(x[size_t(j + h)], std::sin(f), 1e-6) << j;
  }
}

TEST(Rope, PositionZeroIsIdentityAndBackwardInvertsForward) {
  const size_t n = size_t(kRopeN * kRopeH * kRopeD);
  Vec x = random_vector(n, 43), y = x;
  std::vector<int32_t> zeros(size_t(kRopeN), 0);
  rope_forward(y.data(), zeros.data(), kRopeN, kRopeH, kRopeD, kTheta);
  EXPECT_TRUE(bits_equal(x, y)) << "cos 0 = 1, sin 0 = 0 must give x exactly";
  // The rotation is orthogonal, so backward (its transpose) undoes forward up to f32 rounding (~4u).
  auto pos = random_positions(kRopeN, 44);
  rope_forward(y.data(), pos.data(), kRopeN, kRopeH, kRopeD, kTheta);
  rope_backward(y.data(), pos.data(), kRopeN, kRopeH, kRopeD, kTheta);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], x[i], 1e-6) << i;
}

// Finite differences of dot(rope(x), proj) against rope_backward(proj): linear in x, so no truncation error; rounding
// of the two outputs an element touches is ~1e-7/(2h) ≈ 1e-5. Measured max 4e-5; bound 1e-3 (YaRN's outputs are 1.35x
// larger, the same bound). Forward's rotation in place of its transpose gives O(1).
void expect_rope_gradient(const RopeSpec& rope, uint64_t seed) {
  auto pos = random_positions(kRopeN, seed);
  const size_t n = size_t(kRopeN * kRopeH * kRopeD);
  Vec x = random_vector(n, seed + 1), proj = random_vector(n, seed + 2), y(n);
  auto loss = [&] {
    y = x;
    rope_forward(y.data(), pos.data(), kRopeN, kRopeH, kRopeD, rope);
    return dot(y, proj);
  };
  Vec dx = proj;  // in place: dout -> din
  rope_backward(dx.data(), pos.data(), kRopeN, kRopeH, kRopeD, rope);
  EXPECT_GRAD_OK(grad_check(x, dx, loss, seed + 3, 128), 1e-3, "dx");
}

TEST(Rope, GradientMatchesFiniteDifferences) { expect_rope_gradient(kTheta, 45); }

// YaRN (GPT-OSS's rope_scaling: factor 32, β_fast 32, β_slow 1, original 4096, truncate false): at position 1 a unit
// vector turns into af·(cos f_j, sin f_j), with f_j transformers' _compute_yarn_parameters evaluated here in
// double and af = 0.1·ln 32 + 1. The op's f32 recipe differs from double by a few ulp of f_j: within 1e-6.
TEST(Rope, YarnFollowsTransformersFrequenciesAndAttentionFactor) {
  const int64_t D = 64, h = D / 2;
  const double theta = 150000.0, factor = 32.0;
  for (bool truncate : {false, true}) {
    const RopeSpec yarn = RopeSpec::yarn(theta, factor, 32.0, 1.0, 4096, truncate);
    EXPECT_NEAR(yarn.attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-15);
    auto dim_of = [&](double rotations) {
      return double(D) * std::log(4096.0 / (rotations * 2 * M_PI)) / (2 * std::log(theta));
    };
    double low = dim_of(32.0), high = dim_of(1.0);
    if (truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, double(D - 1));
    Vec x(size_t(D), 0.f);
    for (int64_t j = 0; j < h; ++j) x[size_t(j)] = 1.f;
    const int32_t pos = 1;
    rope_forward(x.data(), &pos, 1, 1, D, yarn);
    int interpolated = 0, blended = 0;
    for (int64_t j = 0; j < h; ++j) {
      const double pos_freq = std::pow(theta, 2.0 * double(j) / double(D));
      const double ramp = std::clamp((double(j) - low) / (high - low), 0.0, 1.0);
      const double f = 1.0 / (factor * pos_freq) * ramp + 1.0 / pos_freq * (1.0 - ramp);
      EXPECT_NEAR(x[size_t(j)], yarn.attention_factor * std::cos(f), 1e-6) << j;
      EXPECT_NEAR(x[size_t(j + h)], yarn.attention_factor * std::sin(f), 1e-6) << j;
      interpolated += ramp == 1.0;
      blended += ramp > 0 && ramp < 1;
    }
    EXPECT_GT(interpolated, 0) << "the slow dims are interpolated";
    EXPECT_GT(blended, 0) << "some dims are blended";
  }
  // Factor 1 is plain RoPE, bit for bit.
  auto p = random_positions(kRopeN, 49);
  Vec a = random_vector(size_t(kRopeN * kRopeH * kRopeD), 50), b = a;
  rope_forward(a.data(), p.data(), kRopeN, kRopeH, kRopeD, kTheta);
  rope_forward(b.data(), p.data(), kRopeN, kRopeH, kRopeD, RopeSpec::yarn(kTheta, 1.0, 32, 1, 4096, true));
  EXPECT_TRUE(bits_equal(a, b));
}

// The backward of the scaled rotation af·R is af·Rᵀ.
TEST(Rope, YarnGradientMatchesFiniteDifferences) {
  expect_rope_gradient(RopeSpec::yarn(150000.0, 32.0, 32.0, 1.0, 4096, false), 51);
}

TEST(Rope, BadSizesAreErrors) {
  Vec x(30, 1.f);
  int32_t pos[2] = {0, 1};
  EXPECT_THROW(rope_forward(x.data(), pos, 2, 1, 15, kTheta), Error);  // odd D
  EXPECT_THROW(rope_backward(x.data(), pos, 2, 1, 15, kTheta), Error);
  EXPECT_THROW(rope_forward(x.data(), pos, 2, 1, 0, kTheta), Error);
}

TEST(Rope, BitsIndependentOfThreadCount) {
  const int64_t N = 500;
  auto pos = random_positions(N, 49);
  Vec x = random_vector(size_t(N * kRopeH * kRopeD), 50);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec y = x;
    rope_forward(y.data(), pos.data(), N, kRopeH, kRopeD, kTheta);
    rope_backward(y.data(), pos.data(), N, kRopeH, kRopeD, 1e6);
    return y;
  });
  EXPECT_TRUE(bits_equal(a, b));
}

TEST(Rope, RepeatedPositionsFromATableAreTheSameBits) {
  // A batch of B rows of positions 3..T+2 (and one packed row whose documents restart at 0) takes the
  // per-position table (distinct positions <= N/2); each row alone has no repeats and computes cos/sin per
  // token. Same function of the same position: bitwise equal, forward, backward and partial rope.
  const int64_t B = 5, T = 23, N = B * T, R = kRopeD / 2;
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) pos[size_t(n)] = int32_t(n % T + 3);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t < 9 ? t : t - 9);  // row 0: two documents
  Vec x = random_vector(size_t(N * kRopeH * kRopeD), 51);
  for (int pass = 0; pass < 4; ++pass) {
    auto op = [&](float* y, const int32_t* p, int64_t n) {
      if (pass == 0) rope_forward(y, p, n, kRopeH, kRopeD, kTheta);
      if (pass == 1) rope_backward(y, p, n, kRopeH, kRopeD, kTheta);
      if (pass == 2) rope_partial_forward(y, p, n, kRopeH, kRopeD, R, kTheta);
      if (pass == 3) rope_partial_backward(y, p, n, kRopeH, kRopeD, R, kTheta);
    };
    Vec all = x, rows = x;
    op(all.data(), pos.data(), N);
    for (int64_t b = 0; b < B; ++b) op(rows.data() + b * T * kRopeH * kRopeD, pos.data() + b * T, T);
    EXPECT_TRUE(bits_equal(all, rows)) << "pass " << pass;
    EXPECT_FALSE(bits_equal(all, x)) << "pass " << pass;
  }
}

// ---------------------------------------------------------------------------------------------------------
// SwiGLU
// ---------------------------------------------------------------------------------------------------------

constexpr int64_t kSwiN = 37 * 67;  // N·I

double sigmoid_ref(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// Gates: a dense sweep over [-90, 90] (all of exp's range, both signs, the clamp at 87.3) then random.
Vec gate_values(int64_t n, uint64_t seed) {
  Vec g = random_vector(size_t(n), seed, -8.f, 8.f);
  for (int64_t i = 0; i < n / 2; ++i) g[size_t(i)] = -90.f + 180.f * float(i) / float(n / 2);
  g[1] = 0.f, g[2] = -0.f, g[3] = 1e30f, g[4] = -1e30f, g[5] = 1e-30f;
  return g;
}

TEST(SwiGLU, ForwardMatchesReference) {
  Vec g = gate_values(kSwiN, 51), u = random_vector(size_t(kSwiN), 52), out(size_t(kSwiN), NAN);
  swiglu_forward(out.data(), g.data(), u.data(), kSwiN);
  for (int64_t i = 0; i < kSwiN; ++i) {
    const double ref = double(g[size_t(i)]) * sigmoid_ref(g[size_t(i)]) * u[size_t(i)];
    // silu (own exp, sigmoid's add and divide, g·σ) measured <= 3.7u (u = 2^-24) against double over every
    // 64th f32 in [-87.3, 87.3]; ·up adds one rounding: <= 4.7u ≈ 2.8e-7. Bound 5e-7 relative (8u). The
    // 1e-36 floor covers gates below -87.3, where ours is 0 and the true value is below 1e-36.
    ASSERT_NEAR(out[size_t(i)], ref, 5e-7 * std::fabs(ref) + 1e-36) << "gate " << g[size_t(i)];
  }
}

TEST(SwiGLU, BackwardMatchesReferenceAndFiniteDifferences) {
  Vec g = gate_values(kSwiN, 53), u = random_vector(size_t(kSwiN), 54), d = random_vector(size_t(kSwiN), 55);
  Vec dg(size_t(kSwiN), NAN), du(size_t(kSwiN), NAN);
  swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), kSwiN);
  for (int64_t i = 0; i < kSwiN; ++i) {
    const double gi = g[size_t(i)], s = sigmoid_ref(gi), du_ = double(d[size_t(i)]) * u[size_t(i)];
    // 1 + g(1 - σ) cancels near g ≈ -1.28, so the bound scales with the size of its terms. σ(1 + g(1-σ))
    // measured <= 4.4u of that scale (1 - σ is taken as σ(-g), never by subtraction); dout·up and the last
    // product add 2u: bound 6e-7 ≈ 10u. dup = dout·silu: 4.7u as the forward, bound 5e-7.
    const double scale = std::fabs(du_) * s * (1.0 + std::fabs(gi) * (1.0 - s));
    ASSERT_NEAR(dg[size_t(i)], du_ * s * (1.0 + gi * (1.0 - s)), 6e-7 * scale + 1e-36) << "gate " << gi;
    const double dup_ref = double(d[size_t(i)]) * gi * s;
    ASSERT_NEAR(du[size_t(i)], dup_ref, 5e-7 * std::fabs(dup_ref) + 1e-36) << "gate " << gi;
  }
  // Finite differences on moderate gates (the sweep's ±90 saturates and says nothing).
  Vec gm = random_vector(size_t(kSwiN), 56, -4.f, 4.f), out(static_cast<size_t>(kSwiN));
  auto loss = [&] {
    swiglu_forward(out.data(), gm.data(), u.data(), kSwiN);
    return dot(out, d);
  };
  swiglu_backward(dg.data(), du.data(), d.data(), gm.data(), u.data(), kSwiN);
  // Each element touches one output. up: linear, only f32 rounding of that output, ~6e-8·4/(2h) ≈ 1e-5
  // absolute, ≤ 1e-3 at the 1e-2 floor. gate: plus truncation h²/6·|silu'''| ≤ 1e-4/6·0.5 ≈ 1e-5 absolute.
  // Measured max 1.7e-4 (dgate), 2e-6 (dup). Bound 3e-3; a wrong derivative (e.g. σ in place of
  // σ(1 + g(1-σ))) is off by O(1).
  EXPECT_GRAD_OK(grad_check(gm, dg, loss, 57, 128), 3e-3, "dgate");
  EXPECT_GRAD_OK(grad_check(u, du, loss, 58, 128), 3e-3, "dup");
}

// GPT-OSS's clamped SwiGLU against double, finite differences away from the clamps, and the clamps' zero gradients.
TEST(ClampedSwiGLU, MatchesReferenceAndFiniteDifferences) {
  const float alpha = 1.702f, limit = 7.0f;
  // Gates and ups over [-12, 12]: both sides of each clamp, and the exact bounds.
  Vec g = random_vector(size_t(kSwiN), 70, -12.f, 12.f), u = random_vector(size_t(kSwiN), 71, -12.f, 12.f);
  Vec d = random_vector(size_t(kSwiN), 72);
  g[0] = limit, u[1] = limit, u[2] = -limit, g[3] = 0.f;
  Vec out(size_t(kSwiN), NAN), dg(size_t(kSwiN), NAN), du(size_t(kSwiN), NAN);
  clamped_swiglu_forward(out.data(), g.data(), u.data(), kSwiN, alpha, limit);
  clamped_swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), kSwiN, alpha, limit);
  int clamped_gate = 0, clamped_up = 0;
  for (int64_t i = 0; i < kSwiN; ++i) {
    const double gi = g[size_t(i)], ui = u[size_t(i)];
    const double gc = std::min(gi, double(limit)), uc = std::clamp(ui, -double(limit), double(limit));
    const double a = double(alpha) * gc, s = sigmoid_ref(a);
    const double ref = (uc + 1.0) * gc * s;
    // σ's 3.7u, the products and the +1: <= 8u of the terms' size (u' + 1 may cancel near u = -1); and a = α·g
    // rounded in f32 (u) moves σ(a) by |a|·(1 − σ)·u relative: 16u at the clamp's -9.6. Bound (10 + |a|)·u.
    const double rel = (10.0 + std::fabs(a)) * 6e-8;
    const double scale = (std::fabs(uc) + 1.0) * std::fabs(gc) * s;
    ASSERT_NEAR(out[size_t(i)], ref, rel * scale + 1e-30) << "gate " << gi << " up " << ui;
    const double dg_ref = gi <= limit ? double(d[size_t(i)]) * (uc + 1.0) * s * (1.0 + a * (1.0 - s)) : 0.0;
    const double dg_scale = std::fabs(double(d[size_t(i)])) * (std::fabs(uc) + 1.0) * s * (1.0 + std::fabs(a));
    ASSERT_NEAR(dg[size_t(i)], dg_ref, 2 * rel * dg_scale + 1e-30) << "gate " << gi << " up " << ui;
    const double du_ref = ui >= -limit && ui <= limit ? double(d[size_t(i)]) * gc * s : 0.0;
    ASSERT_NEAR(du[size_t(i)], du_ref, rel * std::fabs(du_ref) + 1e-30) << "gate " << gi << " up " << ui;
    clamped_gate += gi > limit;
    clamped_up += ui > limit || ui < -limit;
    if (gi > limit) ASSERT_EQ(dg[size_t(i)], 0.0f);
    if (ui > limit || ui < -limit) ASSERT_EQ(du[size_t(i)], 0.0f);
  }
  EXPECT_GT(clamped_gate, 100);
  EXPECT_GT(clamped_up, 100);
  // Finite differences away from the clamps' kinks (|x ∓ limit| > 2h, h = 1e-2 from grad_check).
  for (float& x : g)
    if (std::fabs(x - limit) < 0.05f) x += 0.1f;
  for (float& x : u)
    if (std::fabs(std::fabs(x) - limit) < 0.05f) x += 0.1f;
  auto loss = [&] {
    clamped_swiglu_forward(out.data(), g.data(), u.data(), kSwiN, alpha, limit);
    return dot(out, d);
  };
  clamped_swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), kSwiN, alpha, limit);
  // As SwiGLU's check (each element one output; up linear where unclamped), outputs up to (7+1)·7 large: 3e-3.
  EXPECT_GRAD_OK(grad_check(g, dg, loss, 73, 128), 3e-3, "dgate");
  EXPECT_GRAD_OK(grad_check(u, du, loss, 74, 128), 3e-3, "dup");
}

TEST(SwiGLU, GradsAreWrittenNotAccumulated) {
  Vec g = gate_values(kSwiN, 59), u = random_vector(size_t(kSwiN), 60), d = random_vector(size_t(kSwiN), 61);
  Vec dg(size_t(kSwiN), NAN), du(size_t(kSwiN), NAN);
  swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), kSwiN);
  for (int64_t i = 0; i < kSwiN; ++i) {
    ASSERT_FALSE(std::isnan(dg[size_t(i)]) || std::isnan(du[size_t(i)])) << "gate " << g[size_t(i)];
  }
  Vec dg1 = dg, du1 = du;
  swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), kSwiN);
  EXPECT_TRUE(bits_equal(dg, dg1));
  EXPECT_TRUE(bits_equal(du, du1));
}

// SwiGLU's vector paths against the plain loops: the op table (tests/ops/test_op_harness.cpp).

TEST(SwiGLU, BitsIndependentOfThreadCount) {
  const int64_t n = (int64_t(1) << 17) + 37;  // several chunks and a ragged tail
  Vec g = random_vector(size_t(n), 62, -10.f, 10.f), u = random_vector(size_t(n), 63), d = random_vector(size_t(n), 64);
  auto [a, b] = with_1_and_2_threads([&] {
    Vec out(static_cast<size_t>(n)), dg(static_cast<size_t>(n)), du(static_cast<size_t>(n));
    swiglu_forward(out.data(), g.data(), u.data(), n);
    swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), n);
    out.insert(out.end(), dg.begin(), dg.end());
    out.insert(out.end(), du.begin(), du.end());
    return out;
  });
  EXPECT_TRUE(bits_equal(a, b));
}

}  // namespace
}  // namespace lt
