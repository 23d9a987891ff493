#include "plan/measure.h"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>
#include <memory>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "cuda/layers.h"
#include "exec/backend.h"
#include "exec/host_worker.h"
#include "exec/trace.h"
#include "io/nvme.h"
#include "model/block.h"
#include "model/layout.h"
#include "model/weights.h"
#include "ops/embedding.h"
#include "ops/head.h"
#include "ops/rope.h"
#include "optim/adamw.h"
#include "plan/planner.h"

namespace lt {
namespace {

// The fastest repetition: on a shared machine the others are the same work plus interference (the executor
// benchmark reports its best step for the same reason).
double fastest(std::vector<double> v) {
  LT_CHECK(!v.empty(), "no measurement");
  return *std::min_element(v.begin(), v.end());
}

// Seconds of the last operation named `name` that the sink saw (device time, as the executor's trace).
double op_seconds(const TraceRecorder& rec, const std::string& name) {
  double s = -1;
  for (const OpRecord& op : rec.ops())
    if (op.name == name && op.waited_on.empty()) s = op.end - op.start;
  LT_CHECK(s >= 0, "profile: operation '{}' was not recorded", name);
  return s;
}

void fill_random(float* p, size_t n, Rng& rng, float scale) {
  for (size_t i = 0; i < n; ++i) p[i] = float(scale * rng.normal());
}

}  // namespace

ModelConfig profile_prototypes(const ModelConfig& cfg, std::vector<int64_t>* proto) {
  // One prototype per (token mixer, dense or sparse MLP) the model has; the prototypes' dense ones are its
  // mlp_only_layers, their mixers explicit layer_types unless every one is full attention (a uniform model).
  ModelConfig one = cfg;
  one.finetune = nullptr;  // the prototypes measure full training's layer costs (frozen weights only skip work)
  proto->assign(size_t(cfg.num_layers), 0);
  one.layer_types.clear();
  one.mlp_only_layers.clear();
  one.decoder_sparse_step = 1;
  std::vector<std::pair<LayerKind, bool>> kinds;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::pair<LayerKind, bool> k{cfg.layer_kind(l), cfg.sparse_layer(l)};
    const auto it = std::find(kinds.begin(), kinds.end(), k);
    (*proto)[size_t(l)] = int64_t(it - kinds.begin());
    if (it != kinds.end()) continue;
    if (!k.second && cfg.is_moe()) one.mlp_only_layers.push_back(int64_t(kinds.size()));
    kinds.push_back(k);
    one.layer_types.push_back(k.first);
  }
  one.num_layers = int64_t(one.layer_types.size());
  if (std::all_of(kinds.begin(), kinds.end(), [](const auto& k) { return k.first == LayerKind::full_attention; }))
    one.layer_types.clear();  // uniform models keep their implicit full attention
  return one;
}

namespace {

// One layer of each kind (the executor streams every layer through the same buffers, sized for the largest; layers of
// one kind share shapes — a hybrid model has Gated DeltaNet and attention layers), plus the embedding and head, from
// a copy of the config with those layers.
struct Prototypes {
  std::vector<int64_t> proto;  // [L] layer l is measured with `one`'s layer proto[l] (before `one`: it fills this)
  ModelConfig one;
  ModelSlabs params, copy;     // f32 masters and the compute copy of `one`

