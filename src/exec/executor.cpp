// exec/executor.cpp — one step of a plan, issued as asynchronous device work ordered by events.
//
// The issuing thread runs ahead through the whole step, enqueuing copies and kernel launches; events
// order them (weight ready / buffer free, boundary ready / slot free, gradients out / buffer free) and
// the device's streams overlap uploads, compute and downloads. Host-side work (gradient accumulation)
// runs on the host worker. Every device buffer comes from plan_working_set(), allocated at step start.
#include "exec/executor.h"

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <array>
#include <deque>
#include <future>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <optional>

#include "core/aligned.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "cuda/layers.h"
#include "exec/host_worker.h"
#include "exec/weight_buffers.h"
#include "io/nvme.h"
#include "model/block.h"
#include "ops/ops.h"
#include "ops/rope.h"

namespace lt {
namespace {

constexpr StreamKind kCompute = StreamKind::compute, kH2D = StreamKind::h2d, kD2H = StreamKind::d2h;

}  // namespace

namespace {

// Forwards every operation to the step's own recorder and to the caller's.
class TeeSink : public OpSink {
 public:
  TeeSink(OpSink* a, OpSink* b) : a_(a), b_(b) {}
  void record(const OpRecord& op) override {
    if (a_) a_->record(op);
    if (b_) b_->record(op);
  }

 private:
  OpSink *a_, *b_;
};

}  // namespace

nlohmann::json StepStats::to_json() const {
  nlohmann::json j = summary.to_json();
  j["loss"] = loss();
  j["tokens"] = tokens;
  j["step_s"] = step_s;
  j["peak_device_bytes"] = peak_device_bytes;
  j["predicted_device_bytes"] = predicted_device_bytes;
  return j;
}

// Everything one step needs; destroyed (after the device is idle) when the step ends or fails.
struct StreamingExecutor::Step {
  struct Boundary {
    uint8_t* ptr = nullptr;  // [N, C] in the activation storage dtype
    Event* ready = nullptr;  // the copy that filled it (null: produced by compute, already ordered)
    int ring = -1;           // ring slot holding it, or -1
  };
  struct SlotUse {
    Event* compute = nullptr;
    Event* copy = nullptr;
  };

  StreamingExecutor& ex;
  Device& dev;
  LayerCompute& compute;  // what each launch runs (model/layer_compute.h), bound to this step's buffers
  HostWorker& host;
  const PendingUpdate* update = nullptr;
  GradTarget target;
  std::vector<std::shared_future<void>> updated;  // [L + 2]: embedding, layers, head — the pending update
  std::vector<bool> upload_gated;                 // [L] the h2d stream already waited for layer l's update
  const ModelConfig& cfg;
  const ExecOptions& o;
  ModelSlabs& grads;
  const ModelSlabs& params;
  const ModelSlabs& weights;
  const Batch& batch;
  const Plan& plan;
  const int64_t L, N, C;
  const size_t xe;       // bytes per boundary element (the activation storage dtype)
  const size_t xbytes;   // one boundary [N, C] in the storage dtype
  const size_t dxbytes;  // one activation gradient [N, C] (always f32)
  const BlockShape s;
  const StepTokens tok;
  const LayerBytes lb;   // buffer sizes over the model's layer kinds
  WorkingSet ws;

  std::vector<void*> allocations;
  uint8_t* block = nullptr;                          // the packed working set (ws.peak_bytes)
  std::vector<std::array<Event*, 3>> fences;         // [window][stream]: where each window began
  std::vector<std::vector<FenceWait>> fence_waits;   // [window] (WorkingSet::fence_waits)
  std::deque<std::unique_ptr<Event>> events;

  std::vector<uint8_t*> wbuf;
  std::vector<Event*> wready, wfree;
  WeightBuffers wslots;             // which buffer holds which layer (exec/weight_buffers.h)
  bool head_carried = false;        // the head's weights are still on the device (ExecOptions::resident_head)

  std::vector<uint8_t*> gbuf;
  std::vector<Event*> gfree;
  std::vector<uint8_t*> gstage;  // host staging slabs (the executor's workspace: kept across steps)
  HostSlots gslots;
  int next_g = 0;

  std::vector<uint8_t*> xdev;
  std::vector<uint8_t*> ring;
  std::vector<SlotUse> ring_use;
  int next_ring = 0;
  std::vector<uint8_t*> host_act;  // [L] host-tier boundaries
  // The optimizer lane: the previous step's update, slab by slab (its own thread, so a slow update never
  // holds up the backward's gradient accumulation on the host lane).
  HostWorker* opt_lane = nullptr;
  // NVMe tier: a region of the store per nvme-tier boundary; host staging slots for writes and reads.
  HostWorker* nvme_lane = nullptr;
  std::vector<uint64_t> nvme_offset;  // [L]
  std::vector<bool> nvme_region;      // [L] a region was allocated (freed at the end of the step)
  std::vector<uint8_t*> nvme_wstage, nvme_rstage;
  HostSlots nvme_wslots{2}, nvme_rslots{2};
  int next_nvme_w = 0, next_nvme_r = 0;
  size_t xbytes_io = 0;  // xbytes rounded up to the NVMe alignment
  std::vector<Event*> offloaded;  // [L] the d2h copy that filled host_act[i]; fetches wait for it
  // Transfer windows (Plan::offload_parts / reload_parts): the parts to issue when each window opens.
  std::map<int, std::vector<std::pair<int64_t, int>>> offload_at, reload_at;  // window -> (boundary, part)
  std::vector<Event*> produced;        // [L + 1] the compute that wrote a boundary with offload parts
  std::vector<int> offload_ring;       // [L + 1] its ring slot
  struct Prefetch {
    int ring = -1;
    Event* last = nullptr;
  };
  std::vector<Prefetch> prefetch;      // [L + 1] reload parts issued ahead of the boundary's backward
  std::vector<bool> ring_reserved;     // a slot holding a boundary whose windowed copies are not all issued
  uint8_t* x0_host = nullptr;  // boundary 0 in the storage dtype
  float* dx0_host = nullptr;

  // Internals of the layers that keep them (null: recomputed): for the CPU block at f32 storage each layer's
  // full BlockActs (computed in place), else its stored internals (block_stored_bytes). The CPU block computes
  // in scratch_acts, the one f32 working copy, which also holds a recomputed layer's internals (its MLP one
  // chunk at a time); the GPU block in its own scratch (ComputeBinding).
  std::vector<uint8_t*> kept;
  float *scratch_acts = nullptr, *bscratch = nullptr, *dx[2] = {nullptr, nullptr};
  std::vector<uint8_t*> cache;
  std::map<int64_t, uint8_t*> cached;

