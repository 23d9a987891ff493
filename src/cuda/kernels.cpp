// cuda/kernels.cpp — host-side sizes shared by both kernel builds.
#include "cuda/kernels.h"

#include "ops/rmsnorm.h"

namespace lt::cuda {

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t C) {
  if (rows <= 0 || C <= 0) return 0;
  const int64_t chunk_rows = rmsnorm_dweight_chunk_rows(rows);
  return size_t((rows + chunk_rows - 1) / chunk_rows) * size_t(C) * sizeof(double);
}

}  // namespace lt::cuda
