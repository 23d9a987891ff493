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
// magnitude a = |x|, the positive side of a map is u = 0 (the value 0), then the decades d = 0..6 (k_d codes
// each, at about 10^(d-6) · (0.1 + 0.9 (j + 1/2) / k_d)), then 1.0.
//   region  r = #{i : a > T[i]}, T the exact midpoints between 0, the decades and 1.0 rounded down to f32 (so
//           the f32 compare is exact). No binade holds two of them, so r = lo + (a > T[lo]) with
//           lo = region_lo[exponent of a]: one compare.
//   inside  t = a · A[r] + B[r] (one f32 FMA), u = base[r] + clamp(floor(t), 0, kmax[r]): the midpoints between
//           a decade's codes lie within 1e-4 of the integers t = 1..k_d-1.
//   checks  a lane whose t is within kAmbiguity of an integer, or whose a equals a midpoint that f32 holds
//           exactly (tie[lo]; the sign decides such a tie), is looked up exactly instead (quant_lookup):
//           about 1 lane in 1000. quant_arith() proves, when it builds the parameters, that every midpoint
//           inside a decade is caught that way.
// The code is then 127 + u for x >= 0 and 127 - min(u, 127) for x < 0 (signed), u for x >= 0 (unsigned).
struct QuantArith {
  static constexpr float kAmbiguity = 1.0f / 2048;
  static constexpr int kExpBase = 97;  // region_lo[i] is for biased exponent kExpBase + i (clamped to 0..31)
  alignas(64) float A[16];
  alignas(64) float B[16];
  alignas(64) int32_t base[16];
  alignas(64) int32_t kmax[16];
  alignas(64) float T[16];    // [8] midpoints, then +inf
  alignas(64) float tie[16];  // T[i] where it is the exact midpoint, NaN elsewhere (never equal)
  alignas(64) int32_t region_lo[32];
};
const QuantArith& quant_arith(QuantMapKind kind);

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