  int32_t *pos_dev = nullptr, *targets_dev = nullptr, *doc_dev = nullptr;
  float* rope_dev = nullptr;  // GPU compute: cos, sin [T, D/2] each, uploaded with the tokens
  Event* tokens_ready = nullptr;
  uint8_t *head_w = nullptr, *head_g = nullptr;
  uint8_t* head_stage = nullptr;
  size_t head_stage_bytes = 0;
  double loss = 0;
  double* loss_dev = nullptr;  // where the head writes the loss: `loss` itself for the CPU compute, else device
                               // memory the d2h stream copies into `loss`

  Step(StreamingExecutor& e, HostWorker& hw, ModelSlabs& g, const ModelSlabs& p, const ModelSlabs& w,
       const Batch& b, const Plan& pl)
      : ex(e), dev(e.device_), compute(*e.compute_), host(hw), cfg(e.cfg_), o(e.options_), grads(g), params(p), weights(w), batch(b),
        plan(pl), L(cfg.num_layers), N(b.N()), C(cfg.hidden_size), xe(dtype_size(e.options_.activations)),
        xbytes(size_t(N * C) * xe), dxbytes(size_t(N * C) * 4),
        s(BlockShape::make(cfg, b.B, b.T, e.options_.activations, e.options_.mlp_chunk_tokens)), tok(StepTokens::make(b)),
        lb(LayerBytes::make(cfg, s, w.matrix_dtype())), wslots(e.options_.weight_buffers), gslots(e.options_.grad_buffers) {}

  ~Step() {
    if (std::uncaught_exceptions() > 0) {  // the step failed: nothing may wait for a slot any more
      gslots.abort();
      nvme_wslots.abort();
      nvme_rslots.abort();
    }
    try {
      dev.synchronize();
    } catch (...) {  // the step already failed; the first error is what the caller sees
    }
    for (HostWorker* w : {&host, opt_lane, nvme_lane}) {
      if (!w) continue;
      try {
        w->drain();
      } catch (...) {
      }
    }
    for (void* p : allocations) dev.free(p);
    for (size_t i = 0; i < nvme_region.size(); ++i)
      if (nvme_region[i]) ex.nvme_->free(nvme_offset[i]);
  }

  // --- small helpers -------------------------------------------------------------------------------
  Event* record(StreamKind k) {
    events.push_back(dev.create_event());
    dev.record(*events.back(), k);
    return events.back().get();
  }
  void wait(StreamKind k, Event* e) {
    if (e) dev.wait(k, *e);
  }
  // A buffer of the step's packed working set, checked against the size the code expects.
  template <typename T>
  T* buf(const std::string& tag, size_t bytes) {
    const DeviceBuffer& b = ws.buffer(tag);
    LT_CHECK(b.bytes >= bytes, "working set buffer '{}' has {} bytes, the executor needs {}", tag, b.bytes, bytes);
    return reinterpret_cast<T*>(block + b.offset);
  }

  // Window w begins: fence each stream here. A buffer that starts now in memory an earlier buffer used
  // must not be written before the streams that touched the earlier one are done with it: its first
  // writer waits for those streams' fences of the window after the earlier buffer's last (FenceWait).
  void begin_window(int w) {
    for (StreamKind k : {kCompute, kH2D, kD2H}) fences[size_t(w)][size_t(k)] = record(k);
    for (const FenceWait& f : fence_waits[size_t(w)]) wait(f.writer, fences[size_t(f.after + 1)][size_t(f.on)]);
  }

  TokenInfo token_info() const { return TokenInfo{pos_dev, batch.doc_ids.empty() ? nullptr : doc_dev}; }
  // Layer l's layouts (compute copy on the device, f32 gradients): per layer, as hybrid models' layers differ.
  const SlabLayout& wl(int64_t l) const { return weights.layout(SlabKind::layer, l); }
  const SlabLayout& gl(int64_t l) const { return grads.layout(SlabKind::layer, l); }
  BlockView view(int b, int64_t l) const { return BlockView::bind(wl(l), wbuf[size_t(b)]); }

