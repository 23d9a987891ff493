// exec/executor.cpp — one step of a plan: its schedule (exec/step_schedule.h) issued as asynchronous device work
// and host jobs, ordered by the schedule's deps.
//
// The issuing thread runs ahead through the whole step, enqueuing copies and kernel launches on the device's
// streams and jobs on the host lanes; the streams overlap uploads, compute and downloads. Every device buffer is
// the schedule's, at its offset in one block allocated at step start.
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
#include "exec/step_schedule.h"
#include "io/nvme.h"
#include "model/block.h"
#include "ops/ops.h"
#include "ops/rope.h"

namespace lt {
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

// One step: its schedule (exec/step_schedule.h) issued operation by operation, and everything the issue needs;
// destroyed (after the device and the host lanes are idle) when the step ends or fails.
//
// How the schedule's deps become waits: a device operation waits for one on another stream by an event recorded
// after it, for one on a host lane by a host callback on its stream that waits for that job's completion; a host
// job waits (before its clock starts) for a device operation's completion, signalled by a host callback after it,
// and for another lane's job's. Completions live only in the callbacks and jobs that signal them: one that is
// dropped after a failure breaks its promise, so nothing waits forever.
struct StreamingExecutor::Step {
  StreamingExecutor& ex;
  Device& dev;
  LayerCompute& compute;  // what each launch runs (model/layer_compute.h), bound to this step's buffers
  HostWorker& host;
  HostWorker* opt_lane = nullptr;   // the previous step's update, slab by slab (its own thread, so a slow update
                                    // never holds up the backward's gradient accumulation on the host lane)
  HostWorker* nvme_lane = nullptr;  // NVMe writes and reads
  const PendingUpdate* update = nullptr;
  GradTarget target;
  const ModelConfig& cfg;
  ModelSlabs& grads;
  const ModelSlabs& params;
  const ModelSlabs& weights;
  const Batch& batch;
  const StepTokens tok;
  const StepSchedule& sched;
  const int64_t L, N, C;
  // The embedding backward's token groups (ops/embedding.h), uploaded with the tokens: the device sums dx0 into
  // P = groups.present.size() rows, the host adds them at the ids present. Empty for a frozen table.
  const TokenGroups groups;

  uint8_t* block = nullptr;                     // the packed working set (sched.memory.peak_bytes)
  std::vector<uint8_t*> ptr;                    // [buffer] its device or host address (null: NVMe, or absent)
  std::vector<uint64_t> nvme_offset;            // [buffer] an NVMe buffer's region in the store
  std::vector<int> nvme_regions;                // the buffers whose regions this step allocated
  std::vector<bool> needs_event, needs_signal;  // [op] another stream / a host lane waits for it
  std::vector<Event*> event;                    // [op] recorded after a device operation, when needed
  std::vector<std::shared_future<void>> done;   // [op] its completion, for host lanes (and device waits on them)
  std::deque<std::unique_ptr<Event>> events;
  double loss = 0;
  double* loss_dev = nullptr;  // where the head writes the loss: `loss` itself for the CPU compute, else device
                               // memory the d2h stream copies into `loss`
  // MoE models: the batch's load-balancing loss (model/moe_ffn.h). The forward layers add to it on the compute
  // stream, the head's launch finishes it there (after the last forward, before the first backward reads its
  // gradient). Host memory: the CPU block computes sparse layers (the CUDA block refuses them).
  std::optional<MoeAuxLoss> moe_aux;

  Step(StreamingExecutor& e, HostWorker& hw, ModelSlabs& g, const ModelSlabs& p, const ModelSlabs& w,
       const Batch& b, const StepSchedule& s)
      : ex(e), dev(e.device_), compute(*e.compute_), host(hw), cfg(e.cfg_), grads(g), params(p), weights(w),
        batch(b), tok(StepTokens::make(b)), sched(s), L(cfg.num_layers), N(b.N()), C(cfg.hidden_size),
        groups(s.tokens.groups ? group_tokens_by_id(b.input_ids.data(), N, cfg.vocab_size) : TokenGroups{}) {}

  ~Step() {
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
    for (int b : nvme_regions) ex.nvme_->free(nvme_offset[size_t(b)]);
  }

