// exec/step_schedule.cpp — the builder of a step's schedule: the executor's issue order, its resources (weight
// buffers, the boundary ring, gradient buffers and staging slots, NVMe staging), and what each operation waits for.
#include "exec/step_schedule.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>

#include "core/aligned.h"
#include "core/error.h"
#include "exec/backend.h"
#include "exec/weight_buffers.h"
#include "io/nvme.h"
#include "model/block.h"
#include "model/finetune.h"

namespace lt {

const char* lane_name(Lane lane) {
  static const char* names[] = {"compute", "h2d", "d2h", "host", "optimizer", "nvme", "issue"};
  return names[int(lane)];
}

bool embedding_trained(const ModelConfig& cfg) { return SlabLayout::trained(cfg, SlabKind::embedding).bytes() > 0; }

std::vector<int> StepOp::waits_for() const {
  std::vector<int> all = deps;
  all.insert(all.end(), fences.begin(), fences.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

const StepBuffer& StepSchedule::buffer(const std::string& tag) const {
  const int i = find(tag);
  LT_CHECK(i >= 0, "the step's schedule has no buffer '{}'", tag);
  return buffers[size_t(i)];
}

int StepSchedule::find(const std::string& tag) const {
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].tag == tag && buffers[i].present) return int(i);
  return -1;
}

std::vector<size_t> window_device_bytes(const std::vector<StepBuffer>& buffers, int windows) {
  std::vector<size_t> bytes(size_t(windows), 0);
  const unsigned d2h = 1u << unsigned(StreamKind::d2h);
  for (const StepBuffer& b : buffers) {
    if (!b.present || b.memory != Memory::device) continue;
    const int until = std::min(b.last_window + ((b.streams & d2h) ? 1 : 0), windows - 1);
    for (int w = b.first_window; w <= until; ++w) bytes[size_t(w)] += b.bytes;
  }
  return bytes;
}

namespace {

constexpr Lane kCompute = Lane::compute, kH2D = Lane::h2d, kD2H = Lane::d2h;

// The schedule of one step, built in the executor's issue order (forward, head, backward). Resources are
// handed out as the executor hands them out: weight buffers by WeightBuffers' rule, ring slots round robin
// (skipping slots held for windowed copies), gradient buffers and staging slots round robin.
class Builder {
 public:
  Builder(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o,
          const StepScheduleOptions& so)
      : cfg_(cfg), L_(cfg.num_layers), N_(B * T), o_(o), so_(so), wslots_(o.weight_buffers) {
    s_.L = L_;
    s_.B = B;
    s_.T = T;
    s_.options = o;
    s_.schedule_options = so;
    s_.plan = plan;
    shape_ = BlockShape::make(cfg, B, T, o.activations, o.mlp_chunk_tokens);
    LT_CHECK(o.kernels == LayerKernels::cpu || shape_.act == DType::bf16,
             "the CUDA block stores bf16 activations, not {} (activation_dtype)", dtype_name(shape_.act));
    mdt_ = o.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
    s_.boundary_bytes = shape_.boundary_bytes();
    lowest_ = lowest_backward_layer(cfg);
    for (int64_t i = 0; i < L_; ++i)
      if (!plan.stored(i)) s_.recompute_depth = std::max(s_.recompute_depth, i - plan.source_below(i));
  }

  StepSchedule build() {
    declare_buffers();
    start_update();
    begin_window(forward_window(0));
    upload_tokens();
    forward();
    head();
    backward();
    finish();
    return std::move(s_);
  }

 private:
  struct Boundary {
    int buf = -1;    // the buffer holding it
    int ready = -1;  // the copy that filled it (-1: produced by compute, ordered already)
    int ring = -1;   // the ring slot holding it, or -1
  };
  struct SlotUse {
    int compute = -1, copy = -1;
  };
  struct Prefetch {
    int ring = -1, last = -1;
  };

  const Plan& plan() const { return s_.plan; }
  Tier tier(int64_t i) const { return plan().boundary[size_t(i)]; }

  // --- buffers -------------------------------------------------------------------------------------
  int declare(std::string tag, Memory memory, size_t bytes, PlanTerm term = PlanTerm::fixed, int64_t index = -1,
              bool present = true) {
    StepBuffer b;
    b.tag = std::move(tag);
    b.memory = memory;
    b.bytes = memory == Memory::device ? align_up(bytes, kDeviceAlign)
              : memory == Memory::nvme ? align_up(bytes, kPageAlign)
                                       : bytes;
    b.term = term;
    b.index = index;
    b.present = present;
    s_.buffers.push_back(std::move(b));
    return int(s_.buffers.size()) - 1;
  }
  void reserve(int buf, int first, int last) {
    s_.buffers[size_t(buf)].reserve_first = first;
    s_.buffers[size_t(buf)].reserve_last = last;
  }