  // --- set-up --------------------------------------------------------------------------------------
  // The step's device block: the previous step's when plan and shape are the same (same packing), else a
  // new one in place of it.
  void allocate(const std::string& key) {
    const size_t need = ws.device_bytes();
    if (ex.block_ && ex.block_key_ == key) {
      block = static_cast<uint8_t*>(ex.block_);
    } else {
      ex.release_device_memory();
      allocate_block(need);
      ex.block_ = block;
      ex.block_key_ = key;
    }
    set_up_buffers();
  }
  void allocate_block(size_t need) {
    const DeviceMemoryStats mem = dev.memory();
    if (need > mem.capacity - mem.in_use) {
      std::string parts;
      for (const auto& b : ws.buffers)
        parts += fmt::format("{}{} {:.1f} MiB", parts.empty() ? "" : ", ", b.tag, double(b.bytes) / 1048576.0);
      LT_FAIL("plan '{}' needs {:.1f} MiB of device memory for B={} T={} but {:.1f} MiB of {:.1f} MiB are free ({})",
              plan.name, double(need) / 1048576.0, batch.B, batch.T, double(mem.capacity - mem.in_use) / 1048576.0,
              double(mem.capacity) / 1048576.0, parts);
    }
    block = static_cast<uint8_t*>(dev.alloc(need, "step working set"));
  }
  void set_up_buffers() {
    fences.assign(size_t(2 * L + 1), {nullptr, nullptr, nullptr});
    fence_waits = ws.fence_waits();
    const int nw = o.weight_buffers, ng = o.grad_buffers;
    for (int i = 0; i < nw; ++i) wbuf.push_back(buf<uint8_t>(fmt::format("weights {}", i), lb.weights));
    wready.assign(size_t(nw), nullptr);
    wfree.assign(size_t(nw), nullptr);
    for (int i = 0; i < ng; ++i) {
      gbuf.push_back(buf<uint8_t>(fmt::format("layer grads {}", i), lb.grads));
      gstage.push_back(ex.host_ws_.get(fmt::format("grad staging {}", i), lb.grads));
    }
    gfree.assign(size_t(ng), nullptr);

    const SlabLayout& hw_layout = weights.layout(SlabKind::head);
    const SlabLayout& hg_layout = grads.layout(SlabKind::head);
    size_t hw_bytes = hw_layout.bytes(), hg_bytes = hg_layout.bytes();
    if (cfg.tie_word_embeddings) {
      hw_bytes += weights.layout(SlabKind::embedding).bytes();
      hg_bytes += grads.layout(SlabKind::embedding).bytes();
    }
    head_w = buf<uint8_t>("head weights", hw_bytes);
    head_g = buf<uint8_t>("head grads", hg_bytes);
    head_stage = ex.host_ws_.get("head grad staging", hg_bytes);
    head_stage_bytes = hg_bytes;
    int32_t* toks = buf<int32_t>("tokens", size_t(N) * 4 * 3);
    pos_dev = toks;
    targets_dev = toks + N;
    doc_dev = toks + 2 * N;

    xdev.assign(size_t(L + 1), nullptr);
    for (int64_t i = 0; i < L; ++i)
      if (plan.boundary[size_t(i)] == Tier::device) xdev[size_t(i)] = buf<uint8_t>(fmt::format("boundary {}", i), xbytes);
    xdev[size_t(L)] = buf<uint8_t>(fmt::format("boundary {}", L), xbytes);
    for (int r = 0; r < o.boundary_ring; ++r) ring.push_back(buf<uint8_t>(fmt::format("boundary ring {}", r), xbytes));
    ring_use.assign(ring.size(), SlotUse{});

    kept.assign(size_t(L), nullptr);
    bool recompute_internals = false;
    for (int64_t l = 0; l < L; ++l) {
      if (plan.keep_internals[size_t(l)])
        kept[size_t(l)] = buf<uint8_t>(fmt::format("internals {}", l), lb.stored[size_t(l)]);
      else recompute_internals = true;
    }
    dx[0] = buf<float>("activation grads 0", dxbytes);
    dx[1] = buf<float>("activation grads 1", dxbytes);
    ComputeBinding binding;
    binding.shape = s;
    binding.tok = token_info();
    if (o.kernels == LayerKernels::cpu) {
      if (recompute_internals || s.act != DType::f32)
        scratch_acts = buf<float>("internals scratch", lb.acts_floats * 4);
      bscratch = buf<float>("backward scratch", lb.scratch_floats * 4);
      binding.acts = scratch_acts;
      binding.backward_scratch = bscratch;
      loss_dev = &loss;
    } else {
      const GpuComputeBytes g = GpuComputeBytes::make(cfg, s, weights.matrix_dtype());
      if (recompute_internals) binding.recompute_stored = buf<uint8_t>("recompute internals", g.recompute_internals);
      binding.block_scratch = buf<uint8_t>("block scratch", g.block_scratch);
      binding.head_workspace = buf<uint8_t>("head workspace", g.head_workspace);
      binding.gemm_workspace = buf<uint8_t>("gemm workspace", g.gemm_workspace);
      rope_dev = buf<float>("rope table", g.rope_table);
      binding.rope_cos = rope_dev;
      binding.rope_sin = rope_dev + g.rope_half;
      loss_dev = buf<double>("loss", g.loss);
    }
    compute.bind(binding);
    for (int64_t i = 0; i < ws.recompute_depth; ++i)
      cache.push_back(buf<uint8_t>(fmt::format("recompute cache {}", i), xbytes));

    offloaded.assign(size_t(L), nullptr);
    produced.assign(size_t(L + 1), nullptr);
    offload_ring.assign(size_t(L + 1), -1);
    prefetch.assign(size_t(L + 1), Prefetch{});
    ring_reserved.assign(ring.size(), false);
    for (int64_t i = 0; i < int64_t(plan.offload_parts.size()); ++i)
      for (int k = 0; k < int(plan.offload_parts[size_t(i)].size()); ++k)
        offload_at[plan.offload_parts[size_t(i)][size_t(k)].window].push_back({i, k});
    // A reload part placed in window w is issued when window w + 1 begins (it runs during w, as prefetch).
    for (int64_t i = 0; i < int64_t(plan.reload_parts.size()); ++i)
      for (int k = 0; k < int(plan.reload_parts[size_t(i)].size()); ++k)
        reload_at[plan.reload_parts[size_t(i)][size_t(k)].window + 1].push_back({i, k});
    host_act.assign(size_t(L), nullptr);
    for (int64_t i = 1; i < L; ++i)
      if (plan.boundary[size_t(i)] == Tier::host)
        host_act[size_t(i)] = ex.host_ws_.get(fmt::format("boundary {}", i), xbytes);
    nvme_offset.assign(size_t(L), 0);
    nvme_region.assign(size_t(L), false);
    if (plan.uses(Tier::nvme)) {
      xbytes_io = align_up(xbytes, kPageAlign);
      for (int64_t i = 1; i < L; ++i)
        if (plan.boundary[size_t(i)] == Tier::nvme) {
          nvme_offset[size_t(i)] = ex.nvme_->alloc(xbytes_io, fmt::format("boundary {}", i));
          nvme_region[size_t(i)] = true;
        }
      for (int k = 0; k < 2; ++k) {
        nvme_wstage.push_back(ex.host_ws_.get(fmt::format("nvme write staging {}", k), xbytes_io));
        nvme_rstage.push_back(ex.host_ws_.get(fmt::format("nvme read staging {}", k), xbytes_io));
      }
    }
  }

  void upload_tokens() {
    dev.copy_h2d(pos_dev, tok.pos.data(), size_t(N) * 4, kH2D, "h2d tokens");
    dev.copy_h2d(targets_dev, tok.targets.data(), size_t(N) * 4, kH2D, "h2d targets");
    if (!batch.doc_ids.empty()) dev.copy_h2d(doc_dev, batch.doc_ids.data(), size_t(N) * 4, kH2D, "h2d doc ids");
    if (rope_dev) {
      // The GPU kernels read targets and positions unchecked: a bad one is an error here, not a wild read there.
      for (int64_t n = 0; n < N; ++n) {
        const int32_t t = tok.targets[size_t(n)], p = tok.pos[size_t(n)];
        LT_CHECK(t == kIgnoreIndex || (t >= 0 && t < cfg.vocab_size),
                 "token {}: target {} is outside the vocabulary [0, {})", n, t, cfg.vocab_size);
        LT_CHECK(p >= 0 && p < batch.T, "token {}: position {} is outside the sequence [0, {})", n, p, batch.T);
      }
      // RoPE's cos/sin for every position of the sequence (ops' rope_table: the CPU op's angles), once per step,
      // for the rotated dims (Qwen3.5 / Qwen3.6: the first `rotary`): cos [T, R/2] at the table, sin at + T·D/2.
      const int64_t half = s.T * (s.D / 2);
      float* table = ex.host_ws_.get<float>("rope table", size_t(2 * half));
      rope_table(table, table + half, s.T, s.rotary, s.rope_theta);
      dev.copy_h2d(rope_dev, table, size_t(2 * half) * sizeof(float), kH2D, "h2d rope table");
    }
    tokens_ready = record(kH2D);
  }