  Prototypes(const ModelConfig& cfg, DType matrices, uint64_t seed)
      : one(profile_prototypes(cfg, &proto)), params(one, DType::f32), copy(one, matrices) {
    init_random(params, seed);
    make_compute_copy(copy, params);
  }
};

// The device side of a profile: the device, its layer compute bound to its buffers as the executor binds them (the
// compute's own list, model/layer_compute.h), one layer's weights and gradients (the largest layer's), boundaries,
// activation gradients and tokens with random contents; the device's operation records give the times.
class Rig {
 public:
  Rig(const ModelConfig& cfg, int64_t B, int64_t T, const MeasureOptions& o)
      // The MLP in the chunks the planner chooses for this budget, as the executor then runs it (one chunk's scratch
      // at the paper's 7B batch would be 62 GiB: more than an 80 GB GPU holds beside the kept layer).
      : cfg_(cfg), s(BlockShape::make(cfg, B, T, o.activations, choose_mlp_chunk(cfg, B, T, o.device_memory))),
        N(B * T),
        mdt(o.compute == ComputeType::bf16 ? DType::bf16 : DType::f32), scope_(o.backend.kernels()),
        dev(o.backend.open(o.device_memory, o.link, o.gpu)), kernels(o.backend.layer_kernels(s.act)) {
    compute = kernels == LayerKernels::cuda ? cuda::make_cuda_layer_compute(*dev) : make_cpu_layer_compute();
    dev->set_sink(&rec);
    size_t stored_bytes = 0;
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      weight_bytes = std::max(weight_bytes, SlabLayout::make_layer(cfg, l, mdt).bytes());
      grad_bytes = std::max(grad_bytes, SlabLayout::make_layer(cfg, l, DType::f32).bytes());
      stored_bytes = std::max(stored_bytes, block_stored_bytes(s.for_layer(cfg, l)));
    }
    const size_t xbytes = s.boundary_bytes(), dxbytes = size_t(N * cfg.hidden_size) * 4;
    w = alloc<uint8_t>(weight_bytes, "weights");
    g = alloc<uint8_t>(grad_bytes, "grads");
    x_in = alloc<uint8_t>(xbytes, "x_in");
    x_out = alloc<uint8_t>(xbytes, "x_out");
    dx_in = alloc<float>(dxbytes, "dx_in");
    dx_out = alloc<float>(dxbytes, "dx_out");
    // A kept layer's internals, and the compute's own buffers (a layer that recomputes its internals uses the same
    // buffers after the kept layer's backward).
    kept = alloc<void>(stored_bytes, "kept internals");
    pos = alloc<int32_t>(size_t(N) * 4, "positions");
    targets = alloc<int32_t>(size_t(N) * 4, "targets");
    loss = alloc<double>(sizeof(double), "loss");
    ComputeBinding binding;
    binding.shape = s;
    binding.tok = TokenInfo{pos, nullptr};
    const std::vector<ComputeBuffer> buffers = layer_compute_buffers(kernels, cfg, s, mdt);
    std::vector<void*> ptrs;
    for (const ComputeBuffer& b : buffers) ptrs.push_back(alloc<void>(b.bytes, b.tag));
    bind_compute_buffers(binding, buffers, ptrs);
    fill_inputs(binding, T, o.seed);
    compute->bind(binding);
  }
  ~Rig() {
    try {
      dev->synchronize();
    } catch (...) {
    }
    dev->set_sink(nullptr);
    for (void* p : allocs_) dev->free(p);
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  template <typename T>
  T* alloc(size_t bytes, const char* tag) {
    allocs_.push_back(dev->alloc(std::max<size_t>(bytes, 1), tag));
    return static_cast<T*>(allocs_.back());
  }

  const ModelConfig& cfg_;
  const BlockShape s;
  const int64_t N;
  const DType mdt;
  const KernelScope scope_;
  std::unique_ptr<Device> dev;
  const LayerKernels kernels;
  std::unique_ptr<LayerCompute> compute;
  TraceRecorder rec;
  size_t weight_bytes = 0, grad_bytes = 0;  // the largest layer's
  uint8_t *w = nullptr, *g = nullptr, *x_in = nullptr, *x_out = nullptr;
  float *dx_in = nullptr, *dx_out = nullptr;
  void* kept = nullptr;
  int32_t *pos = nullptr, *targets = nullptr;
  double* loss = nullptr;
  std::vector<float> hdx;    // [N, C] the host's copy of dx_out (the embedding backward's input)
  std::vector<int32_t> ids;  // [N] token ids

 private:
  // Random boundaries and output gradients, positions 0..T-1 per row, random targets and ids, the RoPE table.
  void fill_inputs(const ComputeBinding& binding, int64_t T, uint64_t seed) {
    const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
    Rng rng(seed + 7);
    std::vector<float> hx(static_cast<size_t>(N * C));
    hdx.resize(size_t(N * C));
    fill_random(hx.data(), hx.size(), rng, 1.0f);
    std::vector<uint8_t> hx_stored(s.boundary_bytes());
    convert_from_f32(hx_stored.data(), s.act, hx.data(), hx.size());
    fill_random(hdx.data(), hdx.size(), rng, 1e-3f);
    std::vector<int32_t> hpos(static_cast<size_t>(N)), htargets(static_cast<size_t>(N));
    ids.resize(size_t(N));
    for (int64_t i = 0; i < N; ++i) {
      hpos[size_t(i)] = int32_t(i % T);
      htargets[size_t(i)] = int32_t(rng.below(uint64_t(V)));
      ids[size_t(i)] = int32_t(rng.below(uint64_t(V)));
    }
    constexpr StreamKind kH = StreamKind::h2d;
    dev->copy_h2d(x_in, hx_stored.data(), hx_stored.size(), kH, "setup x");
    dev->copy_h2d(dx_out, hdx.data(), hdx.size() * 4, kH, "setup dx");
    dev->copy_h2d(pos, hpos.data(), size_t(N) * 4, kH, "setup pos");
    dev->copy_h2d(targets, htargets.data(), size_t(N) * 4, kH, "setup targets");
    std::vector<float> rope;
    if (binding.rope_cos) {  // the CUDA block's RoPE table, as the executor uploads it
      const int64_t half = T * (s.D / 2);
      rope.resize(size_t(2 * half));
      rope_table(rope.data(), rope.data() + half, T, s.rotary, s.rope);
      dev->copy_h2d(const_cast<float*>(binding.rope_cos), rope.data(), rope.size() * 4, kH, "setup rope");
    }
    dev->synchronize();
  }

  std::vector<void*> allocs_;
};

// Per layer: forward, backward, and what recomputing its internals costs, each the fastest of o.reps, after a warm-up
// of each kind (primitive creation and first-touch page faults belong to no layer).
void measure_layers(Rig& rig, const Prototypes& pt, const MeasureOptions& o, Profile& p) {
  const int64_t L = rig.cfg_.num_layers;
  LayerCompute* c = rig.compute.get();
  int64_t loaded = -1;  // the prototype layer in rig.w
  auto run_layer = [&](int64_t l, int rep) {
    const int64_t pl = pt.proto[size_t(l)];
    const SlabLayout& wl = pt.copy.layout(SlabKind::layer, pl);
    if (pl != loaded) {
      rig.dev->copy_h2d(rig.w, pt.copy.layer(pl), wl.bytes(), StreamKind::h2d, fmt::format("setup W{}", pl));
      rig.dev->synchronize();
      loaded = pl;
    }
    const BlockView view = BlockView::bind(wl, rig.w);
    const SlabLayout gl = SlabLayout::make_layer(rig.cfg_, l, DType::f32);
    const std::string fwd = fmt::format("fwd L{}#{}", l, rep), bwd = fmt::format("bwd L{}#{}", l, rep),
                      rc = fmt::format("recompute L{}#{}", l, rep);
    uint8_t *x_out = rig.x_out, *x_in = rig.x_in, *g = rig.g;
    float *dx_in = rig.dx_in, *dx_out = rig.dx_out;
    void* kept = rig.kept;
    constexpr StreamKind kC = StreamKind::compute;
    rig.dev->launch(kC, [=] { c->forward(x_out, kept, x_in, view); }, fwd, int(l));
    // The backward as the executor runs it (zeroed gradients, the MLP half, the attention half), in one launch.
    auto backward = [=](void* internals) {
      const SlabLayout* glp = &gl;
      c->zero(g, glp->bytes());
      BlockGrads gr = BlockGrads::bind(*glp, g);
      c->backward_mlp(gr, dx_out, internals, view);
      c->backward_attention(dx_in, gr, x_in, internals, view);
    };
    rig.dev->launch(kC, [=] { backward(kept); }, bwd, int(l));
    // A layer without its internals: the attention half again, then a backward that recomputes the MLP's.
    rig.dev->launch(kC, [=] { c->recompute_internals(x_in, view); }, rc, int(l));
    rig.dev->launch(kC, [=] { backward(nullptr); }, rc + " bwd", int(l));
    rig.dev->synchronize();
  };
  for (int64_t k = 0; k < pt.one.num_layers; ++k)
    run_layer(int64_t(std::find(pt.proto.begin(), pt.proto.end(), k) - pt.proto.begin()), -1);
  p.forward_s.assign(size_t(L), 0);
  p.backward_s.assign(size_t(L), 0);
  p.recompute_s.assign(size_t(L), 0);
  for (int64_t l = 0; l < L; ++l) {
    std::vector<double> f, b, r;
    for (int rep = 0; rep < o.reps; ++rep) {
      run_layer(l, rep);
      f.push_back(op_seconds(rig.rec, fmt::format("fwd L{}#{}", l, rep)));
      const double bk = op_seconds(rig.rec, fmt::format("bwd L{}#{}", l, rep));
      b.push_back(bk);
      // Recomputing costs the attention half plus what the MLP's recompute adds to the backward.
      const std::string rc = fmt::format("recompute L{}#{}", l, rep);
      r.push_back(op_seconds(rig.rec, rc) + std::max(0.0, op_seconds(rig.rec, rc + " bwd") - bk));
    }
    p.forward_s[size_t(l)] = fastest(f);
    p.backward_s[size_t(l)] = fastest(b);
    p.recompute_s[size_t(l)] = fastest(r);
  }
}

// The head: the executor's single launch (grads zeroed, fused norm + lm_head + CE forward and backward).
void measure_head(Rig& rig, const Prototypes& pt, const MeasureOptions& o, Profile& p) {
  const ModelConfig& cfg = rig.cfg_;
  const ModelSlabs &copy = pt.copy, &params = pt.params;
  const int64_t N = rig.N;
  constexpr StreamKind kH = StreamKind::h2d;
  const SlabLayout& hwl = copy.layout(SlabKind::head);
  const bool tied = cfg.tie_word_embeddings;
  const SlabLayout &ewl = copy.layout(SlabKind::embedding), &hgl = params.layout(SlabKind::head),
                   &egl = params.layout(SlabKind::embedding);
  auto* hw = rig.alloc<uint8_t>(hwl.bytes() + (tied ? ewl.bytes() : 0), "head weights");
  auto* hg = rig.alloc<uint8_t>(hgl.bytes() + (tied ? egl.bytes() : 0), "head grads");
  rig.dev->copy_h2d(hw, copy.slab(SlabKind::head), hwl.bytes(), kH, "setup head");
  if (tied) rig.dev->copy_h2d(hw + hwl.bytes(), copy.slab(SlabKind::embedding), ewl.bytes(), kH, "setup head tied");
  rig.dev->synchronize();
  // The executor's head call (at bf16 storage it widens its input first).
  const HeadBuffers hb = bind_head_buffers(cfg, hwl, ewl, hgl, egl, hw, hg);
  HeadCall call;
  call.dx = rig.dx_in;
  call.grads = hg;
  call.grads_bytes = hb.grads_bytes;
  call.dnorm_w = hb.dnorm_w;
  call.dlm_w = hb.dlm_w;
  call.x = rig.x_out;
  call.x32 = rig.alloc<float>(size_t(N * cfg.hidden_size) * 4, "head input");
  call.targets = rig.targets;
  call.norm_w = hb.norm_w;
  call.lm_w = hb.lm_w;
  call.grad_scale = 1.0f / float(N);
  call.shape = HeadShape{N, cfg.hidden_size, cfg.vocab_size, float(cfg.rms_norm_eps)};
  call.loss = rig.loss;
  std::vector<double> t;
  for (int rep = 0; rep <= o.reps; ++rep) {
    const std::string name = fmt::format("head#{}", rep);
    LayerCompute* c = rig.compute.get();
    rig.dev->launch(StreamKind::compute, [=] { c->head(call); }, name);
    rig.dev->synchronize();
    if (rep > 0) t.push_back(op_seconds(rig.rec, name));
  }
  p.head_s = fastest(t);
}

// The embedding: the lookup on the host (the executor's issuing thread), the backward's rows on the device (the
// compute stream's last launch, from dx_out into dx_in) and their add into the table on the host (its host lane).
void measure_embedding(Rig& rig, const Prototypes& pt, const MeasureOptions& o, Profile& p) {
  const int64_t N = rig.N, C = rig.cfg_.hidden_size, V = rig.cfg_.vocab_size;
  const float* table = pt.params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>();
  const TokenGroups g = group_tokens_by_id(rig.ids.data(), N, V);
  const int64_t P = int64_t(g.present.size());
  auto* start = rig.alloc<int32_t>(g.start.size() * 4, "token groups start");
  auto* order = rig.alloc<int32_t>(g.order.size() * 4, "token groups order");
  rig.dev->copy_h2d(start, g.start.data(), g.start.size() * 4, StreamKind::h2d, "setup token groups start");
  rig.dev->copy_h2d(order, g.order.data(), g.order.size() * 4, StreamKind::h2d, "setup token groups order");
  rig.dev->synchronize();
  std::vector<float> out(static_cast<size_t>(N * C)), dtable(static_cast<size_t>(V * C), 0.0f);
  std::vector<float> rows(static_cast<size_t>(P * C));
  embedding_grad_rows(rows.data(), rig.hdx.data(), g.start.data(), g.order.data(), P, C);
  std::vector<double> tf, tr, tb;
  for (int rep = 0; rep <= o.reps; ++rep) {
    const std::string name = fmt::format("embedding rows#{}", rep);
    LayerCompute* c = rig.compute.get();
    float *dst = rig.dx_in, *src = rig.dx_out;
    rig.dev->launch(StreamKind::compute, [=] { c->embedding_rows(dst, src, start, order, P); }, name);
    rig.dev->synchronize();
    Timer t1;
    embedding_forward(out.data(), rig.ids.data(), table, N, C, V);
    const double a = t1.seconds();
    Timer t2;
    embedding_add_rows(dtable.data(), rows.data(), g.present.data(), P, C, 0, V * C);
    const double b = t2.seconds();
    if (rep > 0) {
      tf.push_back(a);
      tr.push_back(op_seconds(rig.rec, name));
      tb.push_back(b);
    }
  }
  p.embed_forward_s = fastest(tf);
  p.embed_rows_s = fastest(tr);
  p.embed_backward_s = fastest(tb);
}

// The link: one layer's weights up and gradients down, alone and together (both directions busy).
void measure_link(Rig& rig, const MeasureOptions& o, Profile& p) {
  const size_t bytes = std::max({rig.weight_bytes, rig.grad_bytes, rig.s.boundary_bytes()});
  Device& dev = *rig.dev;
  constexpr StreamKind kH = StreamKind::h2d, kD = StreamKind::d2h;
  std::vector<uint8_t> host_src(bytes, 1), host_dst(bytes, 0);
  // Pinned, as the executor's streamed slabs and host buffers are (Device::pin_host; nothing on the CPU device):
  // a pageable copy on a GPU goes through the driver's bounce buffer at a fraction of the link's speed.
  struct Pinned {  // unpinned before the vector it pins goes, also when a copy throws
    Device& dev;
    void* base;
    Pinned(Device& d, void* p, size_t n, const char* what) : dev(d), base(p) { dev.pin_host(p, n, what); }
    ~Pinned() { dev.unpin_host(base); }
  };
  const Pinned pin_src(dev, host_src.data(), bytes, "link probe source");
  const Pinned pin_dst(dev, host_dst.data(), bytes, "link probe destination");
  auto* dbuf = rig.alloc<uint8_t>(bytes, "link probe");
  auto* dbuf2 = rig.alloc<uint8_t>(bytes, "link probe 2");
  std::vector<double> h, d, hd, dd, lat;
  for (int rep = 0; rep <= o.reps; ++rep) {
    dev.copy_h2d(dbuf, host_src.data(), bytes, kH, fmt::format("probe h2d#{}", rep));
    dev.synchronize();
    dev.copy_d2h(host_dst.data(), dbuf2, bytes, kD, fmt::format("probe d2h#{}", rep));
    dev.synchronize();
    dev.copy_h2d(dbuf, host_src.data(), bytes, kH, fmt::format("probe both h2d#{}", rep));
    dev.copy_d2h(host_dst.data(), dbuf2, bytes, kD, fmt::format("probe both d2h#{}", rep));
    dev.synchronize();
    dev.copy_h2d(dbuf, host_src.data(), 4096, kH, fmt::format("probe latency#{}", rep));
    dev.synchronize();
    if (rep == 0) continue;
    h.push_back(op_seconds(rig.rec, fmt::format("probe h2d#{}", rep)));
    d.push_back(op_seconds(rig.rec, fmt::format("probe d2h#{}", rep)));
    hd.push_back(op_seconds(rig.rec, fmt::format("probe both h2d#{}", rep)));
    dd.push_back(op_seconds(rig.rec, fmt::format("probe both d2h#{}", rep)));
    lat.push_back(op_seconds(rig.rec, fmt::format("probe latency#{}", rep)));
  }
  const double gb = double(bytes) / 1e9;
  p.link.latency_s = o.link.latency_s > 0 ? fastest(lat) : 0.0;
  p.link.h2d_gbps = gb / std::max(1e-9, fastest(h) - p.link.latency_s);
  p.link.d2h_gbps = gb / std::max(1e-9, fastest(d) - p.link.latency_s);
  p.link.h2d_duplex_gbps = gb / std::max(1e-9, fastest(hd) - p.link.latency_s);
  p.link.d2h_duplex_gbps = gb / std::max(1e-9, fastest(dd) - p.link.latency_s);
}

// Gradient accumulation on a HostWorker, the executor's loop (fixed chunks, dst += src).
void measure_accumulate(Rig& rig, const MeasureOptions& o, Profile& p) {
  const size_t n = rig.grad_bytes / 4;
  std::vector<float> dst(n, 0.0f), src(n, 1.0f);
  HostWorker hw("host", rig.dev.get());
  TraceRecorder hrec;
  hw.set_sink(&hrec);
  for (int rep = 0; rep <= o.reps; ++rep)
    hw.submit([&] {
      parallel_chunks(int64_t(n), int64_t(1) << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dst[size_t(i)] += src[size_t(i)];
      });
    }, fmt::format("accumulate#{}", rep));
  hw.drain();
  std::vector<double> t;
  for (int rep = 1; rep <= o.reps; ++rep) t.push_back(op_seconds(hrec, fmt::format("accumulate#{}", rep)));
  p.accumulate_gbps = double(rig.grad_bytes) / 1e9 / fastest(t);
}

