// cuda/kernels/mma.cuh — one warp-wide tensor-core product, D[16, 8] = A[16, 16] · B[16, 8] + C (bf16 operands,
// f32 accumulation): PTX `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` on sm_80 and later, and the
// same product from warp shuffles everywhere else (cuda-sim, older GPUs), so a kernel written on fragments runs
// under cuda-sim with the fragment layout the hardware uses. The GPU test CudaNative.MmaFragmentLayout holds
// the two against each other on the device.
//
// Fragments, lane = 4·g + t (g = lane / 4 the group, t = lane % 4), each uint32_t two bf16 (low half first):
//   A (row-major 16 x 16)  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//                          a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B (k x n = 16 x 8)     b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]      (two k of one column n = g)
//   C, D (16 x 8, f32)     c[0..1] = C[g][2t, 2t+1]  c[2..3] = C[g+8][2t, 2t+1]
// The C layout of two neighbouring 16 x 8 tiles is the A layout of their 16 x 16 concatenation (a[0] = tile 0's
// c[0..1], a[1] = its c[2..3], a[2..3] the same of tile 1), which is how a product's result feeds the next one.
//
// Rounding: the tensor core's sum of the 16 exact products and C is not IEEE-sequential; the emulation adds them
// in k order in f32. The two agree to f32 rounding, not bits (kernels built on this are tested to tolerance).
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"

namespace lt::cuda::LT_KERNELS_NS {

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __bfloat162float(__ushort_as_bfloat16((unsigned short)(v & 0xffffu)));
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __bfloat162float(__ushort_as_bfloat16((unsigned short)(v >> 16)));
}

// Two bf16 at p (4-byte aligned) as one fragment register.
__device__ __forceinline__ uint32_t load_pair(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }
// The product from shuffles: lane (g, t) gathers rows g and g+8 of A and columns 2t, 2t+1 of B and sums in
// k order. Every lane of the warp must call it (as mma.sync requires); threadIdx.x % 32 is the lane.
__device__ __forceinline__ void mma_bf16_16816_emulated(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                        const float c[4]) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  float arow[2][16], bcol[2][16];
  for (int tp = 0; tp < 4; ++tp) {
    const int src = 4 * g + tp;
    const uint32_t r0 = __shfl_sync(0xffffffffu, a[0], src), r1 = __shfl_sync(0xffffffffu, a[1], src);
    const uint32_t r2 = __shfl_sync(0xffffffffu, a[2], src), r3 = __shfl_sync(0xffffffffu, a[3], src);
    arow[0][2 * tp] = bf16_lo(r0), arow[0][2 * tp + 1] = bf16_hi(r0);
    arow[1][2 * tp] = bf16_lo(r1), arow[1][2 * tp + 1] = bf16_hi(r1);
    arow[0][8 + 2 * tp] = bf16_lo(r2), arow[0][9 + 2 * tp] = bf16_hi(r2);
    arow[1][8 + 2 * tp] = bf16_lo(r3), arow[1][9 + 2 * tp] = bf16_hi(r3);
    for (int j = 0; j < 2; ++j) {
      const int bsrc = 4 * (2 * t + j) + tp;  // the lane holding column n = 2t + j, k = 2tp.. and 2tp + 8..
      const uint32_t b0 = __shfl_sync(0xffffffffu, b[0], bsrc), b1 = __shfl_sync(0xffffffffu, b[1], bsrc);
      bcol[j][2 * tp] = bf16_lo(b0), bcol[j][2 * tp + 1] = bf16_hi(b0);
      bcol[j][8 + 2 * tp] = bf16_lo(b1), bcol[j][9 + 2 * tp] = bf16_hi(b1);
    }
  }
  for (int e = 0; e < 4; ++e) {
    float sum = c[e];
    for (int k = 0; k < 16; ++k) sum += arow[e >> 1][k] * bcol[e & 1][k];
    d[e] = sum;
  }
}

__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#else
  mma_bf16_16816_emulated(d, a, b, c);
#endif
}