  Event* record(StreamKind k) {
    events.push_back(dev.create_event());
    dev.record(*events.back(), k);
    return events.back().get();
  }
  template <typename T = uint8_t>
  T* at(int buffer) const {
    return buffer < 0 ? nullptr : reinterpret_cast<T*>(ptr[size_t(buffer)]);
  }
  const SlabLayout& wl(int64_t l) const { return weights.layout(SlabKind::layer, l); }
  const SlabLayout& gl(int64_t l) const { return grads.layout(SlabKind::layer, l); }

  // --- set-up --------------------------------------------------------------------------------------
  // The step's device block: the previous step's when plan and shape are the same (same packing), else a new
  // one in place of it; host buffers from the executor's workspace; NVMe regions from the store.
  void allocate(const std::string& key) {
    const WorkingSet& ws = sched.memory;
    if (ex.block_ && ex.block_key_ == key) {
      block = static_cast<uint8_t*>(ex.block_);
    } else {
      ex.release_device_memory();
      const DeviceMemoryStats mem = dev.memory();
      if (ws.device_bytes() > mem.capacity - mem.in_use) {
        std::string parts;
        for (const auto& b : ws.buffers)
          parts += fmt::format("{}{} {:.1f} MiB", parts.empty() ? "" : ", ", b.tag, double(b.bytes) / 1048576.0);
        LT_FAIL("plan '{}' needs {:.1f} MiB of device memory for B={} T={} but {:.1f} MiB of {:.1f} MiB are free ({})",
                sched.plan.name, double(ws.device_bytes()) / 1048576.0, batch.B, batch.T,
                double(mem.capacity - mem.in_use) / 1048576.0, double(mem.capacity) / 1048576.0, parts);
      }
      block = static_cast<uint8_t*>(dev.alloc(ws.device_bytes(), "step working set"));
      ex.block_ = block;
      ex.block_key_ = key;
    }
    ptr.assign(sched.buffers.size(), nullptr);
    nvme_offset.assign(sched.buffers.size(), 0);
    for (size_t i = 0; i < sched.buffers.size(); ++i) {
      const StepBuffer& b = sched.buffers[i];
      if (!b.present) continue;
      if (b.memory == Memory::device) ptr[i] = block + ws.buffers[size_t(b.device_index)].offset;
      if (b.memory == Memory::host) ptr[i] = ex.host_ws_.get(b.tag, b.bytes);
      if (b.memory == Memory::nvme) {
        nvme_offset[i] = ex.nvme_->alloc(b.bytes, b.tag);
        nvme_regions.push_back(int(i));
      }
    }
    ComputeBinding binding;
    binding.shape = BlockShape::make(cfg, batch.B, batch.T, ex.options_.activations, ex.options_.mlp_chunk_tokens);
    binding.tok = TokenInfo{tokens(), batch.doc_ids.empty() ? nullptr : tokens() + sched.tokens.doc_ids()};
    binding.tok.dropout_key = batch.dropout_key;
    if (cfg.is_moe()) {
      moe_aux.emplace(cfg.num_experts, batch.attention_mask.empty() ? nullptr : batch.attention_mask.data(),
                      target.moe_aux_weight);
      binding.tok.moe_aux = &*moe_aux;
    }
    std::vector<void*> compute_ptrs(sched.compute.size(), nullptr);
    for (size_t i = 0; i < sched.buffers.size(); ++i)
      if (sched.buffers[i].compute >= 0) compute_ptrs[size_t(sched.buffers[i].compute)] = ptr[i];
    bind_compute_buffers(binding, sched.compute, compute_ptrs);
    compute.bind(binding);
    const int loss_buf = find_compute(ComputeBufferRole::loss);
    loss_dev = loss_buf >= 0 ? at<double>(loss_buf) : &loss;
    // Which completions other lanes wait for.
    const size_t n = sched.ops.size();
    needs_event.assign(n, false);
    needs_signal.assign(n, false);
    event.assign(n, nullptr);
    done.assign(n, {});
    for (const StepOp& op : sched.ops)
      for (int d : op.waits_for()) {
        const Lane from = sched.ops[size_t(d)].lane;
        if (!is_stream(from)) continue;
        if (is_stream(op.lane) && op.lane != from) needs_event[size_t(d)] = true;
        if (op.lane == Lane::issue) needs_event[size_t(d)] = true;
        if (!is_stream(op.lane) && op.lane != Lane::issue) needs_signal[size_t(d)] = true;
      }
  }
  int find_compute(ComputeBufferRole role) const {
    for (size_t i = 0; i < sched.buffers.size(); ++i) {
      const StepBuffer& b = sched.buffers[i];
      if (b.present && b.compute >= 0 && sched.compute[size_t(b.compute)].role == role) return int(i);
    }
    return -1;
  }
  int32_t* tokens() const { return at<int32_t>(sched.find("tokens")); }

