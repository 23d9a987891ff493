// cuda/kernels.cpp — host-side sizes shared by both kernel builds.
#include "cuda/kernels.h"

#include <algorithm>

#include "core/error.h"
#include "ops/rmsnorm.h"

namespace lt::cuda {

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t C) {
  if (rows <= 0 || C <= 0) return 0;
  const int64_t chunk_rows = rmsnorm_dweight_chunk_rows(rows);
  return size_t((rows + chunk_rows - 1) / chunk_rows) * size_t(C) * sizeof(double);
}

int64_t short_conv_dweight_chunk_tokens(int64_t N) { return std::max<int64_t>(32, (N + 63) / 64); }
int64_t delta_gates_param_chunk_tokens(int64_t N) { return std::max<int64_t>(256, (N + 63) / 64); }

size_t short_conv_backward_workspace_bytes(int64_t N, int64_t Cc, int64_t K) {
  if (N <= 0 || Cc <= 0 || K <= 0) return 0;
  const int64_t chunk = short_conv_dweight_chunk_tokens(N);
  return size_t((N + chunk - 1) / chunk) * size_t(K) * size_t(Cc) * sizeof(double);
}

size_t delta_gates_backward_workspace_bytes(int64_t N, int64_t Hv) {
  if (N <= 0 || Hv <= 0) return 0;
  const int64_t chunk = delta_gates_param_chunk_tokens(N);
  return size_t((N + chunk - 1) / chunk) * 2 * size_t(Hv) * sizeof(double);
}

size_t attention_backward_workspace_bytes(AttentionShape s) {
  return size_t(s.B) * size_t(s.Hq) * size_t(s.T) * sizeof(float);
}

void check_attention_shape(const char* op, AttentionShape s) {
  LT_CHECK(s.B >= 0 && s.T >= 0 && s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0,
           "{}: bad shape B={} T={} Hq={} Hkv={} (Hq must be a multiple of Hkv)", op, s.B, s.T, s.Hq, s.Hkv);
  LT_CHECK(s.B <= 65535 && s.Hq <= 65535 && s.T < (int64_t(1) << 31),
           "{}: B={} and Hq={} must be at most 65535 (CUDA grid limits), T={} below 2^31", op, s.B, s.Hq, s.T);
}

size_t gated_delta_forward_workspace_bytes(const DeltaShape& s) {
  return size_t(s.B * s.Hv) * size_t(gated_delta_forward_block_floats(s)) * sizeof(float);
}

size_t gated_delta_backward_workspace_bytes(const DeltaShape& s) {
  return size_t(s.B * s.Hk) * size_t(gated_delta_backward_block_floats(s)) * sizeof(float);
}

void check_gated_delta_shape(const char* op, const DeltaShape& s) {
  LT_CHECK(s.B >= 0 && s.T >= 0 && s.Hk > 0 && s.Hv > 0 && s.Hv % s.Hk == 0 && s.dk > 0 && s.dv > 0,
           "{}: bad shape B={} T={} Hk={} Hv={} dk={} dv={} (value heads must be a multiple of key heads)", op, s.B,
           s.T, s.Hk, s.Hv, s.dk, s.dv);
  LT_CHECK(s.B * s.Hv < (int64_t(1) << 31), "{}: B·Hv = {} blocks exceed the CUDA grid", op, s.B * s.Hv);
}

void throw_unsupported_head_dim(const char* op, int64_t D) {
  LT_FAIL("{}: head dimension {} is not supported by the CUDA attention kernels (1 to 256)", op, D);
}

}  // namespace lt::cuda