  // Device buffers in the working set's order (its packing breaks ties by it), then the host's.
  void declare_buffers() {
    const int first = 0, last = int(2 * L_), H = head_window(L_), first_bwd = backward_window(L_, L_ - 1);
    const size_t xbytes = s_.boundary_bytes, dxbytes = size_t(N_ * cfg_.hidden_size) * 4;
    size_t layer_w = 0, layer_g = 0;
    for (int64_t l = 0; l < L_; ++l) {
      layer_w = std::max(layer_w, SlabLayout::make_layer(cfg_, l, mdt_).bytes());
      layer_g = std::max(layer_g, SlabLayout::trained(cfg_, SlabKind::layer, l).bytes());  // frozen tensors: none
    }
    head_w_bytes_ = SlabLayout::make(cfg_, SlabKind::head, mdt_).bytes();
    head_g_bytes_ = SlabLayout::trained(cfg_, SlabKind::head).bytes();
    if (cfg_.tie_word_embeddings) {  // lm_head is the embedding matrix
      head_w_bytes_ += SlabLayout::make(cfg_, SlabKind::embedding, mdt_).bytes();
      head_g_bytes_ += SlabLayout::trained(cfg_, SlabKind::embedding).bytes();
    }
    // Weights and the ring: every window streams through them. Gradient buffers: the backward.
    for (int b = 0; b < o_.weight_buffers; ++b) {
      wbuf_.push_back(declare(fmt::format("weights {}", b), Memory::device, layer_w, PlanTerm::fixed, b));
      reserve(wbuf_.back(), first, last);
    }
    for (int g = 0; g < o_.grad_buffers; ++g) {
      gbuf_.push_back(declare(fmt::format("layer grads {}", g), Memory::device, layer_g, PlanTerm::fixed, g));
      reserve(gbuf_.back(), first_bwd, last);
    }
    head_w_ = declare("head weights", Memory::device, head_w_bytes_);
    if (o_.resident_head) reserve(head_w_, first, last);
    head_g_ = declare("head grads", Memory::device, head_g_bytes_);
    s_.tokens = TokenBuffer{N_, embedding_trained(cfg_)};
    tokens_ = declare("tokens", Memory::device, s_.tokens.bytes());  // positions, targets, doc ids, token groups
    reserve(tokens_, first, last);
    s_.buffers[size_t(tokens_)].bound = true;  // every layer reads the positions, the head the targets
    for (int r = 0; r < o_.boundary_ring; ++r) {
      ring_.push_back(declare(fmt::format("boundary ring {}", r), Memory::device, xbytes, PlanTerm::fixed, r));
      reserve(ring_.back(), first, last);
    }
    // Device-tier boundaries live from their producer to their layer's backward; boundary L feeds the head.
    xdev_.assign(size_t(L_ + 1), -1);
    for (int64_t i = 0; i < L_; ++i)
      xdev_[size_t(i)] = declare(fmt::format("boundary {}", i), Memory::device, xbytes, PlanTerm::boundary, i,
                                 tier(i) == Tier::device);
    xdev_[size_t(L_)] = declare(fmt::format("boundary {}", L_), Memory::device, xbytes);
    // Kept internals: each layer's own kind's size.
    bool recomputes = false;
    internals_.assign(size_t(L_), -1);
    for (int64_t l = 0; l < L_; ++l) {
      const bool kept = plan().keep_internals[size_t(l)];
      recomputes |= !kept;
      internals_[size_t(l)] =
          declare(fmt::format("internals {}", l), Memory::device,
                  block_stored_bytes(shape_.for_layer(cfg_, l)), PlanTerm::internals, l, kept);
    }
    // The layer compute's own buffers, as it declares them.
    s_.compute = layer_compute_buffers(o_.kernels, cfg_, shape_, mdt_);
    for (size_t k = 0; k < s_.compute.size(); ++k) {
      const ComputeBuffer& c = s_.compute[k];
      const int id = declare(c.tag, Memory::device, c.bytes, c.only_when_recomputing ? PlanTerm::recompute : PlanTerm::fixed,
                             -1, !c.only_when_recomputing || recomputes);
      StepBuffer& b = s_.buffers[size_t(id)];
      b.bound = true;
      b.compute = int(k);
      if (c.span == ComputeSpan::step) reserve(id, first, last);
      if (c.span == ComputeSpan::backward) reserve(id, first_bwd, last);
      if (c.span == ComputeSpan::head) reserve(id, H, H);
      compute_buf_.push_back(id);
      if (c.role == ComputeBufferRole::loss) loss_ = id;
      if (c.role == ComputeBufferRole::rope_table) rope_ = id;
    }
    // Activation gradients: from the head on (one of them is the head's f32 input first, at bf16 storage).
    for (int k = 0; k < 2; ++k) dx_[k] = declare(fmt::format("activation grads {}", k), Memory::device, dxbytes);
    // The recompute cache: a backward that meets a dropped boundary rebuilds every boundary between the nearest
    // stored one below and it, and keeps them until their layers' backward. Declared for every depth (the memory
    // model's terms); present up to this plan's.
    for (int64_t k = 0; k < std::max<int64_t>(L_ - 1, 1); ++k) {
      cache_.push_back(declare(fmt::format("recompute cache {}", k), Memory::device, xbytes, PlanTerm::cache, k,
                               k < s_.recompute_depth));
      reserve(cache_.back(), first_bwd, last);
    }

    // Host memory the streams copy to or from, and the NVMe regions.
    x0_ = declare("x0", Memory::host, xbytes);
    if (shape_.act != DType::f32) x0_f32_ = declare("x0 f32", Memory::host, size_t(N_ * cfg_.hidden_size) * 4);
    host_x_.assign(size_t(L_), -1);
    nvme_x_.assign(size_t(L_), -1);
    for (int64_t i = 1; i < L_; ++i) {
      if (tier(i) == Tier::host)
        host_x_[size_t(i)] = declare(fmt::format("boundary {}", i), Memory::host, xbytes, PlanTerm::boundary, i);
      if (tier(i) == Tier::nvme)
        nvme_x_[size_t(i)] = declare(fmt::format("boundary {}", i), Memory::nvme, xbytes, PlanTerm::boundary, i);
    }
    if (plan().uses(Tier::nvme))
      for (int k = 0; k < 2; ++k) {
        nvme_wstage_.push_back(declare(fmt::format("nvme write staging {}", k), Memory::host, align_up(xbytes, kPageAlign)));
        nvme_rstage_.push_back(declare(fmt::format("nvme read staging {}", k), Memory::host, align_up(xbytes, kPageAlign)));
      }
    if (!so_.grads_in_place)
      for (int g = 0; g < o_.grad_buffers; ++g)
        gstage_.push_back(declare(fmt::format("grad staging {}", g), Memory::host, layer_g, PlanTerm::fixed, g));
    head_stage_ = declare("head grad staging", Memory::host, head_g_bytes_);
    rows_host_ = declare("embedding rows", Memory::host, dxbytes);  // at their bound, one per token
    if (rope_ >= 0) rope_host_ = declare("rope table", Memory::host, s_.buffers[size_t(rope_)].bytes);
  }