  // --- issue ---------------------------------------------------------------------------------------
  void issue() {
    for (int id = 0; id < int(sched.ops.size()); ++id) {
      const StepOp& op = sched.ops[size_t(id)];
      if (is_stream(op.lane)) issue_device(id, op);
      else if (op.lane == Lane::issue) run_here(op);
      else submit_host(id, op);
    }
  }

  void issue_device(int id, const StepOp& op) {
    const StreamKind k = stream_of(op.lane);
    for (int d : op.waits_for()) {
      const StepOp& dep = sched.ops[size_t(d)];
      if (dep.lane == op.lane || dep.lane == Lane::issue) continue;  // in stream order / already done
      if (is_stream(dep.lane)) {
        dev.wait(k, *event[size_t(d)]);
      } else {
        std::shared_future<void> f = done[size_t(d)];
        dev.host_callback(k, [f] { f.get(); }, "wait " + dep.name);
      }
    }
    run_device(op);
    if (needs_event[size_t(id)]) event[size_t(id)] = record(k);
    if (needs_signal[size_t(id)]) {
      auto p = std::make_shared<std::promise<void>>();
      done[size_t(id)] = p->get_future().share();
      dev.host_callback(k, [p] { p->set_value(); }, op.name + " done");
    }
  }

  void submit_host(int id, const StepOp& op) {
    std::vector<std::shared_future<void>> after;
    for (int d : op.waits_for()) {
      const StepOp& dep = sched.ops[size_t(d)];
      if (dep.lane != op.lane && dep.lane != Lane::issue) after.push_back(done[size_t(d)]);
    }
    auto p = std::make_shared<std::promise<void>>();
    done[size_t(id)] = p->get_future().share();
    HostWorker* lane = op.lane == Lane::host ? &host : op.lane == Lane::optimizer ? opt_lane : nvme_lane;
    LT_CHECK(lane, "step: '{}' needs the {} lane, which this step does not have", op.name, lane_name(op.lane));
    lane->submit([this, &op, p] {
      try {
        run_host(op);
        p->set_value();
      } catch (...) {
        p->set_exception(std::current_exception());
        throw;
      }
    }, op.name, int(op.layer), op.bytes, std::move(after));
  }

  // --- the issuing thread's own work ---------------------------------------------------------------
  void run_here(const StepOp& op) {
    for (int d : op.waits_for()) {
      const StepOp& dep = sched.ops[size_t(d)];
      if (is_stream(dep.lane)) dev.synchronize(*event[size_t(d)]);
      else if (dep.lane != Lane::issue) done[size_t(d)].get();
    }
    LT_CHECK(op.kind == OpKind::embed, "step: '{}' cannot run on the issuing thread", op.name);
    // The embedding lookup runs on the host (the table stays there); only [N, C] moves. At bf16 storage it is
    // computed in f32 and rounded, as the in-memory path does.
    const DType act = ex.options_.activations;
    float* x0_f32 = op.aux >= 0 ? at<float>(op.aux) : at<float>(op.out);
    if (params.has(SlabKind::embedding, 0, "embed_tokens.weight")) {
      embedding_forward(x0_f32, batch.input_ids.data(),
                        params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>(), N, C,
                        cfg.vocab_size);
    } else {  // a frozen table (model/finetune.h) is in the streamed weights alone, in their dtype
      const TensorView t = weights.tensor(SlabKind::embedding, 0, "embed_tokens.weight");
      if (t.dtype == DType::f32) {
        embedding_forward(x0_f32, batch.input_ids.data(), t.ptr<float>(), N, C, cfg.vocab_size);
      } else {
        const bf16_t* table = t.ptr<bf16_t>();
        group_tokens_by_id(batch.input_ids.data(), N, cfg.vocab_size);  // checks every id, naming the first bad one
        parallel_for(N, [&](int64_t n) {
          convert_bf16_to_f32(x0_f32 + n * C, table + int64_t(batch.input_ids[size_t(n)]) * C, size_t(C));
        });
      }
    }
    if (op.aux >= 0) parallel_convert_from_f32(at(op.out), act, x0_f32, size_t(N * C));
  }

