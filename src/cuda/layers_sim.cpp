// cuda/layers_sim.cpp — the composite ops (cuda/layers.h) on cuda-sim's kernels and the emulated cuBLASLt calls.
#define LT_KERNELS_NS sim
#define LT_LAYERS_NATIVE 0
#include "cuda/layers/block.inl"
#include "cuda/layers/head.inl"

namespace lt::cuda {

// The workspace layouts are the same in both builds; cuda-sim's carve measures them.
size_t head_workspace_bytes(const HeadShape& s, DType lm_type) {
  return sim::detail::HeadScratch::carve(nullptr, s, lm_type).bytes;
}

size_t gpu_block_scratch_bytes(const BlockShape& s) { return sim::detail::BlockScratchGpu::carve(nullptr, s).bytes; }

}  // namespace lt::cuda
