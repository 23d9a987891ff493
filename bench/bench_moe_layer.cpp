// bench/bench_moe_layer.cpp — a Mixture-of-Experts layer's forward + backward on the CPU against a dense layer of the
// same routed FLOPs, and its grouped GEMM against oneDNN's own rate on the same shapes, in one run.
//
// Shapes: hidden 1024, 16 heads, 4 KV heads (D = 64), T = 1024, B = 1 (bench_layer's); the dense layer's MLP is
// intermediate 2816, the sparse layer's 32 experts of 704 with 4 routed per token (4 × 704 = 2816: the same GEMM
// FLOPs per token, plus the router's 2·C·E). Qwen3 attention in both. It reports, per compute dtype:
//   moe_step_s, dense_step_s : best forward + backward of each, alternated rep by rep (the machines are noisy)
//   ratio                    : moe_step_s / dense_step_s — what routing, grouping and per-expert GEMMs cost
//   grouped_gemm_gflops      : the sparse MLP's forward GEMMs (each expert's gate, up and down over its rows, as
//                              model/moe_ffn.cpp runs them: linear_forward per expert) / their time
//   onednn_gflops            : oneDNN's matmul with its own threading on exactly those per-expert shapes — the
//                              physical limit on this host; gemm_ratio = grouped / oneDNN
// One JSON line per dtype.
#include <dnnl.hpp>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/aligned.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "model/block.h"
#include "model/weights.h"
#include "ops/gemm.h"

namespace lt {
namespace {

ModelConfig config(bool moe) {
  ModelConfig c;
  c.type = moe ? ModelType::qwen3_moe : ModelType::qwen3;
  c.vocab_size = 1024;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.num_layers = 1;
  c.num_heads = 16;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.qk_norm = true;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 4096;
  if (moe) {
    c.num_experts = 32;
    c.num_experts_per_tok = 4;
    c.moe_intermediate_size = 704;
    c.norm_topk_prob = true;
  }
  return c;
}

// One layer's weights, buffers and a step, ready to time.
struct Layer {
  ModelConfig cfg;
  BlockShape s;
  ModelSlabs params, grads, copy;
  BlockView w;
  BlockGrads g;
  AlignedBuffer<float> x, y, dy, dx, work, scratch;
  std::vector<int32_t> pos;
  WorkingCopy acts;
  BlockScratch sc;

  Layer(bool moe, ComputeType compute, int64_t T)
      : cfg(config(moe)),
        s(BlockShape::make(cfg, 1, T).for_layer(cfg, 0)),
        params(cfg),
        grads(cfg),
        copy(cfg, compute == ComputeType::bf16 ? DType::bf16 : DType::f32),
        x(size_t(T * cfg.hidden_size), 64),
        y(x.size(), 64),
        dy(x.size(), 64),
        dx(x.size(), 64),
        work(WorkingCopy::floats(s), 64),
        scratch(BlockScratch::floats(s), 64) {
    init_random(params, 1, 0.02f);
    make_compute_copy(copy, params);
    w = BlockView::bind(copy.layout(SlabKind::layer), copy.layer(0));
    g = BlockGrads::bind(grads.layout(SlabKind::layer), grads.layer(0));
    Rng rng(2);
    for (auto& v : x) v = float(rng.normal());
    for (auto& v : dy) v = float(rng.normal() * 1e-3);
    for (int64_t i = 0; i < T; ++i) pos.push_back(int32_t(i));
    acts = WorkingCopy::bind(work.data(), s);
    sc = BlockScratch::bind(scratch.data(), s);
  }
  double step() {
    const TokenInfo tok{pos.data(), nullptr};
    Timer t;
    block_forward(y.data(), acts, x.data(), w, tok, s);
    block_backward(dx.data(), g, sc, dy.data(), x.data(), acts, w, tok, s);
    return t.seconds();
  }
};

struct Gemm3 {
  int64_t m, n, k;
};

// oneDNN with its own threading on the shapes, best of 5: FLOP/s.
double onednn_gflops(const std::vector<Gemm3>& shapes, bool bf16) {
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  auto dt = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  std::vector<std::pair<matmul, std::vector<memory>>> prims;
  double flops = 0;
  for (const Gemm3& sh : shapes) {
    memory::desc a({sh.m, sh.k}, dt, memory::format_tag::ab), b({sh.k, sh.n}, dt, memory::format_tag::ba),
        c({sh.m, sh.n}, memory::data_type::f32, memory::format_tag::ab);
    matmul::primitive_desc pd(matmul::desc(a, b, c), eng);
    prims.push_back({matmul(pd), {memory(a, eng), memory(b, eng), memory(c, eng)}});
    flops += 2.0 * double(sh.m * sh.n * sh.k);
  }
  auto run = [&] {
    for (auto& [p, m] : prims) p.execute(st, {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}});
    st.wait();
  };
  run();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    Timer t;
    run();
    best = std::min(best, t.seconds());
  }
  return flops / best / 1e9;
}