  // --- device operations ---------------------------------------------------------------------------
  BlockView view(const StepOp& op) const {
    BlockView w = BlockView::bind(wl(op.layer), at(op.weights));
    w.layer = op.layer;
    return w;
  }

  void run_device(const StepOp& op) {
    const StreamKind k = stream_of(op.lane);
    LayerCompute* c = &compute;
    const int layer = int(op.layer);
    switch (op.kind) {
      case OpKind::upload_tokens: upload_tokens(op); break;
      case OpKind::upload_weights:
        LT_CHECK(op.bytes == wl(op.layer).bytes(), "step: layer {}'s weights are {} bytes, its schedule moves {}",
                 op.layer, wl(op.layer).bytes(), op.bytes);
        dev.copy_h2d(at(op.out), weights.layer(op.layer), op.bytes, k, op.name, layer);
        break;
      case OpKind::upload_head: {
        const size_t head = weights.layout(SlabKind::head).bytes();
        dev.copy_h2d(at(op.out), weights.slab(SlabKind::head), head, k, op.name);
        if (cfg.tie_word_embeddings)
          dev.copy_h2d(at(op.out) + head, weights.slab(SlabKind::embedding),
                       weights.layout(SlabKind::embedding).bytes(), k, "h2d lm_head (tied)");
        break;
      }
      case OpKind::upload_boundary:
        dev.copy_h2d(at(op.out) + op.offset, at(op.in) + op.offset, op.bytes, k, op.name, layer);
        break;
      case OpKind::download_boundary:
      case OpKind::download_head_grads:
        dev.copy_d2h(at(op.out) + op.offset, at(op.in) + op.offset, op.bytes, k, op.name, layer);
        break;
      case OpKind::download_embedding_rows: {  // this batch's P rows of the schedule's bound N
        const size_t bytes = groups.present.size() * size_t(C) * 4;
        LT_CHECK(bytes <= op.bytes, "step: {} embedding rows are {} bytes, the schedule's bound {}",
                 groups.present.size(), bytes, op.bytes);
        dev.copy_d2h(at(op.out), at(op.in), bytes, k, op.name);
        break;
      }
      case OpKind::download_grads: {
        uint8_t* dst = op.out >= 0 ? at(op.out) : grads.layer(op.layer);
        dev.copy_d2h(dst + op.offset, at(op.in) + op.offset, op.bytes, k, op.name, layer);
        break;
      }
      case OpKind::download_loss: dev.copy_d2h(&loss, loss_dev, sizeof(double), k, op.name); break;
      case OpKind::forward: {
        uint8_t *x_out = at(op.out), *kept = at(op.internals);
        const uint8_t* x_in = at(op.in);
        const BlockView w = view(op);
        dev.launch(k, [=] { c->forward(x_out, kept, x_in, w); }, op.name, layer);
        break;
      }
      case OpKind::recompute: {
        uint8_t* x_out = at(op.out);
        const uint8_t* x_in = at(op.in);
        const BlockView w = view(op);
        dev.launch(k, [=] { c->recompute(x_out, x_in, w); }, op.name, layer);
        break;
      }
      case OpKind::recompute_internals: {
        const uint8_t* x_in = at(op.in);
        const BlockView w = view(op);
        dev.launch(k, [=] { c->recompute_internals(x_in, w); }, op.name, layer);
        break;
      }
      case OpKind::backward_mlp: {
        uint8_t *gb = at(op.grads), *kept = at(op.internals);
        const float* dx_out = at<float>(op.in);
        const SlabLayout* glp = &gl(op.layer);
        const BlockView w = view(op);
        dev.launch(k, [=] {
          c->zero(gb, glp->bytes());
          BlockGrads gr = BlockGrads::bind(*glp, gb);
          c->backward_mlp(gr, dx_out, kept, w);
        }, op.name, layer);
        break;
      }
      case OpKind::backward_attention: {
        uint8_t *gb = at(op.grads), *kept = at(op.internals);
        const uint8_t* x_in = at(op.in);
        float* dx_in = at<float>(op.out);
        const SlabLayout* glp = &gl(op.layer);
        const BlockView w = view(op);
        dev.launch(k, [=] {
          BlockGrads gr = BlockGrads::bind(*glp, gb);
          c->backward_attention(dx_in, gr, x_in, kept, w);
        }, op.name, layer);
        break;
      }
      case OpKind::head: {
        const HeadCall call = head_call(op);
        MoeAuxLoss* aux = moe_aux ? &*moe_aux : nullptr;
        dev.launch(k, [=] {
          if (aux) aux->finish();
          c->head(call);
        }, op.name);
        break;
      }
      case OpKind::embedding_rows: {
        float* rows = at<float>(op.out);
        const float* dx0 = at<float>(op.in);
        const int32_t* toks = at<int32_t>(op.aux);
        const int32_t *start = toks + sched.tokens.group_start(), *order = toks + sched.tokens.group_order();
        const int64_t P = int64_t(groups.present.size());
        dev.launch(k, [=] { c->embedding_rows(rows, dx0, start, order, P); }, op.name);
        break;
      }
      default: LT_FAIL("step: '{}' is not a device operation", op.name);
    }
  }

