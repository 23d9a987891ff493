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

Profile measure_profile(const ModelConfig& cfg0, int64_t B, int64_t T, const MeasureOptions& o) {
  LT_CHECK(B >= 1 && T >= 1, "profile: batch {} x seq {} must both be >= 1", B, T);
  LT_CHECK(o.reps >= 1, "profile: --reps must be >= 1");
  const ModelConfig& cfg = cfg0;
  const int64_t L = cfg.num_layers, N = B * T, C = cfg.hidden_size, V = cfg.vocab_size;
  const DType mdt = o.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  const BlockShape s = BlockShape::make(cfg, B, T, o.activations);

  // One layer of each kind (the executor streams every layer through the same buffers, sized for the largest;
  // layers of one kind share shapes — a hybrid model has Gated DeltaNet and attention layers), plus the
  // embedding and head, from a copy of the config with those layers.
  ModelConfig one = cfg;
  std::vector<int64_t> proto(size_t(cfg.num_layers));  // layer l is measured with `one`'s layer proto[l]
  one.layer_types.clear();
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const LayerKind k = cfg.layer_kind(l);
    const auto it = std::find(one.layer_types.begin(), one.layer_types.end(), k);
    proto[size_t(l)] = int64_t(it - one.layer_types.begin());
    if (it == one.layer_types.end()) one.layer_types.push_back(k);
  }
  one.num_layers = int64_t(one.layer_types.size());
  if (!cfg.is_hybrid()) one.layer_types.clear();  // uniform models keep their implicit full attention
  ModelSlabs params(one, DType::f32);
  init_random(params, o.seed);
  ModelSlabs copy(one, mdt);
  make_compute_copy(copy, params);
  // The sizes every layer passes through (the largest layer's), as the executor's buffers have them.
  size_t weight_bytes = 0, grad_bytes = 0, stored_bytes = 0;
  for (int64_t l = 0; l < L; ++l) {
    weight_bytes = std::max(weight_bytes, SlabLayout::make_layer(cfg, l, mdt).bytes());
    grad_bytes = std::max(grad_bytes, SlabLayout::make_layer(cfg, l, DType::f32).bytes());
    stored_bytes = std::max(stored_bytes, block_stored_bytes(s.for_layer(cfg.layer_kind(l))));
  }

  const KernelScope scope = o.backend.kernels();
  std::unique_ptr<Device> dev = o.backend.open(o.device_memory, o.link, o.gpu);
  const LayerKernels kernels = o.backend.layer_kernels(s.act);
  std::unique_ptr<LayerCompute> compute =
      kernels == LayerKernels::cuda ? cuda::make_gpu_layer_compute(*dev) : make_cpu_layer_compute();
  TraceRecorder rec;
  dev->set_sink(&rec);
  std::vector<void*> allocs;
  auto dalloc = [&](size_t bytes, const char* tag) {
    void* p = dev->alloc(std::max<size_t>(bytes, 1), tag);
    allocs.push_back(p);
    return p;
  };
  struct Cleanup {
    Device& d;
    std::vector<void*>& a;
    ~Cleanup() {
      try {
        d.synchronize();
      } catch (...) {
      }
      d.set_sink(nullptr);
      for (void* p : a) d.free(p);
    }
  } cleanup{*dev, allocs};

  const size_t xbytes = s.boundary_bytes(), dxbytes = size_t(N * C) * 4;
  auto* w = static_cast<uint8_t*>(dalloc(weight_bytes, "weights"));
  auto* g = static_cast<uint8_t*>(dalloc(grad_bytes, "grads"));
  auto* x_in = static_cast<uint8_t*>(dalloc(xbytes, "x_in"));
  auto* x_out = static_cast<uint8_t*>(dalloc(xbytes, "x_out"));
  auto* dx_in = static_cast<float*>(dalloc(dxbytes, "dx_in"));
  auto* dx_out = static_cast<float*>(dalloc(dxbytes, "dx_out"));
  // A kept layer's internals, and the compute's own buffers as it declares them for the executor (a layer that
  // recomputes its internals uses the same buffers after the kept layer's backward).
  auto* kept = dalloc(stored_bytes, "kept internals");
  auto* pos = static_cast<int32_t*>(dalloc(size_t(N) * 4, "positions"));
  auto* targets = static_cast<int32_t*>(dalloc(size_t(N) * 4, "targets"));
  auto* loss = static_cast<double*>(dalloc(sizeof(double), "loss"));
  ComputeBinding binding;
  binding.shape = s;
  binding.tok = TokenInfo{pos, nullptr};
  const std::vector<ComputeBuffer> compute_buffers = layer_compute_buffers(kernels, cfg, s, mdt);
  std::vector<void*> compute_ptrs;
  for (const ComputeBuffer& b : compute_buffers) compute_ptrs.push_back(dalloc(b.bytes, b.tag));
  bind_compute_buffers(binding, compute_buffers, compute_ptrs);
  std::vector<float> rope_host;
  if (binding.rope_cos) {  // the GPU block's RoPE table, as the executor uploads it
    const int64_t half = T * (s.D / 2);
    rope_host.resize(size_t(2 * half));
    rope_table(rope_host.data(), rope_host.data() + half, T, s.rotary, s.rope_theta);
  }

  // Host inputs.
  Rng rng(o.seed + 7);
  std::vector<float> hx(static_cast<size_t>(N * C)), hdx(static_cast<size_t>(N * C));
  fill_random(hx.data(), hx.size(), rng, 1.0f);
  std::vector<uint8_t> hx_stored(xbytes);
  convert_from_f32(hx_stored.data(), s.act, hx.data(), hx.size());
  fill_random(hdx.data(), hdx.size(), rng, 1e-3f);
  std::vector<int32_t> hpos(static_cast<size_t>(N)), htargets(static_cast<size_t>(N)), ids(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    hpos[size_t(i)] = int32_t(i % T);
    htargets[size_t(i)] = int32_t(rng.below(uint64_t(V)));
    ids[size_t(i)] = int32_t(rng.below(uint64_t(V)));
  }
  constexpr StreamKind kC = StreamKind::compute, kH = StreamKind::h2d, kD = StreamKind::d2h;
  dev->copy_h2d(x_in, hx_stored.data(), xbytes, kH, "setup x");
  dev->copy_h2d(dx_out, hdx.data(), dxbytes, kH, "setup dx");
  dev->copy_h2d(pos, hpos.data(), size_t(N) * 4, kH, "setup pos");
  dev->copy_h2d(targets, htargets.data(), size_t(N) * 4, kH, "setup targets");
  if (!rope_host.empty())
    dev->copy_h2d(const_cast<float*>(binding.rope_cos), rope_host.data(), rope_host.size() * 4, kH, "setup rope");
  dev->synchronize();
  compute->bind(binding);

  Profile p;
  p.name = dev->name();
  p.model = o.model_name;
  p.batch = B;
  p.seq = T;
  p.compute = o.compute == ComputeType::bf16 ? "bf16" : "f32";
  p.activations = dtype_name(s.act);
  p.layer_kernels = kernels == LayerKernels::cuda ? "cuda" : "cpu";
  p.device_memory_bytes = o.device_memory;
  p.source = fmt::format("measured by `lazytrain profile` on {} with {} threads, best of {}", dev->name(),
                         num_threads(), o.reps);

  LayerCompute* c = compute.get();
  int64_t loaded = -1;  // the prototype layer in `w`
  // Warm-up (each kind once): primitive creation and first-touch page faults belong to no layer.
  auto run_layer = [&](int64_t l, int rep) {
    const int64_t pl = proto[size_t(l)];
    const SlabLayout& wl = copy.layout(SlabKind::layer, pl);
    if (pl != loaded) {
      dev->copy_h2d(w, copy.layer(pl), wl.bytes(), kH, fmt::format("setup W{}", pl));
      dev->synchronize();
      loaded = pl;
    }
    const BlockView view = BlockView::bind(wl, w);
    const SlabLayout gl = SlabLayout::make_layer(cfg, l, DType::f32);
    const std::string fwd = fmt::format("fwd L{}#{}", l, rep), bwd = fmt::format("bwd L{}#{}", l, rep),
                      rc = fmt::format("recompute L{}#{}", l, rep);
    dev->launch(kC, [=] { c->forward(x_out, kept, x_in, view); }, fwd, int(l));
    // The backward as the executor runs it (zeroed gradients, the MLP half, the attention half), in one launch.
    auto backward = [=](void* internals) {
      const SlabLayout* glp = &gl;
      c->zero(g, glp->bytes());
      BlockGrads gr = BlockGrads::bind(*glp, g);
      c->backward_mlp(gr, dx_out, internals, view);
      c->backward_attention(dx_in, gr, x_in, internals, view);
    };
    dev->launch(kC, [=] { backward(kept); }, bwd, int(l));
    // A layer without its internals: the attention half again, then a backward that recomputes the MLP's.
    dev->launch(kC, [=] { c->recompute_internals(x_in, view); }, rc, int(l));
    dev->launch(kC, [=] { backward(nullptr); }, rc + " bwd", int(l));
    dev->synchronize();
  };
  for (int64_t k = 0; k < one.num_layers; ++k)
    run_layer(int64_t(std::find(proto.begin(), proto.end(), k) - proto.begin()), -1);
  p.forward_s.assign(size_t(L), 0);
  p.backward_s.assign(size_t(L), 0);
  p.recompute_s.assign(size_t(L), 0);
  for (int64_t l = 0; l < L; ++l) {
    std::vector<double> f, b, r;
    for (int rep = 0; rep < o.reps; ++rep) {
      run_layer(l, rep);
      f.push_back(op_seconds(rec, fmt::format("fwd L{}#{}", l, rep)));
      const double bk = op_seconds(rec, fmt::format("bwd L{}#{}", l, rep));
      b.push_back(bk);
      // Recomputing costs the attention half plus what the MLP's recompute adds to the backward.
      const std::string rc = fmt::format("recompute L{}#{}", l, rep);
      r.push_back(op_seconds(rec, rc) + std::max(0.0, op_seconds(rec, rc + " bwd") - bk));
    }
    p.forward_s[size_t(l)] = fastest(f);
    p.backward_s[size_t(l)] = fastest(b);
    p.recompute_s[size_t(l)] = fastest(r);
  }

  // Head: the executor's single launch (grads zeroed, fused norm + lm_head + CE forward and backward).
  {
    const SlabLayout& hwl = copy.layout(SlabKind::head);
    const bool tied = cfg.tie_word_embeddings;
    size_t hw_bytes = hwl.bytes(), hg_bytes = params.layout(SlabKind::head).bytes();
    if (tied) {
      hw_bytes += copy.layout(SlabKind::embedding).bytes();
      hg_bytes += params.layout(SlabKind::embedding).bytes();
    }
    auto* hw = static_cast<uint8_t*>(dalloc(hw_bytes, "head weights"));
    auto* hg = static_cast<uint8_t*>(dalloc(hg_bytes, "head grads"));
    dev->copy_h2d(hw, copy.slab(SlabKind::head), hwl.bytes(), kH, "setup head");
    if (tied) dev->copy_h2d(hw + hwl.bytes(), copy.slab(SlabKind::embedding), copy.layout(SlabKind::embedding).bytes(), kH,
                            "setup head tied");
    dev->synchronize();
    const SlabEntry& ne = hwl.entry("norm.weight");
    const float* norm_w = reinterpret_cast<const float*>(hw + ne.offset);
    WeightRef lm;
    float* dnorm = reinterpret_cast<float*>(hg + params.layout(SlabKind::head).entry("norm.weight").offset);
    float* dlm;
    if (tied) {
      lm = WeightRef{hw + hwl.bytes() + copy.layout(SlabKind::embedding).entry("embed_tokens.weight").offset, mdt};
      dlm = reinterpret_cast<float*>(hg + params.layout(SlabKind::head).bytes() +
                                     params.layout(SlabKind::embedding).entry("embed_tokens.weight").offset);
    } else {
      lm = WeightRef{hw + hwl.entry("lm_head.weight").offset, mdt};
      dlm = reinterpret_cast<float*>(hg + params.layout(SlabKind::head).entry("lm_head.weight").offset);
    }
    // The executor's head call (at bf16 storage it widens its input first).
    HeadCall call;
    call.dx = dx_in;
    call.grads = hg;
    call.grads_bytes = hg_bytes;
    call.dnorm_w = dnorm;
    call.dlm_w = dlm;
    call.x = x_out;
    call.x32 = static_cast<float*>(dalloc(dxbytes, "head input"));
    call.targets = targets;
    call.norm_w = norm_w;
    call.lm_w = lm;
    call.grad_scale = 1.0f / float(N);
    call.shape = HeadShape{N, C, V, float(cfg.rms_norm_eps)};
    call.loss = loss;
    std::vector<double> t;
    for (int rep = 0; rep <= o.reps; ++rep) {
      const std::string name = fmt::format("head#{}", rep);
      dev->launch(kC, [=] { c->head(call); }, name);
      dev->synchronize();
      if (rep > 0) t.push_back(op_seconds(rec, name));
    }
    p.head_s = fastest(t);
  }

  // Embedding on the host, as the executor's issuing thread and host worker run it.
  {
    const float* table = params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>();
    std::vector<float> out(static_cast<size_t>(N * C)), dtable(static_cast<size_t>(V * C), 0.0f);
    std::vector<double> tf, tb;
    for (int rep = 0; rep <= o.reps; ++rep) {
      Timer t1;
      embedding_forward(out.data(), ids.data(), table, N, C, V);
      const double a = t1.seconds();
      Timer t2;
      embedding_backward(dtable.data(), hdx.data(), ids.data(), N, C, V);
      const double b = t2.seconds();
      if (rep > 0) {
        tf.push_back(a);
        tb.push_back(b);
      }
    }
    p.embed_forward_s = fastest(tf);
    p.embed_backward_s = fastest(tb);
  }

  // The link: one layer's weights up and gradients down, alone and together (both directions busy).
  {
    const size_t bytes = std::max({weight_bytes, grad_bytes, xbytes});
    std::vector<uint8_t> host_src(bytes, 1), host_dst(bytes, 0);
    // Pinned, as the executor's streamed slabs and host buffers are (Device::pin_host; nothing on the CPU device):
    // a pageable copy on a GPU goes through the driver's bounce buffer at a fraction of the link's speed.
    struct Pinned {  // unpinned before the vector it pins goes, also when a copy throws
      Device& dev;
      void* base;
      Pinned(Device& d, void* p, size_t n, const char* what) : dev(d), base(p) { dev.pin_host(p, n, what); }
      ~Pinned() { dev.unpin_host(base); }
    };
    const Pinned pin_src(*dev, host_src.data(), bytes, "link probe source");
    const Pinned pin_dst(*dev, host_dst.data(), bytes, "link probe destination");
    auto* dbuf = static_cast<uint8_t*>(dalloc(bytes, "link probe"));
    auto* dbuf2 = static_cast<uint8_t*>(dalloc(bytes, "link probe 2"));
    std::vector<double> h, d, hd, dd, lat;
    for (int rep = 0; rep <= o.reps; ++rep) {
      dev->copy_h2d(dbuf, host_src.data(), bytes, kH, fmt::format("probe h2d#{}", rep));
      dev->synchronize();
      dev->copy_d2h(host_dst.data(), dbuf2, bytes, kD, fmt::format("probe d2h#{}", rep));
      dev->synchronize();
      dev->copy_h2d(dbuf, host_src.data(), bytes, kH, fmt::format("probe both h2d#{}", rep));
      dev->copy_d2h(host_dst.data(), dbuf2, bytes, kD, fmt::format("probe both d2h#{}", rep));
      dev->synchronize();
      dev->copy_h2d(dbuf, host_src.data(), 4096, kH, fmt::format("probe latency#{}", rep));
      dev->synchronize();
      if (rep == 0) continue;
      h.push_back(op_seconds(rec, fmt::format("probe h2d#{}", rep)));
      d.push_back(op_seconds(rec, fmt::format("probe d2h#{}", rep)));
      hd.push_back(op_seconds(rec, fmt::format("probe both h2d#{}", rep)));
      dd.push_back(op_seconds(rec, fmt::format("probe both d2h#{}", rep)));
      lat.push_back(op_seconds(rec, fmt::format("probe latency#{}", rep)));
    }
    const double gb = double(bytes) / 1e9;
    p.link.latency_s = o.link.latency_s > 0 ? fastest(lat) : 0.0;
    p.link.h2d_gbps = gb / std::max(1e-9, fastest(h) - p.link.latency_s);
    p.link.d2h_gbps = gb / std::max(1e-9, fastest(d) - p.link.latency_s);
    p.link.h2d_duplex_gbps = gb / std::max(1e-9, fastest(hd) - p.link.latency_s);
    p.link.d2h_duplex_gbps = gb / std::max(1e-9, fastest(dd) - p.link.latency_s);
  }

  // Gradient accumulation on a HostWorker, the executor's loop (fixed chunks, dst += src).
  {
    const size_t n = grad_bytes / 4;
    std::vector<float> dst(n, 0.0f), src(n, 1.0f);
    HostWorker hw("host", dev.get());
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
    p.accumulate_gbps = double(grad_bytes) / 1e9 / fastest(t);
  }

  // The host optimizer: the fused Hybrid 8-bit AdamW update of one layer slab (optim/adamw.h).
  if (o.optimizer) {
    AdamWConfig acfg;
    AdamWSlab slab(optim_tensors(one, SlabKind::layer, 0, acfg), acfg);
    ModelSlabs grads(one, DType::f32);
    Rng grng(o.seed + 11);
    fill_random(reinterpret_cast<float*>(grads.layer(0)), grads.layout(SlabKind::layer).bytes() / 4, grng, 1e-3f);
    uint8_t* cc = mdt == DType::bf16 ? copy.layer(0) : nullptr;
    std::vector<double> t;
    for (int rep = 0; rep <= o.reps; ++rep) {
      Timer tm;
      slab.update(params.layer(0), grads.layer(0), StepArgs{rep + 1, 1e-5, 1.0f}, cc);
      if (rep > 0) t.push_back(tm.seconds());
    }
    p.optimizer_params_per_s = double(params.layout(SlabKind::layer).num_parameters()) / fastest(t);
    p.optimizer_note = fmt::format("Hybrid 8-bit AdamW (optim/adamw.h), one layer slab, {} threads", num_threads());
  } else {
    p.optimizer_note = "not measured (--no-optimizer)";
  }

  // NVMe through the executor's store.
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
  return p;
}

}  // namespace lt
