// optim/kernels.h — the fused AdamW kernels and the gradient accumulation kernel, one plain C++ version
// each (the specification) and AVX2 / AVX-512 versions chosen at run time that give the same bits.
//
// Per element, with the step's scalars s (adamw_scalars below), in torch.optim.AdamW's order of operations:
//   g  = grad · s.clip                            clip coefficient, 1 when not clipping
//   p' = p · s.decay                              decoupled weight decay, decay = 1 - lr·wd
//   m' = fma(g, 1-β1, m · β1)                     torch: exp_avg.mul_(β1).add_(grad, alpha=1-β1)
//   v' = fma(g · (1-β2), g, v · β2)               torch: exp_avg_sq.mul_(β2).addcmul_(grad, grad, value=1-β2)
//   d  = sqrt(v') / s.bc2_sqrt + eps              bc2_sqrt = sqrt(1 - β2^t)
//   p''= p' + (s.neg_step_size · m') / d          neg_step_size = -lr / (1 - β1^t)
// fma is one rounding (torch's vectorised CPU kernels fuse exactly these two multiply-adds); every other
// operation rounds on its own: the kernel files are compiled with fp-contract off so the compiler fuses
// nothing else. The vector paths use the same operations lane by lane, so they match the plain path bit for
// bit and the results never depend on the CPU; on this machine they equal torch 1.13's bits (tested).
//
// 8-bit states (adamw8_*): m and v are codes into the signed / unsigned dynamic maps with one f32 absmax
// per block of B elements (B a multiple of 16; the last block of a tensor may be short). Per block:
//   1. m = Qs[cm] · am, v = Qu[cv] · av (old absmax), the update above, p stored;
//   2. am' = max |m'|, av' = max v' over the block; a block maximum below FLT_MIN is flushed to 0 (its
//      codes all become the zero code) so that 1/absmax stays finite;
//   3. cm = nearest_s(m' · (1/am')), cv = nearest_u(v' · (1/av')) with the exact nearest code; then the
//      zero-point guard: a v' > 0 in a block with av' > 0 never takes code 0 but at least code 1, the
//      smallest positive value (see docs/optimizer.md: v quantised to 0 would turn m/(sqrt(v)+eps) into
//      m/eps on the next step).
// How the paths find codes (all exact, so all give the same bits):
//   plain    quant_lookup: one read of the bucket table per value (quant_map.h);
//   avx2     dequantise by integer table loads; requantise by QuantArith with 8-entry permutes (region 8, the
//            code 255, by one more compare) and the same exact lookup (docs/optimizer.md, "AVX2 hosts");
//   avx512   dequantise by gathers; requantise by arithmetic (QuantArith: a region compare, one FMA, an exact
//            lookup for the ~0.1% of lanes that land next to a midpoint) since gathers cost ~50 cycles on AMD;
//   avx512_vbmi  the same, dequantising 64 codes at a time with byte permutes instead of gathers.
// Measured on the 2-core Zen dev box, in L1, per element and thread: plain 6.4 ns, avx2 1.7 ns (with gathers;
// ~0.7-1.1 ns since, estimated against VBMI in loaded runs), avx512 1.13 ns, avx512_vbmi 0.60 ns (of which
// requantisation ~0.28, the AdamW arithmetic ~0.25); f32 states 0.25 ns.
//
// Accumulation: dst = dst + src (or dst = src), returning Σ dst² of the result in double: element i of a
// 32768-element chunk goes to lane i mod 16, lanes combine by a fixed pairwise tree, chunks add in order.
// Overwrite with dst = nullptr stores nothing: Σ src², the same sum (gradients copied straight into place).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "optim/quant_map.h"

namespace lt {

// avx512_vbmi: the AVX-512 kernels with the 8-bit dequantisation done by byte permutes (AVX512-VBMI) instead
// of gathers, which are slow on AMD Zen; bits identical either way.
enum class VectorPath : uint8_t { plain, avx2, avx512, avx512_vbmi };

// The widest path the CPU (as masked by LT_MAX_ISA / cpu_features_override) supports.
VectorPath best_vector_path();
const char* vector_path_name(VectorPath path);

// One step's constants, all f32 as the kernels use them.
struct AdamWScalars {
  float clip = 1.0f;
  float decay = 1.0f;
  float beta1 = 0.9f, one_minus_beta1 = 0.1f;
  float beta2 = 0.999f, one_minus_beta2 = 0.001f;
  float bc2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = 0.0f;
};

// Computes the scalars as torch does: 1 - lr·wd, 1 - β, β^t and lr / (1 - β1^t) in double, rounded to f32.
AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                           float clip);

// Where one tensor's f32 state lives.
struct AdamW32Args {
  float* p;         // [n] master weights, updated
  const float* g;   // [n] gradients (not scaled in place)
  float* m;         // [n]
  float* v;         // [n]
  bf16_t* copy;     // [n] bf16 of the updated p, or nullptr
  int64_t n;
};

// Where one tensor's 8-bit state lives.
struct AdamW8Args {
  float* p;          // [n]
  const float* g;    // [n]
  uint8_t* qm;       // [n] codes into the signed map
  float* absmax_m;   // [ceil(n / B)]
  uint8_t* qv;       // [n] codes into the unsigned map
  float* absmax_v;   // [ceil(n / B)]
  bf16_t* copy;      // [n] or nullptr
  int64_t n;
  int64_t block;     // B, a multiple of 16, at most kMaxBlock
};

constexpr int64_t kMaxBlock = 4096;
constexpr int64_t kAccumulateChunk = 32768;

void adamw32_plain(const AdamW32Args& a, const AdamWScalars& s);
void adamw32_avx2(const AdamW32Args& a, const AdamWScalars& s);
void adamw32_avx512(const AdamW32Args& a, const AdamWScalars& s);
void adamw32(VectorPath path, const AdamW32Args& a, const AdamWScalars& s);

void adamw8_plain(const AdamW8Args& a, const AdamWScalars& s);
void adamw8_avx2(const AdamW8Args& a, const AdamWScalars& s);
void adamw8_avx512(const AdamW8Args& a, const AdamWScalars& s);
void adamw8_avx512_vbmi(const AdamW8Args& a, const AdamWScalars& s);
void adamw8(VectorPath path, const AdamW8Args& a, const AdamWScalars& s);

// One chunk (n <= kAccumulateChunk) of the accumulation: returns the chunk's Σ dst² after the update.
// src is f32 or bf16; overwrite: dst = src instead of dst += src.
double accumulate_chunk_plain(float* dst, const float* src, int64_t n, bool overwrite);
double accumulate_chunk_plain(float* dst, const bf16_t* src, int64_t n, bool overwrite);
double accumulate_chunk_avx2(float* dst, const float* src, int64_t n, bool overwrite);
double accumulate_chunk_avx2(float* dst, const bf16_t* src, int64_t n, bool overwrite);
double accumulate_chunk_avx512(float* dst, const float* src, int64_t n, bool overwrite);
double accumulate_chunk_avx512(float* dst, const bf16_t* src, int64_t n, bool overwrite);

// The 16 f64 lanes of a sum of squares combined by the fixed tree (width 8, 4, 2, 1).
inline double combine_lanes(double* lane) {
  for (int width = 8; width >= 1; width /= 2)
    for (int k = 0; k < width; ++k) lane[k] += lane[k + width];
  return lane[0];
}

}  // namespace lt