  void upload_tokens(const StepOp& op) {
    const StreamKind k = stream_of(op.lane);
    int32_t* toks = at<int32_t>(op.out);
    dev.copy_h2d(toks, tok.pos.data(), size_t(N) * 4, k, "h2d tokens");
    dev.copy_h2d(toks + sched.tokens.targets(), tok.targets.data(), size_t(N) * 4, k, "h2d targets");
    if (!batch.doc_ids.empty())
      dev.copy_h2d(toks + sched.tokens.doc_ids(), batch.doc_ids.data(), size_t(N) * 4, k, "h2d doc ids");
    if (sched.tokens.groups) {  // the embedding backward's: start [P + 1], order [N]
      dev.copy_h2d(toks + sched.tokens.group_start(), groups.start.data(), groups.start.size() * 4, k, "h2d token groups");
      dev.copy_h2d(toks + sched.tokens.group_order(), groups.order.data(), groups.order.size() * 4, k, "h2d token order");
    }
    if (op.aux < 0) return;
    // The GPU kernels read targets and positions unchecked: a bad one is an error here, not a wild read there.
    for (int64_t n = 0; n < N; ++n) {
      const int32_t t = tok.targets[size_t(n)], p = tok.pos[size_t(n)];
      LT_CHECK(t == kIgnoreIndex || (t >= 0 && t < cfg.vocab_size),
               "token {}: target {} is outside the vocabulary [0, {})", n, t, cfg.vocab_size);
      LT_CHECK(p >= 0 && p < batch.T, "token {}: position {} is outside the sequence [0, {})", n, p, batch.T);
    }
    // RoPE's cos/sin for every position of the sequence (ops' rope_table: the CPU op's angles), once per step,
    // for the rotated dims (Qwen3.5 / Qwen3.6: the first `rotary`): cos [T, R/2] at the table, sin at + T·D/2.
    const BlockShape s = BlockShape::make(cfg, batch.B, batch.T, ex.options_.activations);
    const int64_t half = s.T * (s.D / 2);
    float* table = at<float>(op.in);
    rope_table(table, table + half, s.T, s.rotary, s.rope);
    dev.copy_h2d(at(op.aux), table, size_t(2 * half) * sizeof(float), k, "h2d rope table");
  }

  // The fused head's call, on the head's weight and gradient buffers (bind_head_buffers' layout).
  HeadCall head_call(const StepOp& op) {
    const HeadBuffers hb = bind_head_buffers(cfg, weights.layout(SlabKind::head), weights.layout(SlabKind::embedding),
                                             grads.layout(SlabKind::head), grads.layout(SlabKind::embedding),
                                             at(op.weights), at(op.grads));
    HeadCall call;
    call.dx = at<float>(op.out);
    call.grads = at(op.grads);
    call.grads_bytes = hb.grads_bytes;
    call.dnorm_w = hb.dnorm_w;
    call.dlm_w = hb.dlm_w;
    call.x = at(op.in);
    call.x32 = at<float>(op.aux);
    call.targets = tokens() + sched.tokens.targets();
    call.norm_w = hb.norm_w;
    call.lm_w = hb.lm_w;
    call.grad_scale = float(1.0 / double(target.tokens_in_step > 0 ? target.tokens_in_step : tok.count));
    call.shape = HeadShape{N, C, cfg.vocab_size, float(cfg.rms_norm_eps)};
    call.loss = loss_dev;
    return call;
  }

