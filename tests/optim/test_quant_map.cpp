// The dynamic quantisation maps against bitsandbytes' construction run on Debian's torch, and the nearest-code
// lookup (definition and bucket table) against brute force over all 256 codes, on values of every magnitude.
#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "optim/quant_map.h"
#include "optim_testing.h"

namespace lt {
namespace {

using testing::brute_force_nearest;

constexpr QuantMapKind kKinds[] = {QuantMapKind::signed_dynamic, QuantMapKind::unsigned_dynamic};

const char* kind_name(QuantMapKind k) { return k == QuantMapKind::signed_dynamic ? "signed" : "unsigned"; }

TEST(QuantMap, EqualsBitsandbytesConstructionInTorch) {
  testing::TempDir dir;
  ASSERT_TRUE(testing::run_torch_reference("maps --out " + dir.file("maps.bin")));
  const std::vector<float> ref = testing::read_f32(dir.file("maps.bin"));
  size_t linspace_total = 0;
  for (int k = 2; k <= 300; ++k) linspace_total += size_t(k);
  ASSERT_EQ(ref.size(), 512 + linspace_total);
  for (int m = 0; m < 2; ++m) {
    const QuantMap& q = quant_map(kKinds[m]);
    for (int c = 0; c < 256; ++c) {
      uint32_t a, b;
      std::memcpy(&a, &q[size_t(c)], 4);
      std::memcpy(&b, &ref[size_t(m * 256 + c)], 4);
      EXPECT_EQ(a, b) << kind_name(kKinds[m]) << " map code " << c << ": ours " << q[size_t(c)] << ", bitsandbytes "
                      << ref[size_t(m * 256 + c)];
    }
  }
  // The f32 linspace underneath, for every size (not only those the maps use).
  size_t at = 512;
  for (int k = 2; k <= 300; ++k) {
    const std::vector<float> ours = linspace_f32_torch(0.1f, 1.0f, k);
    EXPECT_EQ(std::memcmp(ours.data(), ref.data() + at, size_t(k) * 4), 0) << "linspace(0.1, 1, " << k << ")";
    at += size_t(k);
  }
}

TEST(QuantMap, ShapeOfTheMaps) {
  for (QuantMapKind kind : kKinds) {
    const QuantMap& q = quant_map(kind);
    for (int c = 1; c < 256; ++c) EXPECT_LT(q[size_t(c - 1)], q[size_t(c)]) << kind_name(kind) << " code " << c;
    EXPECT_EQ(q[size_t(quant_zero_code(kind))], 0.0f);
    EXPECT_EQ(q[255], 1.0f);
    // Half the codes lie in [0.1, 1] (REFERENCES §4): 64 + 1 of the signed map's positives, 128 + 1 unsigned.
    int top = 0;
    for (float v : q) top += v >= 0.1f;
    EXPECT_EQ(top, kind == QuantMapKind::signed_dynamic ? 65 : 129) << kind_name(kind);
  }
  EXPECT_EQ(quant_map(QuantMapKind::signed_dynamic)[0], -quant_map(QuantMapKind::signed_dynamic)[254]);
  EXPECT_FLOAT_EQ(quant_map(QuantMapKind::unsigned_dynamic)[1], 3.25e-7f);  // the smallest positive code
}

// Values of every magnitude the lookup can meet, with both signs: log-uniform in [1e-12, 4], every code, the
// f32 neighbours of every exact midpoint, zeros, subnormals, 1 ± ulp, values beyond ±1.
std::vector<float> probe_values(uint64_t seed) {
  std::vector<float> xs;
  Rng rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const float mag = float(std::pow(10.0, -12.0 + 12.6 * rng.uniform()));
    xs.push_back(rng.below(2) ? mag : -mag);
  }
  for (QuantMapKind kind : kKinds) {
    const QuantMap& q = quant_map(kind);
    for (int c = 0; c < 256; ++c) {
      xs.push_back(q[size_t(c)]);
      if (c < 255) {
        const double mid = (double(q[size_t(c)]) + double(q[size_t(c) + 1])) / 2;
        const float f = float(mid);
        xs.push_back(f);
        xs.push_back(std::nextafter(f, 2.0f));
        xs.push_back(std::nextafter(f, -2.0f));
      }
    }
  }
  for (float v : {0.0f, -0.0f, FLT_MIN, -FLT_MIN, 1e-45f, -1e-45f, 1.0f, -1.0f, std::nextafter(1.0f, 2.0f),
                  -std::nextafter(1.0f, 2.0f), std::nextafter(1.0f, 0.0f), 2.0f, -3.5f})
    xs.push_back(v);
  return xs;
}

TEST(QuantMap, NearestCodeIsBruteForceNearest) {
  const std::vector<float> xs = probe_values(11);
  for (QuantMapKind kind : kKinds) {
    const QuantMap& q = quant_map(kind);
    const QuantTable& t = quant_table(kind);
    int64_t bad_exact = 0, bad_table = 0;
    for (float x : xs) {
      const uint8_t want = brute_force_nearest(q, x);
      const uint8_t exact = quant_nearest_exact(kind, x), table = quant_lookup(t, x);
      if (exact != want && bad_exact++ < 5)
        ADD_FAILURE() << kind_name(kind) << " x=" << x << ": definition gives " << int(exact) << ", brute force "
                      << int(want);
      if (table != want && bad_table++ < 5)
        ADD_FAILURE() << kind_name(kind) << " x=" << x << ": table gives " << int(table) << ", brute force "
                      << int(want);
    }
    EXPECT_EQ(bad_exact, 0);
    EXPECT_EQ(bad_table, 0);
  }
}

TEST(QuantMap, ArithmeticMethodIsBruteForceNearest) {
  // The vector paths' method (region, one FMA, exact lookup of ambiguous lanes) on every probe below 2 in
  // magnitude (its precondition; non-negative for the unsigned map, as v is), and how often it falls back.
  const std::vector<float> xs = probe_values(12);
  for (QuantMapKind kind : kKinds) {
    const QuantMap& q = quant_map(kind);
    const QuantArith& qa = quant_arith(kind);
    int64_t bad = 0, checked = 0, fallbacks = 0, random_lanes = 0;
    for (size_t k = 0; k < xs.size(); ++k) {
      const float x = xs[k];
      if (!(std::fabs(x) < 2.0f) || (kind == QuantMapKind::unsigned_dynamic && std::signbit(x))) continue;
      ++checked;
      const uint8_t want = brute_force_nearest(q, x), got = quant_arith_lookup(kind, x);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << kind_name(kind) << " x=" << x << ": arithmetic gives " << int(got) << ", brute force "
                      << int(want);
      if (k < 200000) {  // the log-uniform part: the fallback rate
        ++random_lanes;
        const float a = std::fabs(x);
        uint32_t bits;
        std::memcpy(&bits, &a, 4);
        const int32_t lo = qa.region_lo[std::max<int32_t>(int32_t(bits >> 23) - QuantArith::kExpBase, 0) & 31];
        const int32_t r = lo + (a > qa.T[lo + (x < 0 ? 16 : 0)]);
        fallbacks += QuantArith::ambiguous(int32_t(std::lrint(std::fma(a, qa.A[r], qa.B[r]))));
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_GT(checked, 90000);
    std::printf("  %s: %lld values, %.3f%% of the random ones looked up exactly\n", kind_name(kind),
                static_cast<long long>(checked), 100.0 * double(fallbacks) / double(random_lanes));
    EXPECT_LT(double(fallbacks) / double(random_lanes), 0.01);
  }
}

TEST(QuantMap, SmallestCodesAreReachable) {
  // bitsandbytes' CPU lookup (index round(x·32768)) can never return codes below 1/65536; ours returns each.
  for (QuantMapKind kind : kKinds) {
    const QuantMap& q = quant_map(kind);
    for (int c = 0; c < 256; ++c)
      EXPECT_EQ(int(quant_lookup(quant_table(kind), q[size_t(c)])), c) << kind_name(kind) << " code " << c;
  }
}

TEST(QuantMap, BlockRoundTripIsNearest) {
  for (QuantMapKind kind : kKinds) {
    for (int64_t n : {1, 15, 256, 257, 1000}) {
      Rng rng(uint64_t(n) * 7 + 1);
      std::vector<float> x(static_cast<size_t>(n));
      // Magnitudes spread over 8 decades, as Adam's v is within a block.
      for (auto& v : x) {
        const float mag = float(std::pow(10.0, -8.0 * rng.uniform())) * 3.7f;
        v = kind == QuantMapKind::signed_dynamic && rng.below(2) ? -mag : mag;
      }
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      const float absmax = quantize_block(kind, x.data(), n, codes.data());
      float want_absmax = 0;
      for (float v : x) want_absmax = std::max(want_absmax, std::fabs(v));
      ASSERT_EQ(absmax, want_absmax);
      std::vector<float> back(static_cast<size_t>(n));
      dequantize_block(kind, codes.data(), n, absmax, back.data());
      const QuantMap& q = quant_map(kind);
      const float inv = 1.0f / absmax;
      for (int64_t i = 0; i < n; ++i) {
        const float xn = x[size_t(i)] * inv;
        ASSERT_EQ(int(codes[size_t(i)]), int(brute_force_nearest(q, xn))) << kind_name(kind) << " n=" << n << " i=" << i;
        ASSERT_EQ(back[size_t(i)], q[codes[size_t(i)]] * absmax);
      }
    }
  }
  // An all-zero (or flushed) block: absmax 0, zero codes, dequantises to 0.
  std::vector<float> tiny = {1e-39f, -2e-39f, 0.0f};
  std::vector<uint8_t> codes(3);
  EXPECT_EQ(quantize_block(QuantMapKind::signed_dynamic, tiny.data(), 3, codes.data()), 0.0f);
  for (uint8_t c : codes) EXPECT_EQ(int(c), quant_zero_code(QuantMapKind::signed_dynamic));
}

}  // namespace
}  // namespace lt
