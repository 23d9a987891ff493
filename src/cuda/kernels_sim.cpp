// cuda/kernels_sim.cpp — the kernel sources compiled by the host compiler against cuda-sim, into
// lt::cuda::sim: every launch runs on the CPU before it returns (docs/cuda-sim.md).
#define LT_KERNELS_NS sim
#include "cuda/kernels/all.cuh"

namespace lt::cuda {

// The head's workspace layout is the same in both builds; cuda-sim's carve measures it.
size_t head_workspace_bytes(const HeadShape& s, DType lm_type) {
  return sim::detail::HeadScratch::carve(nullptr, s, lm_type).bytes;
}

}  // namespace lt::cuda
