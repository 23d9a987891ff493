// The tensor-core gated delta rule's tile inverse (tile_unit_lower_inverse in cuda/kernels/gated_delta_mma.cuh),
// on its own under cuda-sim: A = (I + M)⁻¹ for M = strictly_lower(diag(β) K Kᵀ ⊙ E) as the prepare, WY and decay
// launches form it, against the f64 forward substitution, on a tile of one document, of several (M block-diagonal)
// and one with M's entries near 1 (β → 1, no decay, near-parallel keys); every entry written (A starts as NaN), the
// upper triangle +0, the diagonal 1, the same bits in every thread order and at both row strides the launches use.
// The end-to-end tests (test_kernels_gated_delta.cpp) hold the rule to bf16 bounds, where an error of the inverse
// under 10⁻⁴ would not show; this one holds it to f32's.
#define LT_KERNELS_NS delta_inverse_test
#include "cuda/kernels/gated_delta_mma.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda/kernel_testing.h"
#include "cuda/sim_orders.h"

namespace lt::cuda::delta_inverse_test {

// The kernel's shared memory: the gates (β), KKE [64, lm] and A [64, la]; a null base only counts.
struct InverseShared {
  DeltaTileGates* tg;
  float *KKE, *A;
  size_t bytes;
  LT_HD_INLINE static InverseShared carve(uintptr_t base, int lm, int la) {
    SharedCarve sh{base};
    InverseShared s;
    s.tg = sh.take<DeltaTileGates>(1), s.KKE = sh.take<float>(kDeltaTile * lm), s.A = sh.take<float>(kDeltaTile * la);
    s.bytes = sh.used;
    return s;
  }
};

// One block: β and KKE [64, lm] into shared memory, A [64, la] poisoned with NaN, the inverse out to [64, 64].
__global__ void __launch_bounds__(kDeltaMmaThreads)
    inverse_kernel(float* out, const float* kke, const float* beta, int lm, int la) {
  const InverseShared sh = InverseShared::carve(reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char)), lm, la);
  DeltaTileGates& tg = *sh.tg;
  float *KKE = sh.KKE, *A = sh.A;
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  for (int i = tid; i < kDeltaTile; i += nt) tg.beta[i] = beta[i];
  for (int x = tid; x < kDeltaTile * lm; x += nt) KKE[x] = kke[x];
  for (int x = tid; x < kDeltaTile * la; x += nt) A[x] = NAN;
  __syncthreads();
  tile_unit_lower_inverse(A, la, KKE, lm, tg);
  for (int x = tid; x < kDeltaTile * kDeltaTile; x += nt)
    out[x] = A[x / kDeltaTile * la + x % kDeltaTile];
}

namespace {

constexpr int n = kDeltaTile;

// A tile's β and KKE [64, lm] (strictly lower: (K Kᵀ)_ij e^{γ_i − γ_j} within a document) from keys of dim 128,
// L2-normalised as the layer's are. `spread` scales each key's own direction against a shared one (0: every key
// the same); `docs` the document lengths.
struct Tile {
  std::vector<float> beta, kke;
  int lm;
};

Tile make_tile(uint64_t seed, int lm, float spread, float beta_lo, float beta_hi, float g_lo,
               std::vector<int> docs) {
  constexpr int dk = 128;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::vector<double> shared(dk), keys(size_t(n * dk));
  for (double& x : shared) x = unit(rng);
  for (int i = 0; i < n; ++i) {
    double ss = 0;
    for (int d = 0; d < dk; ++d) {
      double& x = keys[size_t(i * dk + d)];
      x = shared[size_t(d)] + spread * unit(rng);
      ss += x * x;
    }
    for (int d = 0; d < dk; ++d) keys[size_t(i * dk + d)] /= std::sqrt(ss);
  }
  std::vector<int> doc(n);
  for (int i = 0, d = 0, left = docs[0]; i < n; ++i, --left) {
    if (left == 0) left = docs[size_t(++d)];
    doc[size_t(i)] = d;
  }
  Tile t{std::vector<float>(n), std::vector<float>(size_t(n * lm), 0.0f), lm};
  std::uniform_real_distribution<float> beta(beta_lo, beta_hi), g(g_lo, 0.0f);
  std::vector<float> gam(n);
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) gam[size_t(i)] = acc += g(rng), t.beta[size_t(i)] = beta(rng);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j)
      if (doc[size_t(i)] == doc[size_t(j)]) {
        double kk = 0;
        for (int d = 0; d < dk; ++d) kk += keys[size_t(i * dk + d)] * keys[size_t(j * dk + d)];
        t.kke[size_t(i * lm + j)] = float(kk) * std::exp(gam[size_t(i)] - gam[size_t(j)]);
      }
  return t;
}

