// cuda/layers_sim.cpp — the composite ops (cuda/layers.h) on cuda-sim's kernels and the emulated cuBLASLt calls.
#define LT_KERNELS_NS sim
#define LT_LAYERS_NATIVE 0
#include "cuda/layers/block.inl"
#include "cuda/layers/head.inl"
#include "cuda/layers/compute.inl"
#include "cuda/cuda_device.h"
#include "cuda/gemm.h"

#include <algorithm>

namespace lt::cuda {

// The workspace layouts are the same in both builds; cuda-sim's carve measures them.
size_t head_workspace_bytes(const HeadShape& s, DType lm_type) {
  return sim::detail::HeadScratch::carve(nullptr, s, lm_type).bytes;
}

HeadShape gpu_head_shape(HeadShape s) {
  const int64_t per_token = std::max<int64_t>(s.V, 1) * int64_t(sizeof(float) + sizeof(bf16_t));
  s.chunk_tokens = std::clamp<int64_t>(kGpuHeadLogitsBytes / per_token / 256 * 256, 256, 4096);
  return s;
}

size_t cuda_block_scratch_bytes(const BlockShape& s) {
  // Carved per layer kind (full attention; Gated DeltaNet where s.Hk > 0) and MLP (dense; sparse where s.E > 0):
  // the largest.
  size_t bytes = 0;
  for (const bool sparse : {false, true}) {
    if (sparse && s.E == 0) continue;
    bytes = std::max(bytes, sim::detail::BlockScratchCuda::carve(nullptr, s.for_layer(LayerKind::full_attention, sparse)).bytes);
    if (s.Hk > 0)
      bytes = std::max(bytes,
                       sim::detail::BlockScratchCuda::carve(nullptr, s.for_layer(LayerKind::linear_attention, sparse)).bytes);
  }
  return bytes;
}

std::vector<ComputeBuffer> cuda_compute_buffers(const ModelConfig& cfg, const BlockShape& s, DType matrices) {
  // A layer that does not keep its internals writes its attention half and n2 (forward) and recomputes them
  // (backward) in one buffer of the largest layer's; its MLP's internals stay in the block scratch's chunk.
  size_t recompute = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    recompute = std::max(recompute, block_recompute_stored_bytes(s.for_layer(cfg, l)));
  const size_t scratch = cuda_block_scratch_bytes(s);  // a sparse layer's route slice included (cuda/layers/moe.inl)
  const HeadShape head = gpu_head_shape(HeadShape{s.N(), s.C, cfg.vocab_size, float(cfg.rms_norm_eps)});
  const size_t rope = size_t(2 * s.T * (s.D / 2)) * sizeof(float);
  return {{ComputeBufferRole::recompute_internals, "recompute internals", recompute, ComputeSpan::step, true},
          {ComputeBufferRole::block_scratch, "block scratch", scratch, ComputeSpan::step},
          {ComputeBufferRole::head_workspace, "head workspace", head_workspace_bytes(head, matrices), ComputeSpan::head},
          {ComputeBufferRole::loss, "loss", sizeof(double), ComputeSpan::head},
          {ComputeBufferRole::rope_table, "rope table", rope, ComputeSpan::step},
          {ComputeBufferRole::gemm_workspace, "gemm workspace", kGemmWorkspaceBytes, ComputeSpan::step}};
}

std::unique_ptr<LayerCompute> make_cuda_layer_compute(Device& device) {
#if LT_WITH_CUDA
  if (is_cuda_device(device)) return native::make_layer_compute(cuda_native_stream(device, StreamKind::compute));
#endif
  return sim::make_layer_compute(nullptr);
}

}  // namespace lt::cuda