  // --- the previous step's optimizer update, pipelined into this forward --------------------------------
  size_t gate_index(SlabKind kind, int64_t layer) const {
    return kind == SlabKind::embedding ? 0 : kind == SlabKind::layer ? size_t(1 + layer) : size_t(L + 1);
  }
  void start_update() {
    upload_gated.assign(size_t(L), false);
    if (!update) return;
    updated.resize(size_t(L + 2));
    auto submit = [&](SlabKind kind, int64_t layer, std::string name) {
      auto done = std::make_shared<std::promise<void>>();
      updated[gate_index(kind, layer)] = done->get_future().share();
      opt_lane->submit([this, kind, layer, done] {
        try {
          uint8_t* copy = update->compute_copy ? update->compute_copy->slab(kind, layer) : nullptr;
          update->optimizer->update(kind, layer, update->args, copy);
          done->set_value();
        } catch (...) {
          done->set_exception(std::current_exception());
          throw;
        }
      }, std::move(name), kind == SlabKind::layer ? int(layer) : -1);
    };
    submit(SlabKind::embedding, 0, "update embedding");
    for (int64_t l = 0; l < L; ++l) submit(SlabKind::layer, l, fmt::format("update L{}", l));
    submit(SlabKind::head, 0, "update head");
  }
  // The h2d stream waits (once per slab) until that slab's update has been written.
  void gate_upload(SlabKind kind, int64_t layer) {
    if (!update) return;
    if (kind == SlabKind::layer) {
      if (upload_gated[size_t(layer)]) return;
      upload_gated[size_t(layer)] = true;
    }
    std::shared_future<void> f = updated[gate_index(kind, layer)];
    dev.host_callback(kH2D, [f] { f.get(); }, kind == SlabKind::layer ? fmt::format("wait update L{}", layer)
                                                                      : std::string("wait update head"));
  }

  // --- resources -----------------------------------------------------------------------------------
  // Layer l's weights in a device buffer: where they already are (WeightBuffers' rule), else uploaded into
  // the least recently used buffer once its previous user is done.
  int acquire_weights(int64_t l) {
    const WeightBuffers::Slot slot = wslots.acquire(l);
    const int b = slot.buffer;
    if (!slot.upload) return b;
    wait(kH2D, wfree[size_t(b)]);
    gate_upload(SlabKind::layer, l);
    dev.copy_h2d(wbuf[size_t(b)], weights.layer(l), wl(l).bytes(), kH2D, fmt::format("h2d W{}", l), int(l));
    wready[size_t(b)] = record(kH2D);
    return b;
  }

  // A ring slot for `writer` to fill, once its previous readers and writers are done.
  int take_ring(StreamKind writer) {
    const int n = int(ring.size());
    int tries = 0;
    while (ring_reserved[size_t(next_ring)]) {
      next_ring = (next_ring + 1) % n;
      LT_CHECK(++tries < n, "plan '{}': its transfer windows hold all {} boundary ring slots at once", plan.name, n);
    }
    int r = next_ring;
    next_ring = (next_ring + 1) % n;
    wait(writer, ring_use[size_t(r)].compute);
    wait(writer, ring_use[size_t(r)].copy);
    ring_use[size_t(r)] = SlotUse{};
    return r;
  }

  // Marks that compute work up to `done` used these boundaries (their slots can be reused after it).
  void used_by_compute(const Boundary& b, Event* done) {
    if (b.ring >= 0) ring_use[size_t(b.ring)].compute = done;
  }

  // Compute work on layer weights: waits for them and the inputs, launches, records the buffer free.
  Event* launch_on(int wb, const std::vector<const Boundary*>& inputs, std::function<void()> work,
                   const std::string& name, int64_t layer) {
    wait(kCompute, wready[size_t(wb)]);
    for (const Boundary* in : inputs) wait(kCompute, in->ready);
    dev.launch(kCompute, std::move(work), name, int(layer));
    Event* done = record(kCompute);
    wfree[size_t(wb)] = done;
    for (const Boundary* in : inputs) used_by_compute(*in, done);
    return done;
  }

  // --- forward -------------------------------------------------------------------------------------
  Boundary embed_boundary0(uint8_t* dst, int ring_slot) {
    dev.copy_h2d(dst, x0_host, xbytes, kH2D, "h2d x0", 0);
    return Boundary{dst, record(kH2D), ring_slot};
  }