// Four 8 x 8 bf16 matrices from shared memory as fragments, one instruction for what would be eight pair loads
// (PTX ldmatrix.m8n8.x4): lane l gives the address of row l % 8 of matrix j = l / 8 (8 contiguous bf16, 16-byte
// aligned); r[j] of lane l is then matrix j's row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 — the A/B fragment
// layout above. The transposed form gives lane l column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1 instead: a B
// fragment of a row-major [k, n] tile. Under cuda-sim the rows' addresses travel by shuffles.
template <bool kTransposed>
__device__ __forceinline__ void ldmatrix_x4_emulated(uint32_t r[4], const bf16* row) {
  const int lane = int(threadIdx.x) & 31;
  const auto address = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(row));
  for (int j = 0; j < 4; ++j) {
    if (!kTransposed) {
      const auto src = reinterpret_cast<const bf16*>(uintptr_t(__shfl_sync(0xffffffffu, address, 8 * j + lane / 4)));
      r[j] = load_pair(src + 2 * (lane % 4));
    } else {
      const auto lo = reinterpret_cast<const bf16*>(uintptr_t(__shfl_sync(0xffffffffu, address, 8 * j + 2 * (lane % 4))));
      const auto hi =
          reinterpret_cast<const bf16*>(uintptr_t(__shfl_sync(0xffffffffu, address, 8 * j + 2 * (lane % 4) + 1)));
      r[j] = uint32_t(__bfloat16_as_ushort(lo[lane / 4])) | (uint32_t(__bfloat16_as_ushort(hi[lane / 4])) << 16);
    }
  }
}

template <bool kTransposed>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTransposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
#else
  ldmatrix_x4_emulated<kTransposed>(r, row);
#endif
}

// The GPU test's hook: one warp, per lane a[4], b[2], c[4] in, the tensor core's and the emulation's d[4] out.
__global__ void mma_layout_kernel(float* hardware, float* emulated, const uint32_t* a, const uint32_t* b,
                                  const float* c) {
  const int lane = int(threadIdx.x);
  float d[4], e[4];
  mma_bf16_16816(d, a + 4 * lane, b + 2 * lane, c + 4 * lane);
  mma_bf16_16816_emulated(e, a + 4 * lane, b + 2 * lane, c + 4 * lane);
  for (int i = 0; i < 4; ++i) hardware[4 * lane + i] = d[i], emulated[4 * lane + i] = e[i];
}

void mma_layout_check(Stream st, float* hardware, float* emulated, const uint32_t* a, const uint32_t* b,
                      const float* c) {
  LT_LAUNCH(mma_layout_kernel, dim3(1), dim3(32), 0, native_stream(st), hardware, emulated, a, b, c);
}

// The GPU test's hook for ldmatrix: tile [32, 8] bf16 (four 8 x 8 matrices) staged in shared memory, lane l
// addressing its row l; out [4][32][4]: the plain and the transposed load, each from the hardware instruction and
// from the emulation (under cuda-sim all four are the emulation).
__global__ void ldmatrix_layout_kernel(uint32_t* out, const bf16* tile) {
  __shared__ __align__(16) bf16 staged[32 * 8];
  const int lane = int(threadIdx.x);
  for (int i = 0; i < 8; ++i) staged[lane * 8 + i] = tile[lane * 8 + i];
  __syncwarp();
  uint32_t r[4][4];
  ldmatrix_x4<false>(r[0], staged + lane * 8);
  ldmatrix_x4_emulated<false>(r[1], staged + lane * 8);
  ldmatrix_x4<true>(r[2], staged + lane * 8);
  ldmatrix_x4_emulated<true>(r[3], staged + lane * 8);
  for (int v = 0; v < 4; ++v)
    for (int j = 0; j < 4; ++j) out[(v * 32 + lane) * 4 + j] = r[v][j];
}

void ldmatrix_layout_check(Stream st, uint32_t* out, const bf16_t* tile) {
  LT_LAUNCH(ldmatrix_layout_kernel, dim3(1), dim3(32), 0, native_stream(st), out, dev(tile));
}

}  // namespace lt::cuda::LT_KERNELS_NS
