// optim/quant_map.h — the dynamic (tree) quantisation maps of bitsandbytes and exact nearest-code lookup.
//
// A map is 256 sorted f32 values in [-1, 1] (signed, for Adam's m) or [0, 1] (unsigned, for v). A block of
// values x_i with absmax a is stored as codes c_i = nearest(x_i / a) and read back as Q[c_i] · a.
//
// Construction (bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)): for decade
// i = 0..6 with scale s_i = f32(10^(i-6)), take b = linspace_f32(0.1, 1, k_i + 1) and the k_i midpoints
// (b_j + b_{j+1}) / 2, each times s_i in f32; signed: k_i = 2^i and every value also negated; unsigned:
// k_i = 2^(i+1). Add 0 and 1.0 and sort: 254 + 2 = 256 values either way. linspace_f32 reproduces the
// bits torch.linspace gives on the CPU (see quant_map.cpp), so the maps equal bitsandbytes' own.
//
// Nearest code: with midpoints μ_c = (Q[c] + Q[c+1]) / 2 taken exactly (in double, where the sum of two
// neighbouring f32 codes is exact), nearest(x) = #{c : x > μ_c}: the code at least distance from x, the
// lower one on an exact tie. The fast lookup (QuantTable) gives that same code with one table read per
// value and no search; it is exact for every f32 input, including the smallest codes (unlike bitsandbytes'
// CPU path, whose 65536-entry table indexed by round(x · 32768) can never produce them).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