  void forward() {
    // The embedding lookup runs on the host (the table stays there); only [N, C] moves.
    if (update) updated[gate_index(SlabKind::embedding, 0)].get();
    // At bf16 storage it is computed in f32 and rounded, as the in-memory path does.
    x0_host = ex.host_ws_.get("x0", xbytes);
    float* x0_f32 = s.act == DType::f32 ? reinterpret_cast<float*>(x0_host) : ex.host_ws_.get<float>("x0 f32", size_t(N * C));
    embedding_forward(x0_f32, batch.input_ids.data(),
                      params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>(), N, C,
                      cfg.vocab_size);
    if (s.act != DType::f32) parallel_convert_from_f32(x0_host, s.act, x0_f32, size_t(N * C));
    wait(kCompute, tokens_ready);
    Boundary in;
    if (plan.boundary[0] == Tier::device) {
      in = embed_boundary0(xdev[0], -1);
    } else {
      int r = take_ring(kH2D);
      in = embed_boundary0(ring[size_t(r)], r);
    }
    for (int64_t l = 0; l < L; ++l) {
      if (l > 0) begin_window(forward_window(l));
      Boundary out;
      const Tier t = plan.boundary[size_t(l + 1)];
      if (l + 1 == L || t == Tier::device) {
        out.ptr = xdev[size_t(l + 1)];
      } else {
        // The input's slot is not the output's: this layer reads it (round robin alone guarantees that
        // only while no slot is held for windowed copies).
        const bool held = in.ring >= 0 && ring_reserved[size_t(in.ring)];
        if (in.ring >= 0) ring_reserved[size_t(in.ring)] = true;
        out.ring = take_ring(kCompute);
        if (in.ring >= 0) ring_reserved[size_t(in.ring)] = held;
        out.ptr = ring[size_t(out.ring)];
      }
      int b = acquire_weights(l);
      void* kept_l = kept[size_t(l)];  // null: not kept
      BlockView w = view(b, l);
      uint8_t* x_out = out.ptr;
      const uint8_t* x_in = in.ptr;
      LayerCompute* c = &compute;
      Event* done = launch_on(b, {&in}, [=] { c->forward(x_out, kept_l, x_in, w); }, fmt::format("fwd L{}", l), l);
      used_by_compute(out, done);
      if (l + 1 < L && t == Tier::nvme) offload_to_nvme(l + 1, out, done);
      if (l + 1 < L && t == Tier::host) {
        if (has_parts(plan.offload_parts, l + 1)) {  // its parts go out as their windows open
          produced[size_t(l + 1)] = done;
          offload_ring[size_t(l + 1)] = out.ring;
          ring_reserved[size_t(out.ring)] = true;
        } else {
          wait(kD2H, done);
          dev.copy_d2h(host_act[size_t(l + 1)], out.ptr, xbytes, kD2H, fmt::format("d2h x{}", l + 1), int(l + 1));
          offloaded[size_t(l + 1)] = record(kD2H);
          ring_use[size_t(out.ring)].copy = offloaded[size_t(l + 1)];
        }
      }
      if (l + 1 < L) issue_offloads(forward_window(l + 1), done);
      out.ready = nullptr;
      in = out;
    }
  }

  // --- transfer windows ----------------------------------------------------------------------------
  static bool has_parts(const std::vector<std::vector<TransferPart>>& parts, int64_t i) {
    return size_t(i) < parts.size() && !parts[size_t(i)].empty();
  }
  // Part k of boundary i's copy: elements [first, second) of its N x C.
  std::pair<size_t, size_t> part_range(const std::vector<TransferPart>& parts, int k) const {
    const size_t n = size_t(N * C);
    double before = 0;
    for (int j = 0; j < k; ++j) before += parts[size_t(j)].fraction;
    const size_t a = size_t(std::llround(before * double(n)));
    const size_t b = k + 1 == int(parts.size()) ? n : size_t(std::llround((before + parts[size_t(k)].fraction) * double(n)));
    return {std::min(a, n), std::min(std::max(a, b), n)};
  }

  // Offload parts placed in `window`, issued once the compute ending the window before (`opened_by`) is
  // done: device to host, into the boundary's host copy. The last part frees the ring slot.
  void issue_offloads(int window, Event* opened_by) {
    auto it = offload_at.find(window);
    if (it == offload_at.end()) return;
    for (auto [i, k] : it->second) {
      const auto& parts = plan.offload_parts[size_t(i)];
      auto [a, b] = part_range(parts, k);
      const int r = offload_ring[size_t(i)];
      wait(kD2H, opened_by);
      wait(kD2H, produced[size_t(i)]);
      dev.copy_d2h(host_act[size_t(i)] + a * xe, ring[size_t(r)] + a * xe, (b - a) * xe, kD2H,
                   fmt::format("d2h x{} part {}/{}", i, k + 1, parts.size()), int(i));
      Event* e = record(kD2H);
      ring_use[size_t(r)].copy = e;
      if (k + 1 == int(parts.size())) {
        offloaded[size_t(i)] = e;
        ring_reserved[size_t(r)] = false;
      }
    }
  }

  // Reload parts placed in the window before `window`, issued as it begins: host to device into a ring
  // slot taken by the first part and held until the boundary's backward reads it.
  void issue_reloads(int window) {
    auto it = reload_at.find(window);
    if (it == reload_at.end()) return;
    for (auto [i, k] : it->second) {
      const auto& parts = plan.reload_parts[size_t(i)];
      auto [a, b] = part_range(parts, k);
      Prefetch& f = prefetch[size_t(i)];
      if (f.ring < 0) {
        f.ring = take_ring(kH2D);
        ring_reserved[size_t(f.ring)] = true;
      }
      const uint8_t* src = i == 0 ? x0_host : host_act[size_t(i)];
      if (i > 0) wait(kH2D, offloaded[size_t(i)]);  // the forward's d2h must have landed
      dev.copy_h2d(ring[size_t(f.ring)] + a * xe, src + a * xe, (b - a) * xe, kH2D,
                   fmt::format("h2d x{} part {}/{}", i, k + 1, parts.size()), int(i));
      f.last = record(kH2D);
      ring_use[size_t(f.ring)].copy = f.last;
    }
  }

  // --- NVMe tier -----------------------------------------------------------------------------------
  // Forward: d2h into a host staging slot, then the nvme lane writes it to the boundary's region and
  // frees the slot. The write job is queued on the lane now, from the issuing thread, so every later
  // read of the region (queued later on the same in-order lane) comes after it; the job itself waits
  // until the d2h copy has landed.
  void offload_to_nvme(int64_t i, const Boundary& out, Event* produced) {
    const int k = next_nvme_w;
    next_nvme_w = (next_nvme_w + 1) % int(nvme_wstage.size());
    auto copied = std::make_shared<std::promise<void>>();
    std::shared_future<void> landed = copied->get_future().share();
    nvme_lane->submit([this, k, i, landed] {
      struct Release {  // the slot frees even when the write fails, so the d2h stream never waits forever
        HostSlots& slots;
        int k;
        ~Release() { slots.release(k); }
      } release{nvme_wslots, k};
      landed.get();
      NvmeStore& store = *ex.nvme_;
      store.wait(store.write(nvme_offset[size_t(i)], nvme_wstage[size_t(k)], xbytes_io));
    }, fmt::format("write x{}", i), int(i), xbytes_io);
    wait(kD2H, produced);
    dev.host_callback(kD2H, [this, k] { nvme_wslots.acquire(k, nvme_lane); }, "wait nvme staging");
    dev.copy_d2h(nvme_wstage[size_t(k)], out.ptr, xbytes, kD2H, fmt::format("d2h x{} (nvme)", i), int(i));
    ring_use[size_t(out.ring)].copy = record(kD2H);
    dev.host_callback(kD2H, [copied] { copied->set_value(); }, "hand off to nvme");
  }