  // --- operations ----------------------------------------------------------------------------------
  // Every operation goes through here: on a stream it takes the waits issued on that stream before it.
  int add(StepOp op) {
    op.window = window_;
    if (is_stream(op.lane)) {
      auto& pending = pending_[int(op.lane)];
      op.deps.insert(op.deps.end(), pending.begin(), pending.end());
      pending.clear();
    }
    std::sort(op.deps.begin(), op.deps.end());
    op.deps.erase(std::unique(op.deps.begin(), op.deps.end()), op.deps.end());
    op.deps.erase(std::remove(op.deps.begin(), op.deps.end(), -1), op.deps.end());
    s_.ops.push_back(std::move(op));
    return int(s_.ops.size()) - 1;
  }
  static StepOp make(OpKind kind, Lane lane, std::string name, int64_t layer = -1) {
    StepOp op;
    op.kind = kind;
    op.lane = lane;
    op.name = std::move(name);
    op.layer = layer;
    return op;
  }
  // The next operation on `stream` waits for `op` (-1: nothing).
  void wait(Lane stream, int op) {
    if (op >= 0) pending_[int(stream)].push_back(op);
  }
  void begin_window(int w) { window_ = w; }

  // --- the previous step's optimizer update, pipelined into this forward --------------------------------
  void start_update() {
    if (!so_.update) return;
    auto submit = [&](SlabKind kind, int64_t layer, std::string name, UpdateRows rows = UpdateRows::all) {
      StepOp op = make(OpKind::update, Lane::optimizer, std::move(name), kind == SlabKind::layer ? layer : -1);
      op.slab = kind;
      op.rows = rows;
      return add(std::move(op));
    };
    // The lookup waits for the embedding's update: split, for the rows it reads only; the rest of the table
    // follows the layers' updates (which the forward's uploads wait for), before the head's.
    const bool split = so_.split_embedding_update;
    update_embed_ = split ? submit(SlabKind::embedding, 0, "update embedding (batch rows)", UpdateRows::batch)
                          : submit(SlabKind::embedding, 0, "update embedding");
    update_embed_rest_ = update_embed_;
    update_layer_.assign(size_t(L_), -1);
    for (int64_t l = 0; l < L_; ++l) update_layer_[size_t(l)] = submit(SlabKind::layer, l, fmt::format("update L{}", l));
    if (split) update_embed_rest_ = submit(SlabKind::embedding, 0, "update embedding (other rows)", UpdateRows::others);
    update_head_ = submit(SlabKind::head, 0, "update head");
  }
  // An upload of a slab waits (its first time) until that slab's update has been written.
  int update_gate(int64_t layer) {
    if (!so_.update || gated_[size_t(layer)]) return -1;
    gated_[size_t(layer)] = true;
    return update_layer_[size_t(layer)];
  }

  void upload_tokens() {
    StepOp op = make(OpKind::upload_tokens, kH2D, "h2d tokens");
    op.out = tokens_;
    op.bytes = size_t(N_) * 4 * (so_.doc_ids ? 3 : 2);
    if (s_.tokens.groups) op.bytes += size_t(2 * N_ + 1) * 4;  // the token groups, at their bound (P = N)
    if (rope_ >= 0) {  // the CUDA block's RoPE table goes with them, once per step
      op.aux = rope_;
      op.in = rope_host_;
    }
    tokens_ready_ = add(std::move(op));
  }

  // --- resources -----------------------------------------------------------------------------------
  // Layer l's weights in a weight buffer: where they already are (WeightBuffers' rule), else uploaded into the
  // least recently used buffer once its previous user is done.
  int acquire_weights(int64_t l) {
    const WeightBuffers::Slot slot = wslots_.acquire(l);
    const int b = slot.buffer;
    if (!slot.upload) return b;
    wait(kH2D, wfree_[size_t(b)]);
    StepOp op = make(OpKind::upload_weights, kH2D, fmt::format("h2d W{}", l), l);
    op.slot = b;
    op.out = wbuf_[size_t(b)];
    op.bytes = SlabLayout::make_layer(cfg_, l, mdt_).bytes();
    op.deps.push_back(update_gate(l));
    wready_[size_t(b)] = add(std::move(op));
    return b;
  }

  // A ring slot for `writer` to fill, once its previous readers and writers are done.
  int take_ring(Lane writer) {
    const int n = int(ring_.size());
    int tries = 0;
    while (ring_reserved_[size_t(next_ring_)]) {
      next_ring_ = (next_ring_ + 1) % n;
      LT_CHECK(++tries < n, "plan '{}': its transfer windows hold all {} boundary ring slots at once", plan().name, n);
    }
    const int r = next_ring_;
    next_ring_ = (next_ring_ + 1) % n;
    wait(writer, ring_use_[size_t(r)].compute);
    wait(writer, ring_use_[size_t(r)].copy);
    ring_use_[size_t(r)] = SlotUse{};
    return r;
  }

  // Compute on layer weights: waits for them and the inputs, records the buffer's and the inputs' last user.
  int launch_on(int b, const std::vector<const Boundary*>& inputs, StepOp op) {
    wait(kCompute, wready_[size_t(b)]);
    for (const Boundary* in : inputs) wait(kCompute, in->ready);
    op.weights = wbuf_[size_t(b)];
    op.slot = b;
    const int done = add(std::move(op));
    wfree_[size_t(b)] = done;
    for (const Boundary* in : inputs)
      if (in->ring >= 0) ring_use_[size_t(in->ring)].compute = done;
    return done;
  }