// The host optimizer: the fused Hybrid 8-bit AdamW update of one layer slab (optim/adamw.h).
void measure_optimizer(Prototypes& pt, DType matrices, const MeasureOptions& o, Profile& p) {
  if (o.optimizer) {
    AdamWConfig acfg;
    AdamWSlab slab(optim_tensors(pt.one, SlabKind::layer, 0, acfg), acfg);
    ModelSlabs grads(pt.one, DType::f32);
    Rng grng(o.seed + 11);
    fill_random(reinterpret_cast<float*>(grads.layer(0)), grads.layout(SlabKind::layer).bytes() / 4, grng, 1e-3f);
    uint8_t* cc = matrices == DType::bf16 ? pt.copy.layer(0) : nullptr;
    std::vector<double> t;
    for (int rep = 0; rep <= o.reps; ++rep) {
      Timer tm;
      slab.update(pt.params.layer(0), grads.layer(0), StepArgs{rep + 1, 1e-5, 1.0f}, cc);
      if (rep > 0) t.push_back(tm.seconds());
    }
    p.optimizer_params_per_s = double(pt.params.layout(SlabKind::layer).num_parameters()) / fastest(t);
    p.optimizer_note = fmt::format("Hybrid 8-bit AdamW (optim/adamw.h), one layer slab, {} threads", num_threads());
  } else {
    p.optimizer_note = "not measured (--no-optimizer)";
  }
}