namespace lt {

enum class QuantMapKind : uint8_t { signed_dynamic, unsigned_dynamic };

using QuantMap = std::array<float, 256>;

// The 256 sorted values of a map (built once, cached).
const QuantMap& quant_map(QuantMapKind kind);
// The index of 0.0 in the map (127 for signed, 0 for unsigned).
int quant_zero_code(QuantMapKind kind);

// bitsandbytes' construction, step by step, for tests and docs: torch.linspace(start, end, steps) in f32.
std::vector<float> linspace_f32_torch(float start, float end, int64_t steps);

// The exact nearest code by definition: binary search over the exact midpoints (the specification).
uint8_t quant_nearest_exact(QuantMapKind kind, float x);

// The fast exact lookup. The f32 bits of x (sign s, exponent e, mantissa f) select a bucket: s, e clamped to
// [kMinExp, 127] and the top 7 bits of f. Every bucket holds at most one midpoint (checked when the table is
// built), so one 32-bit entry decides it: entry = lo | hi << 8 | T << 16 gives code lo when the 16 low bits
// of x are below T and hi otherwise (lo == hi when no midpoint falls inside). Values below 2^(kMinExp-127)
// all round to the zero code and values of magnitude >= 1 to the end codes, so clamping e is exact.
struct QuantTable {
  static constexpr int kMinExp = 103;                        // 2^-24: below every map's first midpoint
  static constexpr int kRows = 127 - kMinExp + 1;            // exponents kMinExp..127
  static constexpr int kBucketsPerSign = kRows * 128;        // 3200
  static constexpr uint32_t kKeyLo = uint32_t(kMinExp) << 7;  // (x bits >> 16) & 0x7fff, clamped below
  static constexpr uint32_t kKeyHi = (127u << 7) | 127u;      // ... and above
  alignas(64) uint32_t entry[2 * kBucketsPerSign];           // [sign][exponent row][7 mantissa bits]
  alignas(64) QuantMap values;                               // the map itself, for dequantisation
};

// The cached table of a map.
const QuantTable& quant_table(QuantMapKind kind);

// Nearest code by arithmetic, for the vector paths (no table reads, which are gathers there). Over the
// magnitude a = |x|, the positive side of a map is 0, then the decades d = 0..6 (k_d codes each, at about
// 10^(d-6) · (0.1 + 0.9 (j + 1/2) / k_d)), then 1.0.
//   region  r = #{i : a > T[i]} with T the exact midpoints between 0, the decades and 1.0, rounded down to
//           f32 so that the f32 compare is exact. For x < 0 an exact tie belongs to the larger magnitude, so
//           those lanes compare with T[16 + i] (the f32 below a midpoint that f32 holds exactly). No binade
//           holds two midpoints, so r = lo + (a > T[lo]) with lo = region_lo[exponent of a]: one compare.
//   inside  s = round(a · A[r] + B[r]) (one f32 FMA, then to integer) is 2^16 (c0 + t) + 8, with c0 the code
//           of the decade's first value for x >= 0 and t placing the midpoints between the decade's codes within
//           1e-4 of the integers 1..k_d-1; c = min(s >> 16, hi[r]) (t >= 0 throughout a region, checked). With
//           16 fraction bits the code is byte 2 of s (no shift before a byte permute; s < 2^24, so the f32 FMA
//           still holds it exactly), and the bias of 8 puts the ambiguous window at the bottom of each step.
//   checks  a lane whose s is within 8 of a multiple of 2^16 before the bias (s mod 2^16 < 16) is looked up
//           exactly instead (quant_lookup): about 1 lane in 10000. quant_arith() proves, when it builds the
//           parameters, that both f32 neighbours of every midpoint inside a decade are caught that way; as s
//           is monotone in a, every lane on the wrong side of a midpoint is then caught too.
// c is the code for x >= 0; for x < 0 (signed map) the code is 254 - min(c, 254), the mirror image without 1.0.
// Requires |x| < 2 (the kernels quantise m / absmax): larger exponents would wrap in region_lo; the unsigned
// map requires x >= 0 (v never is negative).
struct QuantArith {
  static constexpr int kFracBits = 16;  // s = 2^16 (c0 + t) + kBias
  static constexpr int kBias = 8;       // half the ambiguous window
  static constexpr int kExpBase = 97;   // region_lo[i] is for biased exponent kExpBase + i (i clamped at 0)
  alignas(64) float A[16];              // scaled by 2^kFracBits
  alignas(64) float B[16];              // scaled, c0 and kBias included
  alignas(64) int32_t hi[16];           // the code of the region's last value
  alignas(64) float T[32];              // [0, 9): midpoints for x >= 0, then +inf; [16, 25): for x < 0
  alignas(64) int32_t region_lo[32];
  // Whether an integer s from the FMA is too close to a decision point to trust.
  static constexpr int32_t kExactBits = (1 << kFracBits) - 2 * kBias;  // s & kExactBits == 0: ambiguous
  static bool ambiguous(int32_t s) { return (s & kExactBits) == 0; }
};
const QuantArith& quant_arith(QuantMapKind kind);
// The arithmetic method for one value, exactly as the vector paths run it lane by lane (for tests).
uint8_t quant_arith_lookup(QuantMapKind kind, float x);

// Table lookup for one value (what the vector paths do per lane).
inline uint8_t quant_lookup(const QuantTable& t, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  uint32_t key = (bits >> 16) & 0x7fffu;
  key = key < QuantTable::kKeyLo ? QuantTable::kKeyLo : key > QuantTable::kKeyHi ? QuantTable::kKeyHi : key;
  const uint32_t index = key - QuantTable::kKeyLo + ((bits >> 31) ? uint32_t(QuantTable::kBucketsPerSign) : 0u);
  const uint32_t e = t.entry[index];
  return uint8_t((bits & 0xffffu) >= (e >> 16) ? (e >> 8) : e);
}

// One block of n values: returns absmax = max |x| (0 when below FLT_MIN, every code then the zero code) and
// writes codes[i] = nearest(x[i] · (1/absmax)), as the fused kernels do (they add the zero-point guard for v).
float quantize_block(QuantMapKind kind, const float* x, int64_t n, uint8_t* codes);
// out[i] = Q[codes[i]] · absmax.
void dequantize_block(QuantMapKind kind, const uint8_t* codes, int64_t n, float absmax, float* out);

}  // namespace lt
