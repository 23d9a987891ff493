// bench/bench_layer.cpp — one decoder layer's forward + backward on the CPU, against the GEMM library.
//
// Shapes (issue 2): hidden 1024, 16 heads, 4 KV heads (D = 64), intermediate 2816, T = 1024, B = 1.
// For each compute dtype it reports:
//   layer_gflops : model FLOPs of forward + backward / measured time (attention counted causal:
//                  forward 2 GEMM-like products over the lower triangle, backward 2.5x forward)
//   gemm_gflops  : oneDNN's own rate, with its own threading, on exactly the layer's GEMM shapes
//                  (forward and backward), measured in the same run — the physical limit we compare to.
//                  Where the host has no native bf16 matmul (AVX2-only CPUs: our bf16 GEMM widens to f32),
//                  the limit for bf16 is oneDNN's f32 rate; gemm_dtype says which was measured.
//   vector_path  : the instruction set the kernels ran (LT_MAX_ISA caps it), gemm_bf16 the bf16 route
//   ratio        : layer_gflops / gemm_gflops   (target >= 0.60)
// Prints one JSON line per dtype. Run through bench/run_layer.sh to add PyTorch in the same run.
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

ModelConfig layer_config() {
  ModelConfig c;
  c.type = ModelType::qwen2;
  c.vocab_size = 1024;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.num_layers = 1;
  c.num_heads = 16;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.qkv_bias = true;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 4096;
  return c;
}

struct Flops {
  double linear_fwd, attention_fwd;
  double total() const { return 3 * linear_fwd + 3.5 * attention_fwd; }
};

Flops layer_flops(const BlockShape& s) {
  double N = double(s.N());
  double per_token = double(s.C) * (2.0 * s.QD() + 2.0 * s.KVD()) + 3.0 * s.C * s.I;
  double causal_pairs = double(s.B) * s.T * (s.T + 1) / 2.0;
  return Flops{2 * N * per_token, 2 * 2 * causal_pairs * s.Hq * s.D};
}

// oneDNN with its own threading on the layer's GEMMs: {M, N, K} of forward, dX and dW products.
double gemm_library_gflops(const BlockShape& s, bool bf16) {
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  const int64_t N = s.N();
  struct Shape3 { int64_t m, n, k; };
  std::vector<Shape3> shapes;
  for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{
           {s.QD(), s.C}, {s.KVD(), s.C}, {s.KVD(), s.C}, {s.C, s.QD()}, {s.I, s.C}, {s.I, s.C}, {s.C, s.I}}) {
    shapes.push_back({N, out, in});   // forward
    shapes.push_back({N, in, out});   // input gradient
    shapes.push_back({out, in, N});   // weight gradient
  }
  auto dt = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  std::vector<std::pair<matmul, std::vector<memory>>> prims;
  double flops = 0;
  for (auto sh : shapes) {
    memory::desc a({sh.m, sh.k}, dt, memory::format_tag::ab), b({sh.k, sh.n}, dt, memory::format_tag::ab),
        c({sh.m, sh.n}, memory::data_type::f32, memory::format_tag::ab);
    matmul::primitive_desc pd(matmul::desc(a, b, c), eng);
    prims.push_back({matmul(pd), {memory(a, eng), memory(b, eng), memory(c, eng)}});
    flops += 2.0 * sh.m * sh.n * sh.k;
  }
  auto run_all = [&]() {
    for (auto& [p, m] : prims) p.execute(st, {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}});
    st.wait();
  };
  run_all();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    Timer t;
    run_all();
    best = std::min(best, t.seconds());
  }
  return flops / best / 1e9;
}

nlohmann::json bench_layer(ComputeType compute, int reps) {
  ModelConfig cfg = layer_config();
  const int64_t B = 1, T = 1024;
  BlockShape s = BlockShape::make(cfg, B, T);
  ModelSlabs params(cfg), grads(cfg);
  init_random(params, 1, 0.02f);
  ModelSlabs copy(cfg, compute == ComputeType::bf16 ? DType::bf16 : DType::f32);
  make_compute_copy(copy, params);
  BlockView w = BlockView::bind(copy.layout(SlabKind::layer), copy.layer(0));
  BlockGrads g = BlockGrads::bind(grads.layout(SlabKind::layer), grads.layer(0));

  const int64_t N = s.N();
  AlignedBuffer<float> x(size_t(N * s.C), 64), y(size_t(N * s.C), 64), dy(size_t(N * s.C), 64),
      dx(size_t(N * s.C), 64), acts_buf(WorkingCopy::floats(s), 64), scratch_buf(BlockScratch::floats(s), 64);
  Rng rng(2);
  for (auto& v : x) v = float(rng.normal());
  for (auto& v : dy) v = float(rng.normal() * 1e-3);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i % T);
  TokenInfo tok{pos.data(), nullptr};
  WorkingCopy acts = WorkingCopy::bind(acts_buf.data(), s);
  BlockScratch scratch = BlockScratch::bind(scratch_buf.data(), s);

  auto step = [&]() {
    block_forward(y.data(), acts, x.data(), w, tok, s);
    block_backward(dx.data(), g, scratch, dy.data(), x.data(), acts, w, tok, s);
  };
  step();  // warm-up: primitive creation, page faults
  double best = 1e30, fwd_best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    block_forward(y.data(), acts, x.data(), w, tok, s);
    fwd_best = std::min(fwd_best, t.seconds());
    block_backward(dx.data(), g, scratch, dy.data(), x.data(), acts, w, tok, s);
    best = std::min(best, t.seconds());
  }
  Flops f = layer_flops(s);
  double layer = f.total() / best / 1e9;
  const bool native_bf16 = compute == ComputeType::bf16 && gemm_bf16_route() == Bf16Route::native;
  double gemm = gemm_library_gflops(s, native_bf16);
  return {{"bench", "layer"},
          {"dtype", compute == ComputeType::bf16 ? "bf16" : "f32"},
          {"threads", num_threads()},
          {"vector_path", isa_name(isa_level(cpu_features()))},
          {"gemm_bf16", bf16_route_name(gemm_bf16_route())},
          {"gemm_dtype", native_bf16 ? "bf16" : "f32"},
          {"shape", {{"B", B}, {"T", T}, {"C", s.C}, {"Hq", s.Hq}, {"Hkv", s.Hkv}, {"D", s.D}, {"I", s.I}}},
          {"step_s", best},
          {"forward_s", fwd_best},
          {"gflop", f.total() / 1e9},
          {"layer_gflops", layer},
          {"gemm_gflops", gemm},
          {"ratio", layer / gemm}};
}

}  // namespace
}  // namespace lt

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  for (auto ct : {lt::ComputeType::f32, lt::ComputeType::bf16})
    std::printf("%s\n", lt::bench_layer(ct, reps).dump().c_str());
  return 0;
}