  // --- forward -------------------------------------------------------------------------------------
  Boundary upload_x0(int buf, int ring) {
    StepOp op = make(OpKind::upload_boundary, kH2D, "h2d x0", 0);
    op.in = x0_;
    op.out = buf;
    op.bytes = s_.boundary_bytes;
    return Boundary{buf, add(std::move(op)), ring};
  }

  void forward() {
    // The issuing thread looks up the embedding (after the embedding's update), then issues the rest.
    StepOp embed = make(OpKind::embed, Lane::issue, "embedding");
    embed.out = x0_;
    embed.aux = x0_f32_;
    embed.deps.push_back(update_embed_);
    const int e = add(std::move(embed));
    for (Lane k : {kCompute, kH2D, kD2H}) wait(k, e);
    wait(kCompute, tokens_ready_);
    Boundary in = tier(0) == Tier::device ? upload_x0(xdev_[0], -1) : [&] {
      const int r = take_ring(kH2D);
      return upload_x0(ring_[size_t(r)], r);
    }();
    for (int64_t l = 0; l < L_; ++l) {
      if (l > 0) begin_window(forward_window(l));
      Boundary out;
      const Tier t = tier(l + 1);
      if (l + 1 == L_ || t == Tier::device) {
        out.buf = xdev_[size_t(l + 1)];
      } else {
        // The input's slot is not the output's: this layer reads it (round robin alone guarantees that only
        // while no slot is held for windowed copies).
        const bool held = in.ring >= 0 && ring_reserved_[size_t(in.ring)];
        if (in.ring >= 0) ring_reserved_[size_t(in.ring)] = true;
        out.ring = take_ring(kCompute);
        if (in.ring >= 0) ring_reserved_[size_t(in.ring)] = held;
        out.buf = ring_[size_t(out.ring)];
      }
      const int b = acquire_weights(l);
      StepOp op = make(OpKind::forward, kCompute, fmt::format("fwd L{}", l), l);
      op.in = in.buf;
      op.out = out.buf;
      op.internals = plan().keep_internals[size_t(l)] ? internals_[size_t(l)] : -1;
      const int done = launch_on(b, {&in}, std::move(op));
      if (out.ring >= 0) ring_use_[size_t(out.ring)].compute = done;
      if (l + 1 < L_ && t == Tier::nvme) offload_to_nvme(l + 1, out, done);
      if (l + 1 < L_ && t == Tier::host) {
        if (has_parts(plan().offload_parts, l + 1)) {  // its parts go out as their windows open
          produced_[size_t(l + 1)] = done;
          offload_ring_[size_t(l + 1)] = out.ring;
          ring_reserved_[size_t(out.ring)] = true;
        } else {
          wait(kD2H, done);
          StepOp d = make(OpKind::download_boundary, kD2H, fmt::format("d2h x{}", l + 1), l + 1);
          d.in = out.buf;
          d.out = host_x_[size_t(l + 1)];
          d.bytes = s_.boundary_bytes;
          offloaded_[size_t(l + 1)] = add(std::move(d));
          ring_use_[size_t(out.ring)].copy = offloaded_[size_t(l + 1)];
        }
      }
      if (l + 1 < L_) issue_offloads(forward_window(l + 1), done);
      in = out;
      in.ready = -1;
    }
  }

  // --- transfer windows ----------------------------------------------------------------------------
  static bool has_parts(const std::vector<std::vector<TransferPart>>& parts, int64_t i) {
    return size_t(i) < parts.size() && !parts[size_t(i)].empty();
  }
  // Part k of boundary i's copy: bytes [first, second) of its N x C, whole elements.
  std::pair<size_t, size_t> part_range(const std::vector<TransferPart>& parts, int k) const {
    const size_t n = size_t(N_ * cfg_.hidden_size), xe = s_.boundary_bytes / n;
    double before = 0;
    for (int j = 0; j < k; ++j) before += parts[size_t(j)].fraction;
    const size_t a = size_t(std::llround(before * double(n)));
    const size_t b = k + 1 == int(parts.size()) ? n : size_t(std::llround((before + parts[size_t(k)].fraction) * double(n)));
    return {std::min(a, n) * xe, std::min(std::max(a, b), n) * xe};
  }
  // A boundary copy part's operation: its range and name.
  StepOp part_op(OpKind kind, Lane lane, const char* dir, int64_t i, const std::vector<TransferPart>& parts, int k) {
    StepOp op = make(kind, lane, fmt::format("{} x{} part {}/{}", dir, i, k + 1, parts.size()), i);
    const auto [a, b] = part_range(parts, k);
    op.offset = a;
    op.bytes = b - a;
    op.part = k;
    op.parts = int(parts.size());
    op.fraction = parts[size_t(k)].fraction;
    return op;
  }

  // Offload parts placed in `window`, issued once the compute ending the window before (`opened_by`) is done:
  // device to host, into the boundary's host copy. The last part frees the ring slot.
  void issue_offloads(int window, int opened_by) {
    auto it = offload_at_.find(window);
    if (it == offload_at_.end()) return;
    for (auto [i, k] : it->second) {
      const auto& parts = plan().offload_parts[size_t(i)];
      const int r = offload_ring_[size_t(i)];
      wait(kD2H, opened_by);
      wait(kD2H, produced_[size_t(i)]);
      StepOp op = part_op(OpKind::download_boundary, kD2H, "d2h", i, parts, k);
      op.in = ring_[size_t(r)];
      op.out = host_x_[size_t(i)];
      const int e = add(std::move(op));
      ring_use_[size_t(r)].copy = e;
      if (k + 1 == int(parts.size())) {
        offloaded_[size_t(i)] = e;
        ring_reserved_[size_t(r)] = false;
      }
    }
  }