  // --- host lanes ----------------------------------------------------------------------------------
  void run_host(const StepOp& op) {
    switch (op.kind) {
      case OpKind::update: {
        uint8_t* copy = update->compute_copy ? update->compute_copy->slab(op.slab, std::max<int64_t>(op.layer, 0)) : nullptr;
        if (op.rows == UpdateRows::all)
          update->optimizer->update(op.slab, std::max<int64_t>(op.layer, 0), update->args, copy);
        else  // the table's rows this batch looks up (its token groups' ids), or the others
          update->optimizer->update_embedding_rows(update->args, copy, groups.present.data(),
                                                   int64_t(groups.present.size()), op.rows == UpdateRows::others);
        break;
      }
      case OpKind::nvme_write: {
        NvmeStore& store = *ex.nvme_;
        store.wait(store.write(nvme_offset[size_t(op.out)], at(op.in), op.bytes));
        break;
      }
      case OpKind::nvme_read: {
        NvmeStore& store = *ex.nvme_;
        store.wait(store.read(nvme_offset[size_t(op.in)], at(op.out), op.bytes));
        break;
      }
      case OpKind::accumulate_head: accumulate_head(op); break;
      case OpKind::accumulate_grads: accumulate_layer(op); break;
      case OpKind::embedding_backward: embedding_grads(op); break;
      default: LT_FAIL("step: '{}' is not a host operation", op.name);
    }
  }

  void accumulate_head(const StepOp& op) {
    const SlabLayout& hl = grads.layout(SlabKind::head);
    const uint8_t* stage = at(op.in);
    if (target.reducer) {  // the tied part goes with the embedding's (backward's end)
      target.reducer->slab(SlabKind::head, 0, grads.slab(SlabKind::head), hl, stage, hl, target.mode);
      return;
    }
    const double p = accumulate_grad_slab(grads.slab(SlabKind::head), hl, stage, hl, target.mode);
    if (target.partials) target.partials->set(SlabKind::head, 0, p);
    if (cfg.tie_word_embeddings) {  // lm_head's part of the embedding gradient; its norm comes later
      const SlabLayout& el = grads.layout(SlabKind::embedding);
      accumulate_grad_slab(grads.slab(SlabKind::embedding), el, stage + hl.bytes(), el, target.mode);
    }
  }

  // Layer l's gradients: from its staging slot into the host gradients (or to the reducer); downloaded in place
  // (a step's first micro-batch), only their sum of squares. Nothing else touches them then: the only other
  // reader, the pending update of layer l, finished before W[l]'s forward upload.
  void accumulate_layer(const StepOp& op) {
    const int64_t l = op.layer;
    double p;
    if (op.in < 0) {
      p = grad_slab_sum_of_squares(grads.layer(l), gl(l));
    } else if (target.reducer) {
      target.reducer->slab(SlabKind::layer, l, grads.layer(l), gl(l), at(op.in), gl(l), target.mode);
      return;
    } else {
      p = accumulate_grad_slab(grads.layer(l), gl(l), at(op.in), gl(l), target.mode);
    }
    if (target.partials) target.partials->set(SlabKind::layer, l, p);
  }