  // Backward: the nvme lane reads the region into a staging slot (started as soon as the lane is free,
  // i.e. well ahead of use); the h2d stream waits for the read, copies, and frees the slot.
  Boundary fetch_from_nvme(int64_t i) {
    const int k = next_nvme_r;
    next_nvme_r = (next_nvme_r + 1) % int(nvme_rstage.size());
    auto done = std::make_shared<std::promise<void>>();
    std::shared_future<void> landed = done->get_future().share();
    nvme_lane->submit([this, k, i, done] {
      try {
        nvme_rslots.acquire(k);
        NvmeStore& store = *ex.nvme_;
        store.wait(store.read(nvme_offset[size_t(i)], nvme_rstage[size_t(k)], xbytes_io));
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
        throw;
      }
    }, fmt::format("read x{}", i), int(i), xbytes_io);
    int r = take_ring(kH2D);
    dev.host_callback(kH2D, [landed] { landed.get(); }, fmt::format("wait nvme read x{}", i));
    dev.copy_h2d(ring[size_t(r)], nvme_rstage[size_t(k)], xbytes, kH2D, fmt::format("h2d x{} (nvme)", i), int(i));
    Event* ready = record(kH2D);
    dev.host_callback(kH2D, [this, k] { nvme_rslots.release(k); }, "free nvme staging");
    ring_use[size_t(r)].copy = ready;
    return Boundary{ring[size_t(r)], ready, r};
  }

  // --- head ----------------------------------------------------------------------------------------
  void head() {
    begin_window(head_window(L));
    const SlabLayout& hwl = weights.layout(SlabKind::head);
    const SlabLayout& hgl = grads.layout(SlabKind::head);
    Event* ready = nullptr;  // carried: still in place from the previous micro-batch
    if (!head_carried) {
      gate_upload(SlabKind::head, 0);
      dev.copy_h2d(head_w, weights.slab(SlabKind::head), hwl.bytes(), kH2D, "h2d head");
      if (cfg.tie_word_embeddings)
        dev.copy_h2d(head_w + hwl.bytes(), weights.slab(SlabKind::embedding),
                     weights.layout(SlabKind::embedding).bytes(), kH2D, "h2d lm_head (tied)");
      ready = record(kH2D);
    }

    auto entry_ptr = [&](uint8_t* base, const SlabLayout& head_layout, const SlabLayout& emb_layout,
                         const char* name) -> std::pair<uint8_t*, DType> {
      if (std::string(name) == "lm_head.weight" && cfg.tie_word_embeddings) {
        const SlabEntry& e = emb_layout.entry("embed_tokens.weight");
        return {base + head_layout.bytes() + e.offset, e.dtype};
      }
      const SlabEntry& e = head_layout.entry(name);
      return {base + e.offset, e.dtype};
    };
    // Vectors and gradients are f32 in every layout; only lm_head's dtype follows the compute copy.
    uint8_t* norm_w = entry_ptr(head_w, hwl, weights.layout(SlabKind::embedding), "norm.weight").first;
    auto [lm_w, lm_dt] = entry_ptr(head_w, hwl, weights.layout(SlabKind::embedding), "lm_head.weight");
    uint8_t* dnorm = entry_ptr(head_g, hgl, grads.layout(SlabKind::embedding), "norm.weight").first;
    uint8_t* dlm = entry_ptr(head_g, hgl, grads.layout(SlabKind::embedding), "lm_head.weight").first;
    HeadCall call;
    call.dx = dx[0];
    call.grads = head_g;
    call.grads_bytes = head_stage_bytes;
    call.dnorm_w = reinterpret_cast<float*>(dnorm);
    call.dlm_w = reinterpret_cast<float*>(dlm);
    call.x = xdev[size_t(L)];
    call.x32 = dx[1];  // the input widened to f32 (bf16 storage): dx[1] is free until the first backward
    call.targets = targets_dev;
    call.norm_w = reinterpret_cast<const float*>(norm_w);
    call.lm_w = WeightRef{lm_w, lm_dt};
    call.grad_scale = float(1.0 / double(target.tokens_in_step > 0 ? target.tokens_in_step : tok.count));
    call.shape = HeadShape{N, C, cfg.vocab_size, float(cfg.rms_norm_eps)};
    call.loss = loss_dev;
    LayerCompute* c = &compute;
    wait(kCompute, ready);
    dev.launch(kCompute, [=] { c->head(call); }, "head fwd+bwd");
    Event* done = record(kCompute);
    wait(kD2H, done);
    if (loss_dev != &loss) dev.copy_d2h(&loss, loss_dev, sizeof(double), kD2H, "d2h loss");
    dev.copy_d2h(head_stage, head_g, head_stage_bytes, kD2H, "d2h head grads");
    dev.host_callback(kD2H, [this] {
      host.submit([this] {
        const SlabLayout& hl = grads.layout(SlabKind::head);
        if (target.reducer) {  // the tied part goes with the embedding's (backward's end)
          target.reducer->slab(SlabKind::head, 0, grads.slab(SlabKind::head), hl, head_stage, hl, target.mode);
          return;
        }
        double p = accumulate_grad_slab(grads.slab(SlabKind::head), hl, head_stage, hl, target.mode);
        if (target.partials) target.partials->set(SlabKind::head, 0, p);
        if (cfg.tie_word_embeddings) {  // lm_head's part of the embedding gradient; its norm comes later
          const SlabLayout& el = grads.layout(SlabKind::embedding);
          accumulate_grad_slab(grads.slab(SlabKind::embedding), el, head_stage + hl.bytes(), el, target.mode);
        }
      }, "accumulate head grads", -1, head_stage_bytes);
    }, "hand off head grads");
  }