  // Reload parts placed in the window before `window`, issued as it begins: host to device into a ring slot taken
  // by the first part and held until the boundary's backward reads it.
  void issue_reloads(int window) {
    auto it = reload_at_.find(window);
    if (it == reload_at_.end()) return;
    for (auto [i, k] : it->second) {
      if (i < lowest_) continue;  // below the backward's last layer: its own backward never reads it
      const auto& parts = plan().reload_parts[size_t(i)];
      Prefetch& f = prefetch_[size_t(i)];
      if (f.ring < 0) {
        f.ring = take_ring(kH2D);
        ring_reserved_[size_t(f.ring)] = true;
      }
      if (i > 0) wait(kH2D, offloaded_[size_t(i)]);  // the forward's d2h must have landed
      StepOp op = part_op(OpKind::upload_boundary, kH2D, "h2d", i, parts, k);
      op.in = i == 0 ? x0_ : host_x_[size_t(i)];
      op.out = ring_[size_t(f.ring)];
      f.last = add(std::move(op));
      ring_use_[size_t(f.ring)].copy = f.last;
    }
  }

  // --- NVMe tier -----------------------------------------------------------------------------------
  // Forward: d2h into one of two host staging slots (once the slot's previous write is done), then the NVMe lane
  // writes it to the boundary's region.
  void offload_to_nvme(int64_t i, const Boundary& out, int produced) {
    const int k = next_nvme_w_;
    next_nvme_w_ = (next_nvme_w_ + 1) % int(nvme_wstage_.size());
    wait(kD2H, produced);
    wait(kD2H, nvme_wslot_[size_t(k)]);
    StepOp d = make(OpKind::download_boundary, kD2H, fmt::format("d2h x{} (nvme)", i), i);
    d.in = out.buf;
    d.out = nvme_wstage_[size_t(k)];
    d.slot = k;
    d.bytes = s_.boundary_bytes;
    const int copy = add(std::move(d));
    ring_use_[size_t(out.ring)].copy = copy;
    StepOp w = make(OpKind::nvme_write, Lane::nvme, fmt::format("write x{}", i), i);
    w.in = nvme_wstage_[size_t(k)];
    w.out = nvme_x_[size_t(i)];
    w.slot = k;
    w.bytes = s_.buffers[size_t(nvme_x_[size_t(i)])].bytes;
    w.deps.push_back(copy);
    nvme_wslot_[size_t(k)] = add(std::move(w));
  }

  // Backward: the NVMe lane reads the region into one of two read staging slots (once the slot's previous copy
  // to the device is done: well ahead of use); the h2d stream copies it into a ring slot once read.
  Boundary fetch_from_nvme(int64_t i) {
    const int k = next_nvme_r_;
    next_nvme_r_ = (next_nvme_r_ + 1) % int(nvme_rstage_.size());
    StepOp rd = make(OpKind::nvme_read, Lane::nvme, fmt::format("read x{}", i), i);
    rd.in = nvme_x_[size_t(i)];
    rd.out = nvme_rstage_[size_t(k)];
    rd.slot = k;
    rd.bytes = s_.buffers[size_t(nvme_x_[size_t(i)])].bytes;
    rd.deps.push_back(nvme_rslot_[size_t(k)]);
    const int read = add(std::move(rd));
    const int r = take_ring(kH2D);
    wait(kH2D, read);
    StepOp up = make(OpKind::upload_boundary, kH2D, fmt::format("h2d x{} (nvme)", i), i);
    up.in = nvme_rstage_[size_t(k)];
    up.out = ring_[size_t(r)];
    up.slot = k;
    up.bytes = s_.boundary_bytes;
    const int copy = add(std::move(up));
    nvme_rslot_[size_t(k)] = copy;
    ring_use_[size_t(r)].copy = copy;
    return Boundary{ring_[size_t(r)], copy, r};
  }

  // --- head ----------------------------------------------------------------------------------------
  void head() {
    begin_window(head_window(L_));
    int ready = -1;  // carried: still in place from the previous micro-batch
    if (!so_.head_carried) {
      StepOp up = make(OpKind::upload_head, kH2D, "h2d head");
      up.out = head_w_;
      up.bytes = head_w_bytes_;
      up.deps.push_back(update_head_);
      if (cfg_.tie_word_embeddings) up.deps.push_back(update_embed_rest_);  // lm_head is the table
      ready = add(std::move(up));
    }
    wait(kCompute, ready);
    StepOp h = make(OpKind::head, kCompute, "head fwd+bwd");
    h.in = xdev_[size_t(L_)];
    h.out = dx_[0];
    h.aux = dx_[1];  // the input widened to f32 (bf16 storage): free until the first backward
    h.weights = head_w_;
    h.grads = head_g_;
    const int done = add(std::move(h));
    wait(kD2H, done);
    if (loss_ >= 0) {
      StepOp d = make(OpKind::download_loss, kD2H, "d2h loss");
      d.in = loss_;
      d.bytes = sizeof(double);
      add(std::move(d));
    }
    if (head_g_bytes_ == 0) return;  // a frozen head (model/finetune.h): no gradient to bring back
    StepOp d = make(OpKind::download_head_grads, kD2H, "d2h head grads");
    d.in = head_g_;
    d.out = head_stage_;
    d.bytes = head_g_bytes_;
    const int down = add(std::move(d));
    StepOp acc = make(OpKind::accumulate_head, Lane::host, "accumulate head grads");
    acc.in = head_stage_;
    acc.bytes = head_g_bytes_;
    acc.deps.push_back(down);
    if (cfg_.tie_word_embeddings) acc.deps.push_back(update_embed_rest_);  // writes the table's gradient it read
    add(std::move(acc));
  }