  // The embedding rows (ops/embedding.h embedding_grad_rows, downloaded) added at their ids.
  void embedding_grads(const StepOp& op) {
    const float* rows = at<float>(op.in);
    const int64_t P = int64_t(groups.present.size());
    if (target.reducer) {
      const uint8_t* tied = cfg.tie_word_embeddings ? at(sched.find("head grad staging")) + grads.layout(SlabKind::head).bytes() : nullptr;
      target.reducer->embedding(grads.slab(SlabKind::embedding), grads.layout(SlabKind::embedding), tied, rows,
                                groups.present.data(), P, target.mode);
      return;
    }
    float* table = grads.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>();
    const int64_t n = cfg.vocab_size * C;
    // Overwrite mode and untied: the head did not write the table this step, so start from zero.
    if (target.mode == GradMode::overwrite && !cfg.tie_word_embeddings) std::memset(table, 0, size_t(n) * 4);
    embedding_add_rows(table, rows, groups.present.data(), P, C, 0, n);
    if (target.partials) target.partials->set(SlabKind::embedding, 0, grad_sum_of_squares(table, n));
  }
};

StreamingExecutor::StreamingExecutor(const ModelConfig& cfg, Device& device, ExecOptions options, NvmeStore* nvme)
    : cfg_(cfg), device_(device), options_(options), nvme_(nvme) {
  LT_CHECK(options_.weight_buffers >= 1 && options_.grad_buffers >= 1 && options_.boundary_ring >= 2,
           "executor needs at least 1 weight buffer, 1 gradient buffer and 2 ring slots");
  compute_ = options_.kernels == LayerKernels::cuda ? cuda::make_cuda_layer_compute(device_) : make_cpu_layer_compute();
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
  const DType want = options_.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  LT_CHECK(weights.matrix_dtype() == want, "the streamed weights are {} but the compute type needs {}",
           dtype_name(weights.matrix_dtype()), dtype_name(want));
  const bool pending = update && update->optimizer;
  const std::string key = fmt::format("{} B{} T{}", plan.to_json().dump(), batch.B, batch.T);
  // Micro-batches of one optimizer step start on the layers the previous one left in the weight buffers.
  const bool carry = !pending && weights_version != 0 && weights_version == carried_version_ &&
                     &weights == carried_weights_ && block_ && key == block_key_;
  StepScheduleOptions so;
  so.update = pending;
  so.grads_in_place = target.mode == GradMode::overwrite && !target.reducer;
  so.doc_ids = !batch.doc_ids.empty();
  so.split_embedding_update = pending && splits_embedding_update(cfg_, target.reducer != nullptr);
  if (carry) {
    so.carried = carried_;
    so.head_carried = carried_head_;
  }
  carried_.clear();  // valid again only once this step has finished
  carried_head_ = false;
  const StepSchedule sched = build_step_schedule(cfg_, batch.B, batch.T, plan, options_, so);
  if (target.partials && !cfg_.trains_all()) {  // a frozen slab has no gradient (model/finetune.h): 0 of the norm
    auto frozen = [&](SlabKind kind, int64_t layer) {  // the gradients' slabs are laid out by SlabLayout::trained
      if (grads.layout(kind, layer).entries().empty()) target.partials->set(kind, layer, 0.0);
    };
    frozen(SlabKind::embedding, 0);
    for (int64_t l = 0; l < cfg_.num_layers; ++l) frozen(SlabKind::layer, l);
    frozen(SlabKind::head, 0);
  }
  LT_CHECK(!plan.uses(Tier::nvme) || nvme_ != nullptr,
           "plan '{}' offloads to NVMe but no NVMe directory was given (--nvme-dir)", plan.name);

  TraceRecorder recorder;
  TeeSink tee(&recorder, trace);
  HostWorker host("host", &device_);
  host.set_sink(&tee);
  std::optional<HostWorker> opt_lane;
  if (pending) {
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
    Step st(*this, host, grads, params, weights, batch, sched);
    st.nvme_lane = nvme_lane ? &*nvme_lane : nullptr;
    st.opt_lane = opt_lane ? &*opt_lane : nullptr;
    st.update = pending ? update : nullptr;
    st.target = target;
    LT_CHECK(st.tok.count > 0, "the batch has no counted token: every label after the first position of each row is -100");
    device_.reset_peak();
    st.allocate(key);
    st.issue();
    try {
      device_.synchronize();
    } catch (...) {
      // A failed lane (an NVMe write or read, the optimizer) breaks the promises the streams and the other lanes
      // wait on, so their errors are then consequences ("broken promise"): the first lane error that is not one
      // is the cause, reported instead when there is one.
      std::exception_ptr cause;
      for (HostWorker* w : {&host, opt_lane ? &*opt_lane : nullptr, nvme_lane ? &*nvme_lane : nullptr}) {
        if (!w) continue;
        try {
          w->drain();
        } catch (const std::future_error&) {
        } catch (...) {
          if (!cause) cause = std::current_exception();
        }
      }
      if (cause) std::rethrow_exception(cause);
      throw;
    }
    host.drain();
    if (opt_lane) opt_lane->drain();
    if (nvme_lane) nvme_lane->drain();
    stats.loss_sum = st.loss;
    stats.tokens = st.tok.count;
    stats.moe_aux_loss = st.moe_aux ? st.moe_aux->value() : 0.0;
    stats.predicted_device_bytes = sched.memory.device_bytes();
    carried_ = sched.weights_after;
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
