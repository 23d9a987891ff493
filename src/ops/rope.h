// ops/rope.h — rotary position embedding, rotate-half layout (HF Llama/Qwen):
//   x' = x · cos + rotate_half(x) · sin, rotate_half([a, b]) = [-b, a], a and b the two halves of D.
//   inv_freq[j] = 1 / theta^(2j/D) (f32, as HF), angle = f32(pos) · inv_freq[j].
//
// Partial rotary (Qwen3.5/3.6 gated attention, partial_rotary_factor 0.25): only the first R dims of each
// head are rotated, with R in place of D everywhere above (HF builds inv_freq from dim = int(D · factor),
// and apply_rotary_pos_emb rotates x[..., :R] by rotate_half over those R dims); dims R..D-1 pass through
// untouched. The full rope is the case R = D and gives the same bits (one code path).
//
// YaRN (rope_type "yarn"; GPT-OSS: factor 32, β_fast 32, β_slow 1, original 4096), as transformers'
// _compute_yarn_parameters in f32: pos_freq_j = θ^(2j/R); extrapolation 1/pos_freq_j, interpolation
// 1/(factor·pos_freq_j); between the dims [low, high] whose wavelength fits β_fast and β_slow rotations in the
// original context (floor/ceil when `truncate`) a linear ramp r_j = clamp((j − low)/(high − low), 0, 1) blends them,
// inv_freq_j = interp_j·r_j + extrap_j·(1 − r_j) (torch's `interp·(1 − e) + extrap·e`, e = 1 − r); and cos and sin
// are multiplied by the attention factor (0.1·ln(factor) + 1 unless the config names one) in f32. A plain spec is
// factor 1, attention factor 1: the same bits as before YaRN existed (one code path).
#pragma once

#include <cstdint>

namespace lt {

// A rotary embedding's frequencies: θ alone (rope_type "default") or YaRN. Implicit from θ: every caller that
// passes a rope_theta gets plain RoPE.
struct RopeSpec {
  double theta = 10000.0;
  double factor = 1.0;  // YaRN's scaling factor; 1: plain RoPE
  double beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_max_positions = 0;  // original_max_position_embeddings
  bool truncate = true;
  double attention_factor = 1.0;  // cos and sin multiplied by it

  RopeSpec() = default;
  RopeSpec(double theta_) : theta(theta_) {}  // NOLINT(google-explicit-constructor): plain RoPE from θ
  // YaRN with transformers' defaults filled: attention_factor 0 means 0.1·ln(factor) + 1.
  static RopeSpec yarn(double theta, double factor, double beta_fast, double beta_slow, int64_t original_max,
                       bool truncate, double attention_factor = 0);
  bool is_yarn() const { return factor != 1.0; }
  bool operator==(const RopeSpec&) const = default;
};

// Rotates x[N, H, D] in place; pos[N] is each token's position (per-document positions when packing).
void rope_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope);

// Backward of the rotation (its transpose), in place on dx[N, H, D].
void rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope);

// The f32 cos and sin rope_forward rotates position p by, for p in [0, P): cos[P, D/2], sin[P, D/2]. The
// CUDA kernels read this table, so they rotate by the CPU op's bits.
// A partial rope's table is rope_table(cos, sin, P, R, rope): the angles depend on R alone.
void rope_table(float* cos, float* sin, int64_t P, int64_t D, const RopeSpec& rope);

// Rotates the first R dims of each head of x[N, H, D] in place (R even, 0 < R <= D); dims R..D-1 untouched.
// R = D calls rope_forward (so an installed ops override runs it too).
void rope_partial_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R,
                          const RopeSpec& rope);

// Backward of rope_partial_forward, in place on dx[N, H, D]: dims R..D-1 pass the gradient through.
void rope_partial_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R,
                           const RopeSpec& rope);
}  // namespace lt