  // --- backward ------------------------------------------------------------------------------------
  // Boundary i on the device for the backward: kept, fetched from host, rebuilt from the token ids,
  // or recomputed from the nearest stored boundary below (filling the recompute cache).
  // `own`: for layer i's own backward, which takes the reload parts issued ahead in their windows; a
  // recompute segment's source is fetched whole, separately.
  Boundary get_boundary(int64_t i, bool own = true) {
    if (auto it = cached.find(i); it != cached.end()) return Boundary{it->second, nullptr, -1};
    const Tier t = plan.boundary[size_t(i)];
    if (t == Tier::device) return Boundary{xdev[size_t(i)], nullptr, -1};
    if (own && prefetch[size_t(i)].ring >= 0) {
      Prefetch f = prefetch[size_t(i)];
      prefetch[size_t(i)] = Prefetch{};
      ring_reserved[size_t(f.ring)] = false;  // its reader (this layer's backward) is next to use it
      return Boundary{ring[size_t(f.ring)], f.last, f.ring};
    }
    if (i == 0) {  // host or dropped: the embedding output is still on the host
      int r = take_ring(kH2D);
      return embed_boundary0(ring[size_t(r)], r);
    }
    if (t == Tier::host) {
      int r = take_ring(kH2D);
      wait(kH2D, offloaded[size_t(i)]);  // the forward's d2h must have landed in host memory
      dev.copy_h2d(ring[size_t(r)], host_act[size_t(i)], xbytes, kH2D, fmt::format("h2d x{}", i), int(i));
      Event* ready = record(kH2D);
      ring_use[size_t(r)].copy = ready;
      return Boundary{ring[size_t(r)], ready, r};
    }
    if (t == Tier::nvme) return fetch_from_nvme(i);
    LT_CHECK(t == Tier::drop, "boundary {}: unknown tier", i);
    recompute_segment(i);
    return Boundary{cached.at(i), nullptr, -1};
  }

  void recompute_segment(int64_t i) {
    const int64_t j = plan.source_below(i);
    cached.clear();  // earlier segments are consumed: the compute stream runs in order
    Boundary in = get_boundary(j, /*own=*/false);
    for (int64_t m = j; m < i; ++m) {
      uint8_t* out = cache[size_t(m - j)];
      int b = acquire_weights(m);
      BlockView w = view(b, m);
      const uint8_t* x_in = in.ptr;
      LayerCompute* c = &compute;
      // The output alone: a kept layer's internals stay as its forward stored them.
      launch_on(b, {&in}, [=] { c->forward(out, nullptr, x_in, w); }, fmt::format("recompute L{}", m), m);
      cached[m + 1] = out;
      in = Boundary{out, nullptr, -1};
    }
  }

