// cuda/kernels.cpp — host-side sizes shared by both kernel builds.
#include "cuda/kernels.h"

#include "core/error.h"
#include "ops/rmsnorm.h"

namespace lt::cuda {

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t C) {
  if (rows <= 0 || C <= 0) return 0;
  const int64_t chunk_rows = rmsnorm_dweight_chunk_rows(rows);
  return size_t((rows + chunk_rows - 1) / chunk_rows) * size_t(C) * sizeof(double);
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

void throw_unsupported_head_dim(const char* op, int64_t D) {
  LT_FAIL("{}: head dimension {} is not supported by the CUDA attention kernels (1 to 256)", op, D);
}

}  // namespace lt::cuda
