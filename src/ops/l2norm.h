// ops/l2norm.h — the L2 normalisation Gated DeltaNet applies to each query and key head before the delta
// rule (HF Qwen3.5's l2norm, FLA's use_qk_l2norm_in_kernel): unit-length keys keep the state update
// S ← S + k (β(v − Sᵀk))ᵀ a contraction, whatever the projection's scale.
//
// Legend: N tokens, H heads (Hk at the call site), D head dimension (dk); rows = N·H.
//
//   r = 1 / sqrt(Σ_d x_d² + eps)   (eps = 1e-6 in HF; a sum, not a mean: unlike RMSNorm)
//   y_d = x_d · r
// Backward (∂r/∂x_j = −r³ x_j):  dx_j = r · (g_j − x_j · r² · Σ_d g_d x_d).
//
// The heads of a token are contiguous (D each), tokens are ld elements apart (ld >= H·D): q and k can be read
// as slices of the conv output [N, 2·Hk·dk + Hv·dv] and written anywhere. Contiguous: ld = H·D.
// Sums in f32, 16 lanes (lane k takes d ≡ k mod 16, in order) combined by a fixed tree, as ops/rmsnorm.h.
#pragma once

#include <cstdint>

namespace lt {

// out (token stride ld_out) and rnorm[N, H] (r of each row, saved) from in (token stride ld_in).
// out may be in (same ld).
void l2norm_forward(float* out, float* rnorm, const float* in, int64_t N, int64_t H, int64_t D, int64_t ld_out,
                    int64_t ld_in, float eps);

// din (token stride ld_din) written from dout (ld_dout), the forward's in (ld_in) and rnorm[N, H]. din may be
// dout (same ld); it must not alias in.
void l2norm_backward(float* din, const float* dout, const float* in, const float* rnorm, int64_t N, int64_t H,
                     int64_t D, int64_t ld_din, int64_t ld_dout, int64_t ld_in);

}  // namespace lt