  // --- backward ------------------------------------------------------------------------------------
  // Boundary i on the device for the backward: kept, fetched from the host or NVMe, rebuilt from the token ids, or
  // recomputed from the nearest stored boundary below (filling the recompute cache). `own`: for layer i's own
  // backward, which takes the reload parts issued ahead in their windows; a recompute segment's source is fetched
  // whole, separately.
  Boundary get_boundary(int64_t i, bool own = true) {
    if (auto it = cached_.find(i); it != cached_.end()) return Boundary{it->second, -1, -1};
    const Tier t = tier(i);
    if (t == Tier::device) return Boundary{xdev_[size_t(i)], -1, -1};
    if (own && prefetch_[size_t(i)].ring >= 0) {
      const Prefetch f = prefetch_[size_t(i)];
      prefetch_[size_t(i)] = Prefetch{};
      ring_reserved_[size_t(f.ring)] = false;  // its reader (this layer's backward) is next to use it
      return Boundary{ring_[size_t(f.ring)], f.last, f.ring};
    }
    if (i == 0) {  // host or dropped: the embedding output is still on the host
      const int r = take_ring(kH2D);
      return upload_x0(ring_[size_t(r)], r);
    }
    if (t == Tier::host) {
      const int r = take_ring(kH2D);
      wait(kH2D, offloaded_[size_t(i)]);  // the forward's d2h must have landed in host memory
      StepOp op = make(OpKind::upload_boundary, kH2D, fmt::format("h2d x{}", i), i);
      op.in = host_x_[size_t(i)];
      op.out = ring_[size_t(r)];
      op.bytes = s_.boundary_bytes;
      const int ready = add(std::move(op));
      ring_use_[size_t(r)].copy = ready;
      return Boundary{ring_[size_t(r)], ready, r};
    }
    if (t == Tier::nvme) return fetch_from_nvme(i);
    recompute_segment(i);
    return Boundary{cached_.at(i), -1, -1};
  }

  void recompute_segment(int64_t i) {
    const int64_t j = plan().source_below(i);
    cached_.clear();  // earlier segments are consumed: the compute stream runs in order
    Boundary in = get_boundary(j, /*own=*/false);
    for (int64_t m = j; m < i; ++m) {
      const int out = cache_[size_t(m - j)];
      const int b = acquire_weights(m);
      // The output alone: a kept layer's internals stay as its forward stored them.
      StepOp op = make(OpKind::recompute, kCompute, fmt::format("recompute L{}", m), m);
      op.in = in.buf;
      op.out = out;
      launch_on(b, {&in}, std::move(op));
      cached_[m + 1] = out;
      in = Boundary{out, -1, -1};
    }
  }

  // Down to lowest_ (model/finetune.h: below a frozen run's lowest trained layer, with a frozen embedding, nothing
  // wants a gradient).
  void backward() {
    wslots_.begin_backward();
    int cur = 0;  // dx[cur] holds the gradient of the current layer's output
    for (int64_t l = L_ - 1; l >= lowest_; --l) {
      begin_window(backward_window(L_, l));
      issue_reloads(backward_window(L_, l));
      const Boundary xin = get_boundary(l);
      const int kept = plan().keep_internals[size_t(l)] ? internals_[size_t(l)] : -1;
      if (kept < 0) {  // the attention half again now, the MLP chunk by chunk in the MLP half
        const int b = acquire_weights(l);
        StepOp op = make(OpKind::recompute_internals, kCompute, fmt::format("recompute internals L{}", l), l);
        op.in = xin.buf;
        launch_on(b, {&xin}, std::move(op));
      }
      const int b = acquire_weights(l);
      const int g = next_g_;
      next_g_ = (next_g_ + 1) % o_.grad_buffers;
      wait(kCompute, gfree_[size_t(g)]);
      // In two launches: the MLP half's gradients (the slab's tail) go down while the attention half runs, so
      // that only the attention half's follow the last layer's compute.
      StepOp mlp = make(OpKind::backward_mlp, kCompute, fmt::format("bwd L{} mlp", l), l);
      mlp.in = dx_[cur];
      mlp.grads = gbuf_[size_t(g)];
      mlp.internals = kept;
      mlp.slot = g;
      const int mlp_done = launch_on(b, {&xin}, std::move(mlp));
      StepOp att = make(OpKind::backward_attention, kCompute, fmt::format("bwd L{} attention", l), l);
      att.in = xin.buf;
      att.out = dx_[1 - cur];
      att.grads = gbuf_[size_t(g)];
      att.internals = kept;
      const int done = launch_on(b, {&xin}, std::move(att));
      cur = 1 - cur;
      download_grads(l, g, mlp_done, done);
    }
    // The embedding's gradient (unless the table is frozen): the activation gradient of boundary 0 summed per
    // token id into the free gradient buffer (dx_[1 - cur]: its last reader, layer lowest_'s MLP half, ran on this
    // stream before), those rows to the host, where the table is, and added there.
    if (!embedding_trained(cfg_)) return;
    StepOp r = make(OpKind::embedding_rows, kCompute, "embedding rows", 0);
    r.in = dx_[cur];
    r.out = dx_[1 - cur];
    r.aux = tokens_;
    r.bytes = s_.buffers[size_t(rows_host_)].bytes;  // reads dx0 [N, C] f32
    const int rows = add(std::move(r));
    wait(kD2H, rows);
    StepOp d = make(OpKind::download_embedding_rows, kD2H, "d2h embedding rows", 0);
    d.in = dx_[1 - cur];
    d.out = rows_host_;
    d.bytes = s_.buffers[size_t(rows_host_)].bytes;  // the bound: every token's id distinct
    const int down = add(std::move(d));
    StepOp e = make(OpKind::embedding_backward, Lane::host, "embedding backward", 0);
    e.in = rows_host_;
    e.bytes = s_.buffers[size_t(rows_host_)].bytes;
    e.deps.push_back(down);
    e.deps.push_back(update_embed_rest_);  // the table's gradient, which the update reads
    add(std::move(e));
  }

