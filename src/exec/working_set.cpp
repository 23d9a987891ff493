#include "exec/working_set.h"

#include "core/aligned.h"
#include "model/layout.h"

namespace lt {

size_t WorkingSet::device_bytes() const {
  size_t total = 0;
  for (const auto& b : buffers) total += size_t(b.count) * align_up(b.bytes, kDeviceAlign);
  return total;
}

WorkingSet plan_working_set(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o) {
  const int64_t L = cfg.num_layers, N = B * T, C = cfg.hidden_size;
  plan.validate(L);
  const DType mdt = o.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  const BlockShape s = BlockShape::make(cfg, B, T);
  const size_t boundary = size_t(N * C) * 4;
  const size_t layer_w = SlabLayout::make(cfg, SlabKind::layer, mdt).bytes();
  const size_t layer_g = SlabLayout::make(cfg, SlabKind::layer, DType::f32).bytes();
  size_t head_w = SlabLayout::make(cfg, SlabKind::head, mdt).bytes();
  size_t head_g = SlabLayout::make(cfg, SlabKind::head, DType::f32).bytes();
  if (cfg.tie_word_embeddings) {  // lm_head is the embedding matrix
    head_w += SlabLayout::make(cfg, SlabKind::embedding, mdt).bytes();
    head_g += SlabLayout::make(cfg, SlabKind::embedding, DType::f32).bytes();
  }

  WorkingSet ws;
  auto add = [&](std::string tag, size_t bytes, int count = 1) {
    if (count > 0 && bytes > 0) ws.buffers.push_back({std::move(tag), bytes, count});
  };
  add("weights", layer_w, o.weight_buffers);
  add("layer grads", layer_g, o.grad_buffers);
  add("head weights", head_w);
  add("head grads", head_g);
  add("tokens", size_t(N) * 4 * 3);  // positions, targets, document ids
  int device_boundaries = 0, kept = 0;
  bool any_recompute_internals = false;
  for (int64_t i = 0; i < L; ++i) {
    if (plan.boundary[size_t(i)] == Tier::device) ++device_boundaries;
    if (plan.keep_internals[size_t(i)]) ++kept;
    else any_recompute_internals = true;
  }
  add("boundaries (device tier)", boundary, device_boundaries + 1);  // + boundary L, the head's input
  add("boundary ring", boundary, o.boundary_ring);
  add("internals kept", BlockActs::floats(s) * 4, kept);
  add("internals scratch", BlockActs::floats(s) * 4, any_recompute_internals ? 1 : 0);
  add("recompute output", boundary, any_recompute_internals ? 1 : 0);
  add("backward scratch", BlockScratch::floats(s) * 4);
  add("activation grads", boundary, 2);
  // Recompute cache: a backward that meets a dropped boundary rebuilds every boundary between the
  // nearest stored one below and it, and keeps them until their layers' backward.
  for (int64_t i = 0; i < L; ++i) {
    if (plan.stored(i)) continue;
    int64_t j = plan.source_below(i);
    ws.recompute_depth = std::max(ws.recompute_depth, i - j);
  }
  add("recompute cache", boundary, int(ws.recompute_depth));

  ws.window_bytes.assign(size_t(2 * L + 1), ws.device_bytes());
  // Boundary 0 never needs a copy: the embedding output stays on the host all step.
  for (int64_t i = 1; i < L; ++i) {
    if (plan.boundary[size_t(i)] == Tier::host) ws.host_activation_bytes += boundary;
    if (plan.boundary[size_t(i)] == Tier::nvme) ws.nvme_bytes += align_up(boundary, kPageAlign);
  }
  return ws;
}

}  // namespace lt