// NVMe through the executor's store.
void measure_nvme(const MeasureOptions& o, Profile& p) {
  if (!o.nvme_dir.empty()) {
    NvmeOptions no;
    no.dir = o.nvme_dir;
    no.capacity_bytes = o.nvme_probe_bytes;
    std::unique_ptr<NvmeStore> store = NvmeStore::open(no);
    NvmeProbe pr = store->probe(o.nvme_probe_bytes);
    p.nvme_read_gbps = pr.read_gbps;
    p.nvme_write_gbps = pr.write_gbps;
    p.nvme_note = store->describe() + ": " + pr.describe();
  } else {
    p.nvme_note = "not measured (no --nvme-dir)";
  }
}

}  // namespace

Profile measure_profile(const ModelConfig& cfg, int64_t B, int64_t T, const MeasureOptions& o) {
  LT_CHECK(B >= 1 && T >= 1, "profile: batch {} x seq {} must both be >= 1", B, T);
  LT_CHECK(o.reps >= 1, "profile: --reps must be >= 1");
  Rig rig(cfg, B, T, o);
  Prototypes pt(cfg, rig.mdt, o.seed);
  Profile p;
  p.name = rig.dev->name();
  p.model = o.model_name;
  p.batch = B;
  p.seq = T;
  p.compute = o.compute == ComputeType::bf16 ? "bf16" : "f32";
  p.activations = dtype_name(rig.s.act);
  p.layer_kernels = rig.kernels;
  p.device_memory_bytes = o.device_memory;
  p.source = fmt::format("measured by `lazytrain profile` on {} with {} threads, best of {}", rig.dev->name(),
                         num_threads(), o.reps);
  if (rig.s.mlp_chunk > 0) p.source += fmt::format(", the MLP in chunks of {} tokens", rig.s.mlp_chunk);
  measure_layers(rig, pt, o, p);
  measure_head(rig, pt, o, p);
  measure_embedding(rig, pt, o, p);
  measure_link(rig, o, p);
  measure_accumulate(rig, o, p);
  measure_optimizer(pt, rig.mdt, o, p);
  measure_nvme(o, p);
  return p;
}

}  // namespace lt