  // Layer l's gradients out of gradient buffer g: the MLP half's once it is done (while the attention half runs),
  // then the rest, into host staging slot g once the host lane has emptied it — or, in place, straight into the
  // host gradients — then the host lane adds them (or sums their squares).
  void download_grads(int64_t l, int g, int mlp_done, int done) {
    const SlabLayout gl = SlabLayout::trained(cfg_, SlabKind::layer, l);
    if (gl.bytes() == 0) return;  // a frozen layer (model/finetune.h): no gradient traffic, nothing to add
    const size_t split = gl.mlp_offset();  // the trained layout's halves: either may be empty
    const int dst = so_.grads_in_place ? -1 : gstage_[size_t(g)];
    auto part = [&](const char* half, size_t offset, size_t bytes) {
      StepOp op = make(OpKind::download_grads, kD2H, fmt::format("d2h dW{} {}", l, half), l);
      op.in = gbuf_[size_t(g)];
      op.out = dst;
      op.slot = g;
      op.offset = offset;
      op.bytes = bytes;
      return op;
    };
    wait(kD2H, mlp_done);
    if (dst >= 0) wait(kD2H, slot_release_[size_t(g)]);
    int last = -1;
    if (split < gl.bytes()) last = add(part("mlp", split, gl.bytes() - split));
    wait(kD2H, done);
    if (split > 0) last = add(part("attention", 0, split));
    gfree_[size_t(g)] = last;
    StepOp acc = make(OpKind::accumulate_grads, Lane::host,
                      fmt::format("{} dW{}", so_.grads_in_place ? "norm" : "accumulate", l), l);
    acc.in = dst;
    acc.slot = g;
    acc.bytes = gl.bytes();
    acc.deps.push_back(gfree_[size_t(g)]);
    slot_release_[size_t(g)] = add(std::move(acc));
  }

  void finish() {
    s_.weights_after = wslots_.layers();
    finish_schedule(s_);
  }

 public:
  // Set-up that needs the plan's windows and the buffers' ids.
  void prepare() {
    wready_.assign(size_t(o_.weight_buffers), -1);
    wfree_.assign(size_t(o_.weight_buffers), -1);
    gfree_.assign(size_t(o_.grad_buffers), -1);
    slot_release_.assign(size_t(o_.grad_buffers), -1);
    ring_use_.assign(size_t(o_.boundary_ring), SlotUse{});
    ring_reserved_.assign(size_t(o_.boundary_ring), false);
    offloaded_.assign(size_t(L_ + 1), -1);
    produced_.assign(size_t(L_ + 1), -1);
    offload_ring_.assign(size_t(L_ + 1), -1);
    prefetch_.assign(size_t(L_ + 1), Prefetch{});
    nvme_wslot_.assign(2, -1);
    nvme_rslot_.assign(2, -1);
    gated_.assign(size_t(L_), false);
    if (!so_.carried.empty()) wslots_.carry(so_.carried);
    for (int64_t i = 0; i < int64_t(plan().offload_parts.size()); ++i)
      for (int k = 0; k < int(plan().offload_parts[size_t(i)].size()); ++k)
        offload_at_[plan().offload_parts[size_t(i)][size_t(k)].window].push_back({i, k});
    // A reload part placed in window w is issued when window w + 1 begins (it runs during w, as prefetch).
    for (int64_t i = 0; i < int64_t(plan().reload_parts.size()); ++i)
      for (int k = 0; k < int(plan().reload_parts[size_t(i)].size()); ++k)
        reload_at_[plan().reload_parts[size_t(i)][size_t(k)].window + 1].push_back({i, k});
  }

 private:
  const ModelConfig& cfg_;
  const int64_t L_, N_;
  const ExecOptions& o_;
  const StepScheduleOptions& so_;
  StepSchedule s_;
  BlockShape shape_{};
  DType mdt_ = DType::f32;
  size_t head_w_bytes_ = 0, head_g_bytes_ = 0;
  int64_t lowest_ = 0;  // the backward's last layer (lowest_backward_layer)
  int window_ = 0;
  std::vector<int> pending_[kNumStreams];

  // Buffers (indices into s_.buffers).
  std::vector<int> wbuf_, gbuf_, ring_, xdev_, internals_, cache_, compute_buf_, host_x_, nvme_x_;
  std::vector<int> gstage_, nvme_wstage_, nvme_rstage_;
  int head_w_ = -1, head_g_ = -1, tokens_ = -1, loss_ = -1, rope_ = -1, rope_host_ = -1;
  int dx_[2] = {-1, -1};
  int x0_ = -1, x0_f32_ = -1, head_stage_ = -1, rows_host_ = -1;