// The kernel's inverse, [64, 64].
std::vector<float> inverse(const Tile& t, int la) {
  testing::Guarded<float> out(size_t(n * n));
  LT_LAUNCH(inverse_kernel, dim3(1), dim3(kDeltaMmaThreads), InverseShared::carve(0, t.lm, la).bytes, nullptr,
            out.data(), t.kke.data(), t.beta.data(), t.lm, la);
  EXPECT_TRUE(out.guards_intact());
  return out.values();
}

// (I + M)⁻¹ by forward substitution in f64, M_ij = β_i KKE_ij from the same f32 inputs.
std::vector<double> reference_inverse(const Tile& t) {
  std::vector<double> A(size_t(n * n), 0.0);
  for (int c = 0; c < n; ++c)
    for (int i = c; i < n; ++i) {
      double acc = i == c ? 1.0 : 0.0;
      for (int m = c; m < i; ++m) acc -= double(t.beta[size_t(i)]) * t.kke[size_t(i * t.lm + m)] * A[size_t(m * n + c)];
      A[size_t(i * n + c)] = acc;
    }
  return A;
}

// max |A − A₆₄| / max |A₆₄|, and the structure: upper triangle +0, diagonal exactly 1.
double check_inverse(const std::vector<float>& A, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const float a = A[size_t(i * n + j)];
      if (j > i) {
        EXPECT_TRUE(a == 0.0f && !std::signbit(a)) << "A[" << i << ", " << j << "] = " << a;
      } else if (j == i) {
        EXPECT_EQ(a, 1.0f) << "A[" << i << ", " << i << "]";
      }
      const double d = std::abs(a - ref[size_t(i * n + j)]);
      if (std::isnan(d)) return d;  // an entry never written: fails the bound
      err = std::max(err, d);
      scale = std::max(scale, std::abs(ref[size_t(i * n + j)]));
    }
  return err / scale;
}

struct Case {
  const char* name;
  uint64_t seed;
  float spread, beta_lo, beta_hi, g_lo;
  std::vector<int> docs;
};

// On max |A − A₆₄| / max |A₆₄| (max |A| is the diagonal's 1 here: |M_ij| < 1 and no sign pattern of K Kᵀ makes the
// inverse grow): f32's 2⁻²⁴ ≈ 6e-8 a rounding over chains of up to 64 products and sums. Measured 1.9e-8, 4.2e-8 and
// 1.9e-7 (the same in every order); a merge with the wrong sign, a dropped term or a wrong bound measures 0.3 .. 300.
constexpr double kBound = 1e-6;

const Case kCases[] = {
    {"one document, Qwen-like gates", 7, 1.0f, 0.02f, 0.98f, -0.5f, {64}},
    {"five documents across the blocks", 8, 1.0f, 0.02f, 0.98f, -0.1f, {5, 19, 8, 30, 2}},
    {"M's entries near 1: β → 1, no decay, near-parallel keys", 9, 0.3f, 0.9f, 1.0f, -1e-4f, {64}},
};

TEST(DeltaTileInverse, IsTheF64InverseToF32BoundsWithTheSameBitsInEveryOrderAndStride) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Tile tile = make_tile(c.seed, kDeltaTile + 1, c.spread, c.beta_lo, c.beta_hi, c.g_lo, c.docs);
    const std::vector<double> ref = reference_inverse(tile);
    std::vector<float> first;
    testing::for_each_order([&] {
      const std::vector<float> A = inverse(tile, kDeltaTile + 1);
      EXPECT_LT(check_inverse(A, ref), kBound);
      if (first.empty()) first = A;
      EXPECT_BITWISE_EQ(A, first);
    });
    // The WY launch's stride (KKE at kTileLd, A at 65) and the prepare's (both 65): the same bits.
    Tile wide = tile;
    wide.lm = kTileLd;
    wide.kke.assign(size_t(n * kTileLd), 0.0f);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) wide.kke[size_t(i * kTileLd + j)] = tile.kke[size_t(i * tile.lm + j)];
    EXPECT_BITWISE_EQ(inverse(wide, kDeltaTile + 1), first);
  }
}

TEST(DeltaTileInverse, DocumentsKeepTheInverseBlockDiagonal) {
  // M has no entry across documents, so neither has its inverse: exactly zero there, not small.
  const std::vector<int> docs = {5, 19, 8, 30, 2};
  const Tile tile = make_tile(8, kDeltaTile + 1, 1.0f, 0.02f, 0.98f, -0.1f, docs);
  const std::vector<float> A = inverse(tile, kDeltaTile + 1);
  std::vector<int> doc;
  for (size_t d = 0; d < docs.size(); ++d) doc.insert(doc.end(), size_t(docs[d]), int(d));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j)
      if (doc[size_t(i)] != doc[size_t(j)]) {
        EXPECT_EQ(A[size_t(i * n + j)], 0.0f) << i << ", " << j;
      }
}

}  // namespace
}  // namespace lt::cuda::delta_inverse_test
