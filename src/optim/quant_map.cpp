#include "optim/quant_map.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/error.h"

namespace lt {
namespace {

// Exact midpoints μ_c = (Q[c] + Q[c+1]) / 2 of a sorted map, in double. Neighbouring codes are f32 values
// whose exponents differ by a few units at most (or one of them is 0), so their sum is exact in double.
std::array<double, 255> midpoints(const QuantMap& q) {
  std::array<double, 255> mid{};
  for (int c = 0; c < 255; ++c) mid[size_t(c)] = (double(q[size_t(c)]) + double(q[size_t(c) + 1])) / 2;
  return mid;
}

QuantMap build_map(QuantMapKind kind) {
  const bool is_signed = kind == QuantMapKind::signed_dynamic;
  // The decade scales as Python's 10 ** (i - 6) (correctly rounded doubles), rounded to f32 as torch does
  // when it multiplies an f32 tensor by a Python float.
  static constexpr double kScale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t k = is_signed ? (int64_t(1) << i) : (int64_t(1) << (i + 1));
    const std::vector<float> b = linspace_f32_torch(0.1f, 1.0f, k + 1);
    const float scale = float(kScale[i]);
    for (int64_t j = 0; j < k; ++j) {
      const float mean = (b[size_t(j)] + b[size_t(j) + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  LT_CHECK_EQ(data.size(), size_t(256), "dynamic map size");
  std::sort(data.begin(), data.end());
  QuantMap q{};
  std::copy(data.begin(), data.end(), q.begin());
  LT_CHECK(q[size_t(quant_zero_code(kind))] == 0.0f, "dynamic map: 0 is not at code {}", quant_zero_code(kind));
  return q;
}

// Index of the first midpoint >= x, i.e. #{c : x > μ_c}.
uint8_t nearest_by_midpoints(const std::array<double, 255>& mid, double x) {
  int lo = 0, hi = 255;  // answer in [lo, hi]
  while (lo < hi) {
    const int m = (lo + hi) / 2;
    if (x > mid[size_t(m)]) lo = m + 1;
    else hi = m;
  }
  return uint8_t(lo);
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

QuantTable build_table(QuantMapKind kind) {
  QuantTable t{};
  t.values = quant_map(kind);
  const std::array<double, 255> mid = midpoints(t.values);
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t key = QuantTable::kKeyLo; key <= QuantTable::kKeyHi; ++key) {
      // The bucket: every f32 with these top 16 bits; its low 16 bits order |x| increasingly.
      const uint32_t base = (sign << 31) | (key << 16);
      const uint8_t first = nearest_by_midpoints(mid, from_bits(base));
      const uint8_t last = nearest_by_midpoints(mid, from_bits(base | 0xffffu));
      uint32_t T = 0;
      uint8_t second = first;
      if (first != last) {
        LT_CHECK(std::abs(int(first) - int(last)) == 1,
                 "quantisation table: bucket {:#x} spans {} midpoints; it needs finer buckets", base,
                 std::abs(int(first) - int(last)));
        // The first low-16 value whose code is `last` (codes are monotone in the low bits).
        uint32_t lo = 1, hi = 0xffff;
        while (lo < hi) {
          const uint32_t m = (lo + hi) / 2;
          if (nearest_by_midpoints(mid, from_bits(base | m)) == last) hi = m;
          else lo = m + 1;
        }
        T = lo;
        second = last;
      }
      t.entry[sign * QuantTable::kBucketsPerSign + (key - QuantTable::kKeyLo)] =
          uint32_t(first) | uint32_t(second) << 8 | T << 16;
    }
  }
  // Clamping the exponent is exact only if everything below the table rounds to the zero code and
  // everything at or above 1 to an end code; check both ends rather than trust the arithmetic.
  const float tiny = from_bits((uint32_t(QuantTable::kMinExp) << 23) - 1);  // largest value below the table
  LT_CHECK_EQ(int(nearest_by_midpoints(mid, tiny)), quant_zero_code(kind), "quantisation table lower clamp");
  LT_CHECK_EQ(int(nearest_by_midpoints(mid, 1.0)), 255, "quantisation table upper clamp");
  return t;
}

float round_down_f32(double x) {
  float f = float(x);
  if (double(f) > x) f = std::nextafter(f, -INFINITY);
  return f;
}

// The parameters of QuantArith and the proof that they give the nearest code (see quant_map.h).
QuantArith build_arith(QuantMapKind kind) {
  static constexpr double kScale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  const QuantMap& q = quant_map(kind);
  const int zero = quant_zero_code(kind);
  const int U = 255 - zero;  // the positive side P[u] = q[zero + u], u = 0..U; P[U] = 1.0
  auto P = [&](int u) { return double(q[size_t(zero + u)]); };
  QuantArith a{};
  const double scale = double(1 << QuantArith::kFracBits);
  for (int r = 0; r < 16; ++r) {  // regions without a decade: t = 0.5, never near an integer
    const int c = zero + (r == 0 ? 0 : U);
    a.A[r] = 0.0f;
    a.B[r] = float((c + 0.5) * scale + QuantArith::kBias);
    a.hi[r] = c;
  }
  for (float& t : a.T) t = INFINITY;
  auto add_boundary = [&](int i, double mid) {
    a.T[i] = round_down_f32(mid);
    a.T[16 + i] = double(a.T[i]) == mid ? std::nextafter(a.T[i], 0.0f) : a.T[i];
  };
  auto s_of = [&](float x, int r) { return int32_t(std::lrint(std::fma(x, a.A[r], a.B[r]))); };
  int base = 1;
  for (int d = 0; d < 7; ++d) {
    const int k = kind == QuantMapKind::signed_dynamic ? 1 << d : 1 << (d + 1);
    add_boundary(d, (P(base - 1) + P(base)) / 2);
    const int r = d + 1, c0 = zero + base;
    a.A[r] = float(scale * k / (0.9 * kScale[d]));
    a.B[r] = float(scale * (c0 - 0.1 * k / 0.9) + QuantArith::kBias);
    a.hi[r] = c0 + k - 1;
    // Both f32 neighbours of every midpoint inside the decade must be flagged, with s in [2^16 (c0 + j + 1),
    // 2^16 (c0 + j + 1) + 2 kBias); lrint rounds to nearest even as the vector conversion does.
    for (int j = 0; j + 1 < k; ++j) {
      const double mid = (P(base + j) + P(base + j + 1)) / 2;
      const float below = round_down_f32(mid), above = std::nextafter(below, INFINITY);
      for (float x : {below, above}) {
        const int32_t si = s_of(x, r), want = (c0 + j + 1) << QuantArith::kFracBits;
        LT_CHECK(si >= want && si < want + 2 * QuantArith::kBias && QuantArith::ambiguous(si),
                 "quantisation arithmetic: midpoint {} of decade {} gives s = {}, not within the flagged window "
                 "around {}", mid, d, si, want);
      }
    }
    // The smallest magnitude of the region (either sign's threshold) must not fall below the decade.
    LT_CHECK(s_of(std::nextafter(a.T[16 + d], INFINITY), r) >> QuantArith::kFracBits >= c0,
             "quantisation arithmetic: region {} starts below its decade", r);
    base += k;
  }
  LT_CHECK_EQ(base, U, "dynamic map decades");
  add_boundary(7, (P(U - 1) + P(U)) / 2);
  // region_lo: the regions wholly below each binade [2^(e-127), 2^(e-126)), at most one midpoint inside it
  // (for either sign's thresholds).
  for (int i = 0; i < 32; ++i) {
    const int e = QuantArith::kExpBase + i;
    const double lo = i == 0 ? 0.0 : std::ldexp(1.0, e - 127), hi = i == 31 ? INFINITY : std::ldexp(1.0, e - 126);
    int below = 0, inside = 0;
    for (int t = 0; t < 8; ++t) {
      const double tp = a.T[t], tn = a.T[16 + t];
      LT_CHECK((tp < lo) == (tn < lo), "quantisation arithmetic: a midpoint sits on a binade edge");
      below += tp < lo;
      inside += std::max(int(tp >= lo && tp < hi), int(tn >= lo && tn < hi));
    }
    LT_CHECK(inside <= 1, "quantisation arithmetic: binade 2^{} holds {} region boundaries", e - 127, inside);
    a.region_lo[i] = below;
  }
  return a;
}

}  // namespace

const QuantArith& quant_arith(QuantMapKind kind) {
  static const QuantArith s = build_arith(QuantMapKind::signed_dynamic);
  static const QuantArith u = build_arith(QuantMapKind::unsigned_dynamic);
  return kind == QuantMapKind::signed_dynamic ? s : u;
}

uint8_t quant_arith_lookup(QuantMapKind kind, float x) {
  const QuantArith& q = quant_arith(kind);
  const float a = std::fabs(x);
  uint32_t bits;
  std::memcpy(&bits, &a, 4);
  const bool negative = kind == QuantMapKind::signed_dynamic && x < 0;
  const int32_t lo = q.region_lo[std::max<int32_t>(int32_t(bits >> 23) - QuantArith::kExpBase, 0) & 31];
  const int32_t r = lo + (a > q.T[lo + (negative ? 16 : 0)]);
  const int32_t s = int32_t(std::lrint(std::fma(a, q.A[r], q.B[r])));
  if (QuantArith::ambiguous(s)) return quant_lookup(quant_table(kind), x);
  const int32_t c = std::min(s >> QuantArith::kFracBits, q.hi[r]);
  return uint8_t(negative ? 254 - std::min(c, 254) : c);
}

std::vector<float> linspace_f32_torch(float start, float end, int64_t steps) {
  // torch 1.13's CPU linspace kernel (ATen/native/cpu/RangeFactoriesKernel.cpp) on an AVX2 build, whose
  // bits are what bitsandbytes' maps are made of:
  //   step = (end - start) / (steps - 1) in f32;
  //   scalar element i: start + step·i below steps/2, else end - step·(steps-1-i), each one FMA (the
  //     kernel is compiled with -mfma and GCC contracts the expression);
  //   vectorised pairs of 8-lane vectors while 16 elements remain: lane j of the vector starting at idx is
  //     base + j·step, two roundings, with base the scalar formula at idx.
  // Checked against Debian's torch by tests/optim/test_quant_map.cpp for every size the maps use.
  std::vector<float> out(static_cast<size_t>(steps));
  if (steps == 1) {
    out[0] = start;
    return out;
  }
  const float step = (end - start) / float(steps - 1);
  const int64_t halfway = steps / 2;
  auto scalar = [&](int64_t i) {
    return i < halfway ? std::fma(step, float(i), start) : std::fma(-step, float(steps - 1 - i), end);
  };
  int64_t i = 0;
  for (; i + 16 <= steps; i += 16)
    for (int64_t v = i; v < i + 16; v += 8) {
      const float base = scalar(v);
      for (int64_t j = 0; j < 8; ++j) out[size_t(v + j)] = base + float(j) * step;
    }
  for (; i < steps; ++i) out[size_t(i)] = scalar(i);
  return out;
}

const QuantMap& quant_map(QuantMapKind kind) {
  static const QuantMap s = build_map(QuantMapKind::signed_dynamic);
  static const QuantMap u = build_map(QuantMapKind::unsigned_dynamic);
  return kind == QuantMapKind::signed_dynamic ? s : u;
}

int quant_zero_code(QuantMapKind kind) { return kind == QuantMapKind::signed_dynamic ? 127 : 0; }

uint8_t quant_nearest_exact(QuantMapKind kind, float x) {
  static const std::array<double, 255> ms = midpoints(quant_map(QuantMapKind::signed_dynamic));
  static const std::array<double, 255> mu = midpoints(quant_map(QuantMapKind::unsigned_dynamic));
  return nearest_by_midpoints(kind == QuantMapKind::signed_dynamic ? ms : mu, double(x));
}

const QuantTable& quant_table(QuantMapKind kind) {
  static const QuantTable s = build_table(QuantMapKind::signed_dynamic);
  static const QuantTable u = build_table(QuantMapKind::unsigned_dynamic);
  return kind == QuantMapKind::signed_dynamic ? s : u;
}

float quantize_block(QuantMapKind kind, const float* x, int64_t n, uint8_t* codes) {
  const QuantTable& t = quant_table(kind);
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  if (absmax < FLT_MIN) absmax = 0.0f;
  const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
  for (int64_t i = 0; i < n; ++i) codes[i] = quant_lookup(t, x[i] * inv);
  return absmax;
}

void dequantize_block(QuantMapKind kind, const uint8_t* codes, int64_t n, float absmax, float* out) {
  const QuantMap& q = quant_map(kind);
  for (int64_t i = 0; i < n; ++i) out[i] = q[codes[i]] * absmax;
}

}  // namespace lt