  void backward() {
    wslots.begin_backward();
    int cur = 0;  // dx[cur] holds the gradient of the current layer's output
    for (int64_t l = L - 1; l >= 0; --l) {
      begin_window(backward_window(L, l));
      issue_reloads(backward_window(L, l));
      Boundary xin = get_boundary(l);
      const uint8_t* x_in = xin.ptr;
      LayerCompute* c = &compute;
      // Kept: the CPU block at f32 storage in place, else widened from the stored internals by the MLP half. Not
      // kept: the attention half recomputed now, the MLP chunk by chunk in the MLP half.
      void* kept_l = kept[size_t(l)];
      if (kept_l == nullptr) {
        int b = acquire_weights(l);
        BlockView w = view(b, l);
        launch_on(b, {&xin}, [=] { c->recompute_internals(x_in, w); }, fmt::format("recompute internals L{}", l), l);
      }
      int b = acquire_weights(l);
      BlockView w = view(b, l);
      const int g = next_g;
      next_g = (next_g + 1) % o.grad_buffers;
      wait(kCompute, gfree[size_t(g)]);
      uint8_t* gb = gbuf[size_t(g)];
      const SlabLayout* glp = &gl(l);
      float* dx_out = dx[cur];
      float* dx_in = dx[1 - cur];
      // In two launches: the MLP half's gradients (the slab's tail) go down while the attention half runs,
      // so that only the attention half's follow the last layer's compute.
      Event* mlp_done = launch_on(b, {&xin}, [=] {
        c->zero(gb, glp->bytes());
        BlockGrads gr = BlockGrads::bind(*glp, gb);
        c->backward_mlp(gr, dx_out, kept_l, w);
      }, fmt::format("bwd L{} mlp", l), l);
      Event* done = launch_on(b, {&xin}, [=] {
        BlockGrads gr = BlockGrads::bind(*glp, gb);
        c->backward_attention(dx_in, gr, x_in, kept_l, w);
      }, fmt::format("bwd L{} attention", l), l);
      cur = 1 - cur;
      // Gradients out: d2h into a host staging slab (once the host worker has emptied it), then the host
      // worker adds them into the f32 host gradients. In overwrite mode (a step's first micro-batch) the slab
      // goes straight into the host gradients instead (the device buffer has the host slab's layout) and the
      // host only sums its squares. Nothing else touches them then: the only other reader, the pending update
      // of layer l, finished before W[l]'s forward upload (gate_upload).
      const size_t split = gl(l).entry(kMlpGradsFirst).offset;
      const bool direct = target.mode == GradMode::overwrite && !target.reducer;
      uint8_t* dst = direct ? grads.layer(l) : gstage[size_t(g)];
      wait(kD2H, mlp_done);
      if (!direct) dev.host_callback(kD2H, [this, g] { gslots.acquire(g, &host); }, "wait staging slab");
      dev.copy_d2h(dst + split, gb + split, gl(l).bytes() - split, kD2H, fmt::format("d2h dW{} mlp", l), int(l));
      wait(kD2H, done);
      dev.copy_d2h(dst, gb, split, kD2H, fmt::format("d2h dW{} attention", l), int(l));
      gfree[size_t(g)] = record(kD2H);
      if (direct) {
        dev.host_callback(kD2H, [this, l] {
          host.submit([this, l] {
            const double p = grad_slab_sum_of_squares(grads.layer(l), gl(l));
            if (target.partials) target.partials->set(SlabKind::layer, l, p);
          }, fmt::format("norm dW{}", l), int(l), gl(l).bytes());
        }, "hand off grads");
      } else {
        dev.host_callback(kD2H, [this, g, l] {
          host.submit([this, g, l, slot = gslots.release_guard(g)] {
            if (target.reducer) {
              target.reducer->slab(SlabKind::layer, l, grads.layer(l), gl(l), gstage[size_t(g)], gl(l), target.mode);
              return;
            }
            double p = accumulate_grad_slab(grads.layer(l), gl(l), gstage[size_t(g)], gl(l), target.mode);
            if (target.partials) target.partials->set(SlabKind::layer, l, p);
          }, fmt::format("accumulate dW{}", l), int(l), gl(l).bytes());
        }, "hand off grads");
      }
    }
    // Embedding gradient: the activation gradient of boundary 0 goes to the host, where the table is.
    dx0_host = ex.host_ws_.get<float>("dx0", size_t(N * C));
    dev.copy_d2h(dx0_host, dx[cur], dxbytes, kD2H, "d2h dx0", 0);
    dev.host_callback(kD2H, [this] {
      host.submit([this] {
        if (target.reducer) {
          const uint8_t* tied = cfg.tie_word_embeddings ? head_stage + grads.layout(SlabKind::head).bytes() : nullptr;
          target.reducer->embedding(grads.slab(SlabKind::embedding), grads.layout(SlabKind::embedding), tied,
                                    dx0_host, batch.input_ids.data(), N, target.mode);
          return;
        }
        float* table = grads.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>();
        const int64_t n = cfg.vocab_size * C;
        // Overwrite mode and untied: the head did not write the table this step, so start from zero.
        if (target.mode == GradMode::overwrite && !cfg.tie_word_embeddings) std::memset(table, 0, size_t(n) * 4);
        embedding_backward(table, dx0_host, batch.input_ids.data(), N, C, cfg.vocab_size);
        if (target.partials) target.partials->set(SlabKind::embedding, 0, grad_sum_of_squares(table, n));
      }, "embedding backward", 0, dxbytes);
    }, "hand off dx0");
  }
};

StreamingExecutor::StreamingExecutor(const ModelConfig& cfg, Device& device, ExecOptions options, NvmeStore* nvme)
    : cfg_(cfg), device_(device), options_(options), nvme_(nvme) {
  LT_CHECK(options_.weight_buffers >= 1 && options_.grad_buffers >= 1 && options_.boundary_ring >= 2,
           "executor needs at least 1 weight buffer, 1 gradient buffer and 2 ring slots");
  compute_ = options_.kernels == LayerKernels::gpu ? cuda::make_gpu_layer_compute(device_) : make_cpu_layer_compute();
  // Host staging, host-tier boundaries, x0 and dx0 are copied by the streams: pinned, for a GPU's DMA.
  Device* dev = &device_;  // not `this`: the workspace unpins while the executor is being destroyed
  host_ws_.set_hooks({[dev](uint8_t* p, size_t n, const std::string& name) { dev->pin_host(p, n, "executor " + name); },
                      [dev](uint8_t* p) { dev->unpin_host(p); }});
}

StreamingExecutor::~StreamingExecutor() { release_device_memory(); }

void StreamingExecutor::release_device_memory() {
  carried_.clear();
  carried_head_ = false;
  if (block_) device_.free(block_);
  block_ = nullptr;
  block_key_.clear();
}

StepStats StreamingExecutor::step(ModelSlabs& grads, const ModelSlabs& params, const ModelSlabs& weights,
                                  const Batch& batch, const Plan& plan, TraceRecorder* trace,
                                  const PendingUpdate* update, GradTarget target, uint64_t weights_version) {
  plan.validate(cfg_.num_layers);
  plan.validate_windows(cfg_.num_layers, options_.boundary_ring);
  LT_CHECK(!plan.uses(Tier::nvme) || nvme_ != nullptr,
           "plan '{}' offloads to NVMe but no NVMe directory was given (--nvme-dir)", plan.name);
  const DType want = options_.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  LT_CHECK(weights.matrix_dtype() == want, "the streamed weights are {} but the compute type needs {}",
           dtype_name(weights.matrix_dtype()), dtype_name(want));

  TraceRecorder recorder;
  TeeSink tee(&recorder, trace);
  HostWorker host("host", &device_);
  host.set_sink(&tee);
  std::optional<HostWorker> opt_lane;
  if (update && update->optimizer) {
    opt_lane.emplace("optimizer", &device_);
    opt_lane->set_sink(&tee);
  }
  std::optional<HostWorker> nvme_lane;
  if (plan.uses(Tier::nvme)) {
    nvme_lane.emplace("nvme", &device_);
    nvme_lane->set_sink(&tee);
  }
  device_.set_sink(&tee);
  StepStats stats;
  Timer timer;
  {
    Step st(*this, host, grads, params, weights, batch, plan);
    st.nvme_lane = nvme_lane ? &*nvme_lane : nullptr;
    st.opt_lane = opt_lane ? &*opt_lane : nullptr;
    st.update = update && update->optimizer ? update : nullptr;
    st.target = target;
    st.ws = plan_working_set(cfg_, batch.B, batch.T, plan, options_);
    LT_CHECK(st.tok.count > 0, "the batch has no counted token: every label after the first position of each row is -100");
    const std::string key = fmt::format("{} B{} T{}", plan.to_json().dump(), batch.B, batch.T);
    const bool carry = st.update == nullptr && weights_version != 0 && weights_version == carried_version_ &&
                       &weights == carried_weights_ && block_ && key == block_key_;
    if (carry) {
      st.wslots.carry(carried_);  // the layers the previous step left in the weight buffers
      st.head_carried = carried_head_;
    }
    carried_.clear();  // valid again only once this step has finished
    carried_head_ = false;
    device_.reset_peak();
    st.allocate(key);
    st.start_update();
    st.begin_window(forward_window(0));
    st.upload_tokens();
    st.forward();
    st.head();
    st.backward();
    try {
      device_.synchronize();
    } catch (...) {
      // A failed host lane (an NVMe write or read, the optimizer) breaks the promises the streams wait on, so the
      // device's error is then a consequence ("broken promise"): the lane's first error is the cause, reported
      // instead when there is one.
      for (HostWorker* w : {&host, opt_lane ? &*opt_lane : nullptr, nvme_lane ? &*nvme_lane : nullptr})
        if (w) w->drain();
      throw;
    }
    host.drain();
    if (opt_lane) opt_lane->drain();
    if (nvme_lane) nvme_lane->drain();
    stats.loss_sum = st.loss;
    stats.tokens = st.tok.count;
    stats.predicted_device_bytes = st.ws.device_bytes();
    carried_ = st.wslots.layers();
    carried_head_ = options_.resident_head;
    carried_version_ = weights_version;
    carried_weights_ = &weights;
  }
  stats.step_s = timer.seconds();
  stats.peak_device_bytes = device_.memory().peak;
  device_.set_sink(nullptr);
  stats.summary = recorder.summarize();
  return stats;
}

}  // namespace lt
