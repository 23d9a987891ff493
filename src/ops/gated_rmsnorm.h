// ops/gated_rmsnorm.h — the gated RMSNorm on Gated DeltaNet's output (HF Qwen3_5RMSNormGated, "norm before
// gate"): each value head's output is normalised, scaled by a plain weight (initialised to ones, not zero-centred
// like Qwen3.5's block norms) and gated by SiLU of the z projection, so the layer can shut a head off per token.
//
// Legend: rows = N·Hv (one row per token and value head), dv value head dimension.
//
//   rstd = 1 / sqrt(mean_d(x_d²) + eps),   y_d = ((x_d · rstd) · w_d) · silu(z_d)     (HF's order of roundings)
// Backward, with G_d = g_d · silu(z_d) the gradient reaching the plain RMSNorm (as ops/rmsnorm.h):
//   dx_j  = rstd · (w_j G_j − x_j · rstd² · mean_d(w_d G_d x_d))     written
//   dz_d  = g_d · (x_d · rstd) · w_d · silu'(z_d),  silu'(z) = σ(z)(1 + z(1 − σ(z)))   written
//   dw_d += Σ_rows G_d · (x_d · rstd)                                accumulated
// Sums over d in 16 f32 lanes combined by a fixed tree (as rmsnorm); dw reduced over fixed row chunks into double
// partials summed in chunk order and added once in f32: the bits never depend on the thread count.
#pragma once

#include <cstdint>

namespace lt {

// out[rows, dv]; rstd[rows] saved; from x[rows, dv], z[rows, dv], weight[dv].
void gated_rmsnorm_forward(float* out, float* rstd, const float* x, const float* z, const float* weight,
                           int64_t rows, int64_t dv, float eps);

// dx[rows, dv], dz[rows, dv] written; dweight[dv] accumulated. All buffers distinct.
void gated_rmsnorm_backward(float* dx, float* dz, float* dweight, const float* dout, const float* x, const float* z,
                            const float* weight, const float* rstd, int64_t rows, int64_t dv);

}  // namespace lt