  // Resources, as operation ids (-1: none yet).
  WeightBuffers wslots_;
  std::vector<int> wready_, wfree_;
  std::vector<int> gfree_, slot_release_;
  int next_g_ = 0;
  std::vector<SlotUse> ring_use_;
  std::vector<bool> ring_reserved_;  // a slot holding a boundary whose windowed copies are not all issued
  int next_ring_ = 0;
  std::vector<int> offloaded_, produced_, offload_ring_;
  std::vector<Prefetch> prefetch_;
  std::map<int, std::vector<std::pair<int64_t, int>>> offload_at_, reload_at_;  // window -> (boundary, part)
  std::vector<int> nvme_wslot_, nvme_rslot_;  // [slot] the write that last used it / the copy that last read it
  int next_nvme_w_ = 0, next_nvme_r_ = 0;
  std::map<int64_t, int> cached_;  // boundary -> its recompute cache buffer
  int tokens_ready_ = -1;
  int update_embed_ = -1, update_embed_rest_ = -1, update_head_ = -1;
  std::vector<int> update_layer_;
  std::vector<bool> gated_;
};

}  // namespace

namespace {

// WorkingSet::fence_waits as operation fences: when window w begins, the first operation on stream `writer` from
// then on waits for the last operation stream `on` was given before window `after` + 1.
void add_fences(StepSchedule& s) {
  const std::vector<std::vector<FenceWait>> waits = s.memory.fence_waits();
  std::vector<int> by_stream[kNumStreams];
  for (int id = 0; id < int(s.ops.size()); ++id)
    if (is_stream(s.ops[size_t(id)].lane)) by_stream[int(s.ops[size_t(id)].lane)].push_back(id);
  for (int w = 0; w < int(waits.size()); ++w)
    for (const FenceWait& f : waits[size_t(w)]) {
      int fence = -1, waiter = -1;
      for (int id : by_stream[int(f.on)])
        if (s.ops[size_t(id)].window <= f.after) fence = id;
      for (int id : by_stream[int(f.writer)])
        if (s.ops[size_t(id)].window >= w) {
          waiter = id;
          break;
        }
      if (fence < 0 || waiter < 0) continue;
      std::vector<int>& fences = s.ops[size_t(waiter)].fences;
      if (std::find(fences.begin(), fences.end(), fence) == fences.end()) fences.push_back(fence);
    }
}

}  // namespace

void finish_schedule(StepSchedule& s) {
  for (int id = 0; id < int(s.ops.size()); ++id) {
    StepOp& op = s.ops[size_t(id)];
    op.fences.clear();
    for (int d : op.deps)
      LT_CHECK(d >= 0 && d < id, "step schedule: '{}' waits for operation {}, which is not issued before it", op.name, d);
    LT_CHECK(id == 0 || op.window >= s.ops[size_t(id - 1)].window,
             "step schedule: '{}' is issued in {} after '{}' in {}: windows rise in issue order", op.name,
             window_name(op.window, s.L), s.ops[size_t(id - 1)].name, window_name(s.ops[size_t(id - 1)].window, s.L));
  }
  // Uses: every buffer an operation names; the bound buffers by every compute operation (within the span they
  // reserve: a compute buffer's lifetime is the span its compute declared).
  for (StepBuffer& x : s.buffers) {
    x.first_op = x.last_op = -1;
    x.streams = 0;
    x.first_lane = Lane::compute;
    x.device_index = -1;
  }
  for (int id = 0; id < int(s.ops.size()); ++id) {
    const StepOp& op = s.ops[size_t(id)];
    for (int b : {op.in, op.out, op.aux, op.weights, op.grads, op.internals}) {
      if (b < 0) continue;
      StepBuffer& x = s.buffers[size_t(b)];
      LT_CHECK(x.present, "step schedule: '{}' uses buffer '{}', which this plan does not have", op.name, x.tag);
      if (x.first_op < 0) {
        x.first_op = id;
        x.first_lane = op.lane;
      }
      x.last_op = id;
      if (is_stream(op.lane)) x.streams |= 1u << unsigned(stream_of(op.lane));
    }
  }
  for (StepBuffer& x : s.buffers) {
    if (x.bound) x.streams |= 1u << unsigned(StreamKind::compute);
    int first = x.reserve_first, last = x.reserve_last;
    if (x.first_op >= 0) {
      const int a = s.ops[size_t(x.first_op)].window, b = s.ops[size_t(x.last_op)].window;
      if (x.bound)
        LT_CHECK(a >= first && b <= last, "step schedule: '{}' is used outside the span its compute declared", x.tag);
      first = first < 0 ? a : std::min(first, a);
      last = std::max(last, b);
    }
    x.first_window = first;
    x.last_window = last;
    if (x.present && x.memory == Memory::device)
      LT_CHECK(first >= 0, "step schedule: device buffer '{}' is neither used nor reserved", x.tag);
  }
  s.memory = pack_working_set(s.buffers, s.num_windows());
  s.memory.recompute_depth = s.recompute_depth;
  for (const StepBuffer& b : s.buffers) {
    if (b.present && b.term == PlanTerm::boundary) {
      if (b.memory == Memory::host) s.memory.host_activation_bytes += b.bytes;
      if (b.memory == Memory::nvme) s.memory.nvme_bytes += b.bytes;
    } else if (b.present && b.memory == Memory::host) {
      s.memory.host_staging_bytes += b.bytes;
    }
  }
  for (int i = 0; i < int(s.memory.buffers.size()); ++i)
    s.buffers[size_t(s.memory.buffers[size_t(i)].source)].device_index = i;
  add_fences(s);
}

void move_operation(StepSchedule& s, int op, int before, int window) {
  const int n = int(s.ops.size());
  LT_CHECK(op >= 0 && op < n && before >= 0 && before <= n, "move_operation: operation {} before {} of {}", op, before, n);
  std::vector<int> order;  // the new order, as old indices
  for (int i = 0; i < n; ++i) {
    if (i == before) order.push_back(op);
    if (i != op) order.push_back(i);
  }
  if (before == n) order.push_back(op);
  std::vector<int> index(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) index[size_t(order[size_t(k)])] = k;
  std::vector<StepOp> ops;
  for (int old : order) {
    StepOp o = s.ops[size_t(old)];
    for (int& d : o.deps) d = index[size_t(d)];
    std::sort(o.deps.begin(), o.deps.end());
    ops.push_back(std::move(o));
  }
  ops[size_t(index[size_t(op)])].window = window;
  s.ops = std::move(ops);
  finish_schedule(s);
}

StepSchedule build_step_schedule(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o,
                                 const StepScheduleOptions& so) {
  LT_CHECK(B >= 1 && T >= 1, "batch {} x seq {}: both must be >= 1", B, T);
  plan.validate(cfg.num_layers);
  plan.validate_windows(cfg.num_layers, o.boundary_ring);
  LT_CHECK(o.weight_buffers >= 1 && o.grad_buffers >= 1 && o.boundary_ring >= 2,
           "executor needs at least 1 weight buffer, 1 gradient buffer and 2 ring slots");
  LT_CHECK(so.carried.empty() || int(so.carried.size()) == o.weight_buffers,
           "step schedule: {} carried layers for {} weight buffers", so.carried.size(), o.weight_buffers);
  Builder b(cfg, B, T, plan, o, so);
  b.prepare();
  return b.build();
}

}  // namespace lt
