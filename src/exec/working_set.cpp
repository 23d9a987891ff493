#include "exec/working_set.h"

#include <algorithm>
#include <charconv>
#include <fmt/format.h>
#include <numeric>

#include "core/aligned.h"
#include "core/error.h"
#include "cuda/gemm.h"
#include "cuda/layers.h"
#include "model/layout.h"
#include "ops/gated_delta.h"

namespace lt {
namespace {

unsigned buffer_streams_of(const std::string& tag);

// Whether x and y may not share memory: their lifetimes overlap, or y is downloaded (the d2h stream reads
// it) and ends in the window just before x starts — its download may still be running when x's writer
// starts, and waiting for it would stall the compute stream (the head gradients before B(L-1)).
bool conflict(const DeviceBuffer& x, const DeviceBuffer& y) {
  if (!(y.last_window < x.first_window || x.last_window < y.first_window)) return true;
  const unsigned d2h = 1u << unsigned(StreamKind::d2h);
  if ((buffer_streams_of(y.tag) & d2h) && y.last_window + 1 == x.first_window) return true;
  if ((buffer_streams_of(x.tag) & d2h) && x.last_window + 1 == y.first_window) return true;
  return false;
}

// First-fit packing of buffers with lifetimes in the given order: each buffer goes at the lowest offset where
// it overlaps no placed buffer it conflicts with. Returns the peak.
size_t first_fit(std::vector<DeviceBuffer>& bufs, const std::vector<size_t>& order) {
  std::vector<size_t> placed;
  size_t peak = 0;
  for (size_t idx : order) {
    DeviceBuffer& x = bufs[idx];
    // Ranges of placed buffers alive at the same time, sorted by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (size_t p : placed) {
      const DeviceBuffer& y = bufs[p];
      if (!conflict(x, y)) continue;
      busy.push_back({y.offset, y.offset + y.bytes});
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (auto [b, e] : busy) {
      if (offset + x.bytes <= b) break;
      offset = std::max(offset, e);
    }
    x.offset = offset;
    placed.push_back(idx);
    peak = std::max(peak, offset + x.bytes);
  }
  return peak;
}

// The packing: first fit in three orders — largest first; by first window (stack-like lifetimes, the device
// boundaries and kept internals, nest without holes that way); longest-lived first — each with ties by size
// and then creation order, keeping the smallest peak (the first on a tie). Deterministic.
void pack(std::vector<DeviceBuffer>& bufs, size_t* peak) {
  std::vector<size_t> base(bufs.size());
  std::iota(base.begin(), base.end(), size_t(0));
  auto by_size = [&](size_t a, size_t b) { return bufs[a].bytes > bufs[b].bytes; };
  auto by_start = [&](size_t a, size_t b) {
    if (bufs[a].first_window != bufs[b].first_window) return bufs[a].first_window < bufs[b].first_window;
    return by_size(a, b);
  };
  auto by_life = [&](size_t a, size_t b) {
    const int la = bufs[a].last_window - bufs[a].first_window, lb = bufs[b].last_window - bufs[b].first_window;
    if (la != lb) return la > lb;
    return by_size(a, b);
  };
  std::vector<size_t> best_offsets;
  *peak = SIZE_MAX;
  for (int k = 0; k < 3; ++k) {
    std::vector<size_t> order = base;
    if (k == 0) std::stable_sort(order.begin(), order.end(), by_size);
    if (k == 1) std::stable_sort(order.begin(), order.end(), by_start);
    if (k == 2) std::stable_sort(order.begin(), order.end(), by_life);
    const size_t p = first_fit(bufs, order);
    if (p < *peak) {
      *peak = p;
      best_offsets.clear();
      for (const DeviceBuffer& b : bufs) best_offsets.push_back(b.offset);
    }
  }
  for (size_t i = 0; i < bufs.size(); ++i) bufs[i].offset = best_offsets[i];
  // Memory reuse: the earlier buffers that overlap x's range (and the latest window they end in).
  for (DeviceBuffer& x : bufs) {
    for (size_t j = 0; j < bufs.size(); ++j) {
      const DeviceBuffer& y = bufs[j];
      if (&x == &y || y.last_window >= x.first_window) continue;
      if (y.offset < x.offset + x.bytes && x.offset < y.offset + y.bytes) {
        x.reuse_after = std::max(x.reuse_after, y.last_window);
        x.previous.push_back(int(j));
      }
    }
  }
}

bool has_prefix(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

constexpr unsigned bit(StreamKind k) { return 1u << unsigned(k); }

unsigned buffer_streams_of(const std::string& tag) { return buffer_streams(tag); }

}  // namespace

// What the executor does with each buffer (src/exec/executor.cpp): weights, the head's weights and the
// token ids are uploaded and read by kernels; gradients are written by kernels and downloaded; boundary
// ring slots are filled by kernels or uploads and may be downloaded (offload); boundary 0 is uploaded
// (the embedding output), other kept boundaries are kernel-only; activation gradients are downloaded at
// the end (dx0); internals, scratch and the recompute cache are kernel-only.
unsigned buffer_streams(const std::string& tag) {
  const unsigned c = bit(StreamKind::compute), h = bit(StreamKind::h2d), d = bit(StreamKind::d2h);
  if (has_prefix(tag, "weights ") || tag == "head weights" || tag == "tokens" || tag == "boundary 0") return c | h;
  if (has_prefix(tag, "layer grads ") || tag == "head grads" || has_prefix(tag, "activation grads ")) return c | d;
  if (has_prefix(tag, "boundary ring ")) return c | h | d;
  if (has_prefix(tag, "boundary ") || has_prefix(tag, "internals ") || tag == "internals scratch" ||
      tag == "recompute output" || tag == "backward scratch" || has_prefix(tag, "recompute cache ") ||
      tag == "recompute internals" || tag == "block scratch" || tag == "head workspace" || tag == "gemm workspace")
    return c;
  if (tag == "rope table") return c | h;
  if (tag == "loss") return c | d;
  return c | h | d;
}

StreamKind buffer_first_writer(const std::string& tag) {
  return tag == "head weights" || tag == "boundary 0" || tag == "tokens" || tag == "rope table" ||
                 has_prefix(tag, "weights ")
             ? StreamKind::h2d
             : StreamKind::compute;
}

std::vector<std::vector<FenceWait>> WorkingSet::fence_waits() const {
  std::vector<std::vector<FenceWait>> out(window_bytes.size());
  for (const DeviceBuffer& x : buffers) {
    if (x.previous.empty()) continue;
    const StreamKind writer = buffer_first_writer(x.tag);
    std::vector<FenceWait>& waits = out[size_t(x.first_window)];
    for (int j : x.previous) {
      const DeviceBuffer& y = buffers[size_t(j)];
      for (StreamKind on : {StreamKind::compute, StreamKind::h2d, StreamKind::d2h}) {
        if (on == writer || !(buffer_streams(y.tag) & bit(on))) continue;
        auto it = std::find_if(waits.begin(), waits.end(),
                               [&](const FenceWait& f) { return f.writer == writer && f.on == on; });
        if (it == waits.end()) waits.push_back(FenceWait{writer, on, y.last_window});
        else it->after = std::max(it->after, y.last_window);
      }
    }
  }
  return out;
}

std::string window_name(int w, int64_t L) {
  if (w < L) return fmt::format("F{}", w);
  if (w == L) return "H";
  return fmt::format("B{}", 2 * L - w);
}

int window_parse(const std::string& s, int64_t L) {
  if (s == "H") return int(L);
  if (s.size() < 2 || (s[0] != 'F' && s[0] != 'B')) return -1;
  int64_t k = -1;
  auto [end, ec] = std::from_chars(s.data() + 1, s.data() + s.size(), k);
  if (ec != std::errc() || end != s.data() + s.size() || k < 0 || k >= L) return -1;
  return s[0] == 'F' ? forward_window(k) : backward_window(L, k);
}

const DeviceBuffer& WorkingSet::buffer(const std::string& tag) const {
  for (const auto& b : buffers)
    if (b.tag == tag) return b;
  LT_FAIL("working set has no buffer '{}'", tag);
}

LayerBytes LayerBytes::make(const ModelConfig& cfg, const BlockShape& s, DType matrices) {
  LayerBytes b;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const LayerKind kind = cfg.layer_kind(l);
    const BlockShape sl = s.for_layer(kind);
    b.weights = std::max(b.weights, SlabLayout::make(cfg, SlabKind::layer, matrices, kind).bytes());
    b.grads = std::max(b.grads, SlabLayout::make(cfg, SlabKind::layer, DType::f32, kind).bytes());
    b.stored.push_back(block_stored_bytes(sl));
    b.acts_floats = std::max(b.acts_floats, BlockActs::floats(sl));
    b.scratch_floats = std::max(b.scratch_floats, BlockScratch::floats(sl));
  }
  return b;
}

GpuComputeBytes GpuComputeBytes::make(const ModelConfig& cfg, const BlockShape& s, DType matrices) {
  GpuComputeBytes g;
  // The GPU block's carve (cuda/layers/block.inl; the larger of a hybrid's two layer kinds) and the stored
  // internals of the largest layer kind, for a layer that does not keep its own.
  g.block_scratch = cuda::gpu_block_scratch_bytes(s);
  g.recompute_internals = block_stored_bytes(s.for_layer(LayerKind::full_attention));
  if (cfg.is_hybrid())
    g.recompute_internals =
        std::max(g.recompute_internals, block_stored_bytes(s.for_layer(LayerKind::linear_attention)));
  g.head_workspace = cuda::head_workspace_bytes(HeadShape{s.N(), s.C, cfg.vocab_size, float(cfg.rms_norm_eps)}, matrices);
  g.rope_half = s.T * (s.D / 2);
  g.rope_table = size_t(2 * g.rope_half) * sizeof(float);
  g.gemm_workspace = cuda::kGemmWorkspaceBytes;
  return g;
}

WorkingSet plan_working_set(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o) {
  const int64_t L = cfg.num_layers, N = B * T, C = cfg.hidden_size;
  plan.validate(L);
  const DType mdt = o.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  const BlockShape s = BlockShape::make(cfg, B, T, o.activations, o.mlp_chunk_tokens);
  const size_t boundary = s.boundary_bytes();  // in the activation storage dtype
  const size_t act_grad = size_t(N * C) * 4;   // activation gradients stay f32
  const LayerBytes lb = LayerBytes::make(cfg, s, mdt);
  const size_t layer_w = lb.weights, layer_g = lb.grads;
  size_t head_w = SlabLayout::make(cfg, SlabKind::head, mdt).bytes();
  size_t head_g = SlabLayout::make(cfg, SlabKind::head, DType::f32).bytes();
  if (cfg.tie_word_embeddings) {  // lm_head is the embedding matrix
    head_w += SlabLayout::make(cfg, SlabKind::embedding, mdt).bytes();
    head_g += SlabLayout::make(cfg, SlabKind::embedding, DType::f32).bytes();
  }
  const int first = 0, last = int(2 * L), H = head_window(L), first_bwd = backward_window(L, L - 1);

  WorkingSet ws;
  auto add = [&](std::string tag, size_t bytes, int from, int to) {
    DeviceBuffer b;
    b.tag = std::move(tag);
    b.bytes = align_up(bytes, kDeviceAlign);
    b.first_window = from;
    b.last_window = to;
    ws.buffers.push_back(std::move(b));
  };
  // Weights: every window streams layers. Gradient buffers and backward scratch: backward windows.
  for (int i = 0; i < o.weight_buffers; ++i) add(fmt::format("weights {}", i), layer_w, first, last);
  for (int i = 0; i < o.grad_buffers; ++i) add(fmt::format("layer grads {}", i), layer_g, first_bwd, last);
  if (o.resident_head) add("head weights", head_w, first, last);
  else add("head weights", head_w, H, H);
  add("head grads", head_g, H, H);
  add("tokens", size_t(N) * 4 * 3, first, last);  // positions, targets, document ids
  for (int r = 0; r < o.boundary_ring; ++r) add(fmt::format("boundary ring {}", r), boundary, first, last);
  // Device-tier boundary i: written by F(i-1) (the embedding upload for i = 0), last read by B(i)
  // (as input of layer i, or before that as the source of a recompute segment above it).
  for (int64_t i = 0; i < L; ++i)
    if (plan.boundary[size_t(i)] == Tier::device)
      add(fmt::format("boundary {}", i), boundary, forward_window(std::max<int64_t>(i - 1, 0)),
          backward_window(L, i));
  add(fmt::format("boundary {}", L), boundary, forward_window(L - 1), H);  // the head's input
  bool recompute_internals = false;
  for (int64_t l = 0; l < L; ++l) {
    if (plan.keep_internals[size_t(l)])
      add(fmt::format("internals {}", l), lb.stored[size_t(l)], forward_window(l), backward_window(L, l));
    else
      recompute_internals = true;
  }
  if (o.kernels == LayerKernels::cpu) {
    // The f32 working copy (the MLP one chunk at a time): for recomputed internals, and at bf16 storage for every
    // layer's forward and backward.
    if (recompute_internals || s.act != DType::f32) add("internals scratch", lb.acts_floats * 4, first, last);
    add("backward scratch", lb.scratch_floats * 4, first_bwd, last);
  } else {
    LT_CHECK(s.act == DType::bf16, "the GPU block stores bf16 activations, not {} (activation_dtype)",
             dtype_name(s.act));
    // The GPU block computes in its own scratch, forward and backward; a layer that does not keep its internals
    // writes them (forward) and recomputes them (backward) in one stored-internals buffer.
    const GpuComputeBytes g = GpuComputeBytes::make(cfg, s, mdt);
    if (recompute_internals) add("recompute internals", g.recompute_internals, first, last);
    add("block scratch", g.block_scratch, first, last);
    add("head workspace", g.head_workspace, H, H);
    add("loss", g.loss, H, H);
    add("rope table", g.rope_table, first, last);
    add("gemm workspace", g.gemm_workspace, first, last);
  }
  add("activation grads 0", act_grad, H, last);
  add("activation grads 1", act_grad, H, last);  // also the head's f32 input at bf16 storage
  // Recompute cache: a backward that meets a dropped boundary rebuilds every boundary between the
  // nearest stored one below and it, and keeps them until their layers' backward.
  for (int64_t i = 0; i < L; ++i) {
    if (plan.stored(i)) continue;
    ws.recompute_depth = std::max(ws.recompute_depth, i - plan.source_below(i));
  }
  for (int64_t i = 0; i < ws.recompute_depth; ++i) add(fmt::format("recompute cache {}", i), boundary, first_bwd, last);

  pack(ws.buffers, &ws.peak_bytes);
  // A downloaded buffer's memory stays taken one window past its last (conflict(): buffers that start there
  // may not reuse it while its download may still run) — the head gradients in B(L-1).
  ws.window_bytes.assign(size_t(2 * L + 1), 0);
  for (const auto& b : ws.buffers) {
    const bool downloaded = buffer_streams(b.tag) & (1u << unsigned(StreamKind::d2h));
    const int until = std::min(b.last_window + (downloaded ? 1 : 0), last);
    for (int w = b.first_window; w <= until; ++w) ws.window_bytes[size_t(w)] += b.bytes;
  }

  // Boundary 0 never needs a copy: the embedding output stays on the host all step.
  for (int64_t i = 1; i < L; ++i) {
    if (plan.boundary[size_t(i)] == Tier::host) ws.host_activation_bytes += boundary;
    if (plan.boundary[size_t(i)] == Tier::nvme) ws.nvme_bytes += align_up(boundary, kPageAlign);
  }
  return ws;
}

}  // namespace lt