// The sparse MLP's forward GEMMs as moe_ffn.cpp runs them (after routing the layer's n2), timed alone, and the
// per-expert shapes they multiply.
std::pair<double, std::vector<Gemm3>> grouped_gemm_gflops(Layer& m) {
  const BlockShape& s = m.s;
  MoeRouting& r = m.acts.moe;
  const int64_t n = s.mlp_rows();
  moe_route(r, m.acts.n2, m.w.moe, s, n);
  std::vector<Gemm3> shapes;
  double flops = 0;
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t rows = r.offsets[e + 1] - r.offsets[e];
    if (rows == 0) continue;
    for (Gemm3 g : {Gemm3{rows, s.Ie, s.C}, Gemm3{rows, s.Ie, s.C}, Gemm3{rows, s.C, s.Ie}}) {
      shapes.push_back(g);
      flops += 2.0 * double(g.m * g.n * g.k);
    }
  }
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    Timer t;
    moe_gate_up(m.acts.gate, m.acts.up, r, m.acts.n2, m.w.moe, s, n);
    moe_down_combine(m.y.data(), r, m.acts.h, m.acts.n2, m.w.moe, s, n);
    if (rep > 0) best = std::min(best, t.seconds());
  }
  return {flops / best / 1e9, shapes};
}

nlohmann::json bench(ComputeType compute, int reps) {
  const int64_t T = 1024;
  Layer moe(true, compute, T), dense(false, compute, T);
  moe.step();
  dense.step();  // warm-up: primitives, page faults
  double moe_best = 1e30, dense_best = 1e30;
  for (int r = 0; r < reps; ++r) {
    moe_best = std::min(moe_best, moe.step());
    dense_best = std::min(dense_best, dense.step());
  }
  const auto [grouped, shapes] = grouped_gemm_gflops(moe);
  const bool native_bf16 = compute == ComputeType::bf16 && gemm_bf16_route() == Bf16Route::native;
  const double limit = onednn_gflops(shapes, native_bf16);
  const BlockShape& s = moe.s;
  return {{"bench", "moe_layer"},
          {"dtype", compute == ComputeType::bf16 ? "bf16" : "f32"},
          {"threads", num_threads()},
          {"vector_path", isa_name(isa_level(cpu_features()))},
          {"shape", {{"T", T}, {"C", s.C}, {"E", s.E}, {"k", s.k}, {"Ie", s.Ie}, {"dense_I", dense.s.I}}},
          {"moe_step_s", moe_best},
          {"dense_step_s", dense_best},
          {"ratio", moe_best / dense_best},
          {"grouped_gemm_gflops", grouped},
          {"onednn_gflops", limit},
          {"onednn_dtype", native_bf16 ? "bf16" : "f32"},
          {"gemm_ratio", grouped / limit}};
}

}  // namespace
}  // namespace lt

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  for (auto ct : {lt::ComputeType::f32, lt::ComputeType::bf16}) std::printf("%s\n", lt::bench(ct, reps).dump().c_str());
  return 0;
}
