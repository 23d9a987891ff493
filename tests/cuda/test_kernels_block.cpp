// The decoder block on the GPU kernels (cuda/layers/block.inl) under cuda-sim against the CPU block
// (model/block.h) at bf16 activation storage: Qwen2 (biases), Qwen3 (q/k norms) and Llama, bf16 and f32 GEMMs,
// packed documents. The first stored activation (n1, an RMSNorm of the input) and its statistics bit for bit;
// the output, the other stored internals, dx_in and every parameter gradient to the GEMMs' and attention's f32
// rounding carried through bf16 storage (relative L2 below kTol); the same bits in every thread order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/layers.h"
#include "cuda/sim_orders.h"
#include "model/block.h"
#include "model/finetune.h"
#include "ops/rope.h"
#include "core/rng.h"
#include "testing/exec_testing.h"
#include "testing/model_testing.h"

namespace lt::cuda {
namespace {

using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<float> floats_at(const std::vector<uint8_t>& buf, int64_t offset, int64_t n, bool bf16) {
  std::vector<float> out(static_cast<size_t>(n));
  if (bf16)
    convert_bf16_to_f32(out.data(), reinterpret_cast<const bf16_t*>(buf.data() + offset), size_t(n));
  else
    std::memcpy(out.data(), buf.data() + offset, size_t(n) * 4);
  return out;
}

// f32 sums in other orders (the emulated GEMM, attention) differ from the CPU's in the last bits, and a stored
// value near a bf16 boundary then rounds the other way (2^-8 relative): measured at most 1.4e-4 relative L2
// over these shapes; 1e-3 leaves room for other seeds, far below what a wrong formula gives (>= 1e-1).
constexpr double kTol = 1e-3;

// The CPU block (model/block.h) forward and backward with its internals kept: the reference the CUDA block meets.
struct CpuRun {
  std::vector<bf16_t> x_out;
  std::vector<uint8_t> stored;
  std::vector<float> dx_in;
  ModelSlabs grads;
};
// Layer `layer`'s gradients (of the trained tensors alone when cfg.finetune freezes some); a sparse layer's auxiliary
// loss (ti.moe_aux) finished between forward and backward.
CpuRun run_cpu_block(const ModelConfig& cfg, const BlockShape& sh, const BlockView& w, const TokenInfo& ti,
                     const std::vector<bf16_t>& x_in, const std::vector<float>& dx_out, int64_t layer = 0) {
  const size_t n = static_cast<size_t>(sh.N() * sh.C);
  CpuRun r{std::vector<bf16_t>(n), std::vector<uint8_t>(block_stored_bytes(sh)), std::vector<float>(n),
           ModelSlabs(cfg, DType::f32, Fill::zero, cfg.trains_all() ? SlabSet::all : SlabSet::trained)};
  std::vector<float> work(WorkingCopy::floats(sh)), scratch(BlockScratch::floats(sh));
  LayerInternals li = bind_internals(r.stored.data(), work.data(), sh);
  block_forward(r.x_out.data(), li.working, x_in.data(), w, ti, sh, li.stored);
  if (ti.moe_aux) ti.moe_aux->finish();
  BlockGrads g = BlockGrads::bind(r.grads.layout(SlabKind::layer, layer), r.grads.layer(layer));
  BlockScratch bs = BlockScratch::bind(scratch.data(), sh);
  block_backward(r.dx_in.data(), g, bs, dx_out.data(), x_in.data(), li.working, w, ti, sh, li.saved, li.stored);
  return r;
}

// The CUDA block of one layer under cuda-sim: its RoPE table (the rotated dims) and scratch. run() is a forward with
// the internals stored and the backward from them into layer `layer` of `grads`.
struct SimBlock {
  std::vector<float> cos, sin;
  std::vector<uint8_t> scratch;
  CudaBlock blk;
  SimBlock(const BlockShape& sh, const BlockView& w, const TokenInfo& ti)
      : cos(static_cast<size_t>(sh.T * sh.D / 2)), sin(cos.size()), scratch(cuda_block_scratch_bytes(sh)) {
    rope_table(cos.data(), sin.data(), sh.T, sh.rotary, sh.rope);
    blk = CudaBlock{sh, w, ti, cos.data(), sin.data(), scratch.data()};
  }
  struct Out {
    std::vector<bf16_t> x_out;
    std::vector<uint8_t> stored;
    std::vector<float> dx_in;
  };
  Out run(ModelSlabs& grads, int64_t layer, const std::vector<bf16_t>& x_in, const std::vector<float>& dx_out) const {
    const size_t n = static_cast<size_t>(blk.shape.N() * blk.shape.C);
    Out o{std::vector<bf16_t>(n), std::vector<uint8_t>(block_stored_bytes(blk.shape)), std::vector<float>(n)};
    sim::block_forward(GemmContext{}, nullptr, blk, o.x_out.data(), o.stored.data(), x_in.data());
    BlockGrads g = BlockGrads::bind(grads.layout(SlabKind::layer, layer), grads.layer(layer));
    sim::block_backward(GemmContext{}, nullptr, blk, o.dx_in.data(), g, dx_out.data(), x_in.data(), o.stored.data());
    return o;
  }
};

struct Case {
  ModelType type;
  ComputeType compute;
  bool packed;
};

TEST(CudaSimBlock, MatchesTheCpuBlockAtBf16Storage) {
  const Case cases[] = {{ModelType::qwen2, ComputeType::bf16, false},
                        {ModelType::qwen3, ComputeType::bf16, true},
                        {ModelType::llama, ComputeType::f32, false},
                        {ModelType::qwen3, ComputeType::f32, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(model_type_name(c.type)) + (c.compute == ComputeType::bf16 ? " bf16" : " f32") + " GEMMs" +
                 (c.packed ? ", packed" : ""));
    const ModelConfig cfg = lt::testing::small_model_config(c.type);
    const int64_t B = 2, T = 13, N = B * T, C = cfg.hidden_size;
    const BlockShape sh = BlockShape::make(cfg, B, T, DType::bf16);
    const ModelSlabs params = lt::testing::random_model_params(cfg, 3);
    ModelSlabs bf16_copy(cfg, DType::bf16);
    if (c.compute == ComputeType::bf16) make_compute_copy(bf16_copy, params);
    const ModelSlabs& weights = c.compute == ComputeType::bf16 ? bf16_copy : params;
    const BlockView w = BlockView::bind(weights.layout(SlabKind::layer), weights.layer(0));
    std::vector<int32_t> pos(static_cast<size_t>(N)), docs(static_cast<size_t>(N));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const bool second = c.packed && t >= 5;  // a second document from token 5: positions restart
        pos[size_t(b * T + t)] = int32_t(second ? t - 5 : t);
        docs[size_t(b * T + t)] = second ? 1 : 0;
      }
    const TokenInfo ti{pos.data(), c.packed ? docs.data() : nullptr};
    const auto x_in = to_bf16(random_floats(static_cast<size_t>(N * C), 4));
    const auto dx_out = random_floats(static_cast<size_t>(N * C), 5, -0.1f, 0.1f);

    // The CPU block, internals kept (Saved::stored).
    const CpuRun cpu = run_cpu_block(cfg, sh, w, ti, x_in, dx_out);
    const std::vector<uint8_t>& stored_cpu = cpu.stored;
    const std::vector<bf16_t>& x_out_cpu = cpu.x_out;
    const std::vector<float>& dx_in_cpu = cpu.dx_in;
    const ModelSlabs& grads_cpu = cpu.grads;
    // The CUDA block under cuda-sim.
    const SimBlock gpu(sh, w, ti);
    std::vector<std::vector<float>> first;
    testing::for_each_order([&] {
      ModelSlabs grads(cfg);
      const auto [x_out, stored, dx_in] = gpu.run(grads, 0, x_in, dx_out);

      const StoredOffsets o = block_stored_offsets(sh);
      EXPECT_BITWISE_EQ(floats_at(stored, o.n1, N * C, true), floats_at(stored_cpu, o.n1, N * C, true));
      EXPECT_BITWISE_EQ(floats_at(stored, o.rstd1, N, false), floats_at(stored_cpu, o.rstd1, N, false));
      EXPECT_LT(rel_l2(to_f32(x_out), to_f32(x_out_cpu)), kTol);
      const std::pair<int64_t, int64_t> acts[] = {{o.q, sh.QD()},   {o.k, sh.KVD()}, {o.v, sh.KVD()},
                                                  {o.att, sh.QD()}, {o.x_mid, C},    {o.n2, C},
                                                  {o.gate, sh.I},   {o.up, sh.I},    {o.h, sh.I}};
      for (const auto& [offset, width] : acts)
        EXPECT_LT(rel_l2(floats_at(stored, offset, N * width, true), floats_at(stored_cpu, offset, N * width, true)),
                  kTol)
            << "stored activation at byte " << offset;
      EXPECT_LT(rel_l2(dx_in, dx_in_cpu), kTol);
      const auto ours = grads.named_tensors(), theirs = grads_cpu.named_tensors();
      ASSERT_EQ(ours.size(), theirs.size());
      for (size_t i = 0; i < ours.size(); ++i) {
        if (ours[i].hf_name.find("layers.0.") == std::string::npos) continue;
        const TensorView &a = ours[i].view, &b = theirs[i].view;
        const std::vector<float> got(a.ptr<float>(), a.ptr<float>() + a.numel());
        const std::vector<float> want(b.ptr<float>(), b.ptr<float>() + b.numel());
        EXPECT_LT(rel_l2(got, want), kTol) << ours[i].hf_name;
      }
      const std::vector<float> now_out = to_f32(x_out);
      if (first.empty()) first = {now_out, dx_in};
      EXPECT_BITWISE_EQ(now_out, first[0]);
      EXPECT_BITWISE_EQ(dx_in, first[1]);
    });
  }
}

// LoRA adapters (cuda/layers/lora.inl) on every linear of a layer — Qwen2 (biases), Qwen3 (q/k norms), Llama and
// both Qwen3.5 kinds (gated attention's o_proj on its f32 input, the Gated DeltaNet projections), Qwen3-MoE and
// Qwen3.5-MoE sparse layers (the router, each routed expert on its grouped rows with its own masks on its tokens'
// rows, the shared expert and its gate; a down projection's adapter in the routing weights' gradient) — with and without
// dropout (the CPU block's mask), rsLoRA's scale, bf16 and f32 GEMMs: the output, dx_in and the adapters' gradients
// against the CPU block to kTol, frozen matrices and vectors given no gradient; the same bits in every thread order
// (on Qwen3 with dropout: the mask kernels and an attention layer; the adapters add only GEMMs and elementwise
// kernels, and the other CudaSimBlock tests run every layer kind's kernels in every order).
TEST(CudaSimBlock, LoraAdaptersMatchTheCpuBlock) {
  struct LoraCase {
    ModelType type;
    ComputeType compute;
    double dropout;
    bool rslora;
    bool every_order;
    bool moe = false;  // sparse layers: the router, the routed experts (and the shared expert and its gate)
  };
  const LoraCase cases[] = {{ModelType::qwen2, ComputeType::bf16, 0.0, false, false},
                            {ModelType::qwen3, ComputeType::bf16, 0.3, true, true},
                            {ModelType::llama, ComputeType::f32, 0.3, false, false},
                            {ModelType::qwen3_5, ComputeType::bf16, 0.0, true, false},
                            {ModelType::qwen3_5, ComputeType::f32, 0.2, false, false},
                            {ModelType::qwen3_moe, ComputeType::bf16, 0.2, false, false, true},
                            {ModelType::qwen3_5, ComputeType::f32, 0.3, true, false, true},
                            {ModelType::qwen3_5, ComputeType::bf16, 0.1, false, false, true}};
  double worst = 0;
  for (const LoraCase& c : cases) {
    Rng rng(uint64_t(c.type) * 31 + uint64_t(c.compute) + (c.moe ? 7 : 0));
    ModelConfig cfg = c.moe ? (c.type == ModelType::qwen3_5 ? lt::testing::random_hybrid_moe_config(rng)
                                                            : lt::testing::random_moe_config(rng))
                    : c.type == ModelType::qwen3_5 ? lt::testing::random_hybrid_config(rng)
                                                   : lt::testing::small_model_config(c.type);
    cfg.finetune = std::make_shared<const Finetune>(make_lora(cfg, 3, 5.0, c.dropout, c.rslora, {"all"}, {}));
    const int64_t B = 2, T = 11, N = B * T, C = cfg.hidden_size;
    const ModelSlabs params = lt::testing::random_model_params(cfg, 7);  // B random too: the adapters count
    ModelSlabs bf16_copy(cfg, DType::bf16);
    if (c.compute == ComputeType::bf16) make_compute_copy(bf16_copy, params);
    const ModelSlabs& weights = c.compute == ComputeType::bf16 ? bf16_copy : params;
    std::vector<int32_t> pos(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i % T);
    TokenInfo ti{pos.data(), nullptr};
    ti.dropout_key = 0x5eedull + uint64_t(c.type);
    const auto x_in = to_bf16(random_floats(static_cast<size_t>(N * C), 4));
    const auto dx_out = random_floats(static_cast<size_t>(N * C), 5, -0.1f, 0.1f);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      const BlockShape sh = BlockShape::make(cfg, B, T, DType::bf16).for_layer(cfg, l);
      SCOPED_TRACE(std::string(model_type_name(c.type)) + " layer " + std::to_string(l) +
                   (sh.linear() ? " (Gated DeltaNet)" : "") + (c.compute == ComputeType::bf16 ? " bf16" : " f32") +
                   " GEMMs, dropout " + std::to_string(c.dropout));
      ASSERT_EQ(sh.lora.rank, 3);
      BlockView w = BlockView::bind(weights.layout(SlabKind::layer, l), weights.layer(l));
      w.layer = l;
      // The CPU block, internals kept, into the trained gradients (the adapters alone); then the CUDA block's.
      const CpuRun cpu = run_cpu_block(cfg, sh, w, ti, x_in, dx_out, l);
      const SimBlock gpu(sh, w, ti);
      std::vector<std::vector<float>> first;
      const auto orders = [&](const std::function<void()>& check) {
        if (c.every_order) testing::for_each_order(check);
        else check();
      };
      orders([&] {
        ModelSlabs grads(cfg, DType::f32, Fill::zero, SlabSet::trained);
        const auto [x_out, stored, dx_in] = gpu.run(grads, l, x_in, dx_out);
        const double out_err = rel_l2(to_f32(x_out), to_f32(cpu.x_out)), dx_err = rel_l2(dx_in, cpu.dx_in);
        EXPECT_LT(out_err, kTol);
        EXPECT_LT(dx_err, kTol);
        worst = std::max({worst, out_err, dx_err});
        const auto ours = grads.named_tensors(), theirs = cpu.grads.named_tensors();
        ASSERT_EQ(ours.size(), theirs.size());
        size_t adapters = 0;
        for (size_t i = 0; i < ours.size(); ++i) {
          if (ours[i].hf_name.find("layers." + std::to_string(l) + ".") == std::string::npos) continue;
          EXPECT_NE(ours[i].hf_name.find(".lora_"), std::string::npos) << ours[i].hf_name;
          const TensorView &a = ours[i].view, &b = theirs[i].view;
          const std::vector<float> got(a.ptr<float>(), a.ptr<float>() + a.numel());
          const std::vector<float> want(b.ptr<float>(), b.ptr<float>() + b.numel());
          const double err = rel_l2(got, want);
          EXPECT_LT(err, kTol) << ours[i].hf_name;
          worst = std::max(worst, err);
          ++adapters;
        }
        EXPECT_EQ(adapters, 2 * adaptable_linears(cfg, l).size());  // A and B of each linear
        const std::vector<float> now_out = to_f32(x_out);
        if (first.empty()) first = {now_out, dx_in};
        EXPECT_BITWISE_EQ(now_out, first[0]);
        EXPECT_BITWISE_EQ(dx_in, first[1]);
      });
    }
  }
  std::printf("LoRA layers: CUDA block vs CPU block, worst relative L2 %.2e\n", worst);
}

TEST(CudaSimBlock, ARecomputedLayerGivesTheKeptLayersBits) {
  // Kept: forward into the stored internals, backward from them. Recomputed: the forward writes only the attention
  // half and n2 (block_recompute_stored_bytes: its MLP's internals through the chunk scratch), the backward
  // recomputes that half into a fresh buffer and the MLP's internals chunk by chunk. Every layer kind: Qwen2
  // (biases), Qwen3 (q/k norms), a Qwen3.5 hybrid's Gated DeltaNet and gated-attention layers.
  struct Layer {
    ModelConfig cfg;
    int64_t layer;
  };
  std::vector<Layer> layers = {{lt::testing::small_model_config(ModelType::qwen2), 0},
                               {lt::testing::small_model_config(ModelType::qwen3), 0}};
  Rng rng(17);
  const ModelConfig hybrid = lt::testing::random_hybrid_config(rng);
  for (const LayerKind kind : {LayerKind::linear_attention, LayerKind::full_attention})
    layers.push_back({hybrid, int64_t(std::find(hybrid.layer_types.begin(), hybrid.layer_types.end(), kind) -
                                      hybrid.layer_types.begin())});
  constexpr uint8_t kGuard = 0xA5;  // the bytes past the recomputed layer's buffer, which nothing may write
  constexpr size_t kGuardBytes = 4096;
  for (const Layer& c : layers) {
    const ModelConfig& cfg = c.cfg;
    SCOPED_TRACE(std::string(model_type_name(cfg.type)) + " layer " + std::to_string(c.layer));
    const int64_t B = 2, T = 11, N = B * T, C = cfg.hidden_size;
    const BlockShape sh = BlockShape::make(cfg, B, T, DType::bf16).for_layer(cfg, c.layer);
    const ModelSlabs params = lt::testing::random_model_params(cfg, 13);
    ModelSlabs weights(cfg, DType::bf16);
    make_compute_copy(weights, params);
    const BlockView w = BlockView::bind(weights.layout(SlabKind::layer, c.layer), weights.layer(c.layer));
    std::vector<int32_t> pos(static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) pos[size_t(t)] = int32_t(t % T);
    const TokenInfo ti{pos.data(), nullptr};
    const auto x_in = to_bf16(random_floats(static_cast<size_t>(N * C), 14));
    const auto dx_out = random_floats(static_cast<size_t>(N * C), 15, -0.1f, 0.1f);
    std::vector<float> cos(static_cast<size_t>(T * sh.rotary / 2)), sin(cos.size());
    rope_table(cos.data(), sin.data(), T, sh.rotary, sh.rope);
    std::vector<uint8_t> scratch(cuda_block_scratch_bytes(sh));
    const CudaBlock blk{sh, w, ti, cos.data(), sin.data(), scratch.data()};
    // The kept layer through block_backward, the recomputed one through the executor's two halves.
    auto backward = [&](const std::vector<uint8_t>& stored, Saved saved) {
      ModelSlabs grads(cfg);
      BlockGrads g = BlockGrads::bind(grads.layout(SlabKind::layer, c.layer), grads.layer(c.layer));
      std::vector<float> dx_in(static_cast<size_t>(N * C));
      if (saved == Saved::stored) {
        sim::block_backward(GemmContext{}, nullptr, blk, dx_in.data(), g, dx_out.data(), x_in.data(), stored.data(),
                            saved);
      } else {
        sim::block_backward_mlp(GemmContext{}, nullptr, blk, g, dx_out.data(), stored.data(), saved);
        sim::block_backward_attention(GemmContext{}, nullptr, blk, dx_in.data(), g, x_in.data(), stored.data());
      }
      const uint8_t* layer = grads.layer(c.layer);
      std::vector<float> all(reinterpret_cast<const float*>(layer),
                             reinterpret_cast<const float*>(layer + grads.layout(SlabKind::layer, c.layer).bytes()));
      all.insert(all.end(), dx_in.begin(), dx_in.end());
      return all;
    };
    const size_t half = block_recompute_stored_bytes(sh);
    ASSERT_LT(half, block_stored_bytes(sh));  // the MLP's gate, up and h are not in it
    std::vector<uint8_t> kept(block_stored_bytes(sh)), forward(half + kGuardBytes, kGuard), recomputed(half);
    std::fill(forward.begin(), forward.begin() + std::ptrdiff_t(half), 0);  // as kept's alignment padding
    std::vector<bf16_t> x_out(static_cast<size_t>(N * C)), x_out_recompute(x_out.size());
    sim::block_forward(GemmContext{}, nullptr, blk, x_out.data(), kept.data(), x_in.data());
    sim::block_forward(GemmContext{}, nullptr, blk, x_out_recompute.data(), forward.data(), x_in.data(),
                       Saved::recompute);
    EXPECT_BITWISE_EQ(to_f32(x_out_recompute), to_f32(x_out));
    EXPECT_TRUE(std::equal(forward.begin(), forward.begin() + std::ptrdiff_t(half), kept.begin()))
        << "the attention half a recomputed layer's forward writes differs from the kept layer's";
    EXPECT_TRUE(std::all_of(forward.begin() + std::ptrdiff_t(half), forward.end(), [](uint8_t b) { return b == kGuard; }))
        << "a recomputed layer's forward wrote past block_recompute_stored_bytes";
    sim::block_recompute_internals(GemmContext{}, nullptr, blk, recomputed.data(), x_in.data());
    EXPECT_BITWISE_EQ(backward(recomputed, Saved::recompute), backward(kept, Saved::stored));
  }
}

TEST(CudaSimBlock, MlpTokenChunksGiveTheSameBitsAsOneChunk) {
  // 4133 tokens: a 4096-token chunk and a 37-token one (chunks are multiples of kTokenSlice), against the
  // whole MLP at once — bit for bit, as the CPU block promises — and against the CPU block's chunks.
  lt::testing::SmallShape shape;
  shape.heads = 2, shape.kv_heads = 1, shape.hidden = 16, shape.intermediate = 24, shape.max_positions = 8192;
  const ModelConfig cfg = lt::testing::small_model_config(ModelType::qwen3, shape);
  const int64_t B = 1, T = kTokenSlice + 37, N = B * T, C = cfg.hidden_size;
  const ModelSlabs params = lt::testing::random_model_params(cfg, 7);
  ModelSlabs weights(cfg, DType::bf16);
  make_compute_copy(weights, params);
  const BlockView w = BlockView::bind(weights.layout(SlabKind::layer), weights.layer(0));
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) pos[size_t(t)] = int32_t(t);
  const TokenInfo ti{pos.data(), nullptr};
  const auto x_in = to_bf16(random_floats(static_cast<size_t>(N * C), 8));
  const auto dx_out = random_floats(static_cast<size_t>(N * C), 9, -0.1f, 0.1f);
  const BlockShape whole = BlockShape::make(cfg, B, T, DType::bf16),
                   chunked = BlockShape::make(cfg, B, T, DType::bf16, kTokenSlice);
  ASSERT_EQ(chunked.mlp_rows(), kTokenSlice);
  std::vector<float> cos(static_cast<size_t>(T * whole.D / 2)), sin(cos.size());
  rope_table(cos.data(), sin.data(), T, whole.D, whole.rope);
  struct Result {
    std::vector<bf16_t> x_out;
    std::vector<uint8_t> stored;
    std::vector<float> dx_in, grads;
  };
  auto run_gpu = [&](const BlockShape& sh) {
    std::vector<uint8_t> scratch(cuda_block_scratch_bytes(sh));
    const CudaBlock blk{sh, w, ti, cos.data(), sin.data(), scratch.data()};
    Result r{std::vector<bf16_t>(static_cast<size_t>(N * C)),
             std::vector<uint8_t>(block_stored_bytes(sh)),
             std::vector<float>(static_cast<size_t>(N * C)),
             {}};
    sim::block_forward(GemmContext{}, nullptr, blk, r.x_out.data(), r.stored.data(), x_in.data());
    ModelSlabs grads(cfg);
    BlockGrads g = BlockGrads::bind(grads.layout(SlabKind::layer), grads.layer(0));
    sim::block_backward(GemmContext{}, nullptr, blk, r.dx_in.data(), g, dx_out.data(), x_in.data(), r.stored.data());
    const uint8_t* layer = grads.layer(0);
    const size_t bytes = grads.layout(SlabKind::layer).bytes();
    r.grads.assign(reinterpret_cast<const float*>(layer), reinterpret_cast<const float*>(layer + bytes));
    return r;
  };
  const Result one = run_gpu(whole), two = run_gpu(chunked);
  EXPECT_LT(cuda_block_scratch_bytes(chunked), cuda_block_scratch_bytes(whole));
  EXPECT_BITWISE_EQ(two.x_out, one.x_out);
  EXPECT_BITWISE_EQ(two.stored, one.stored);
  EXPECT_BITWISE_EQ(two.dx_in, one.dx_in);
  EXPECT_BITWISE_EQ(two.grads, one.grads);
  // The CPU block with the same chunks.
  const CpuRun cpu = run_cpu_block(cfg, chunked, w, ti, x_in, dx_out);
  EXPECT_LT(rel_l2(to_f32(two.x_out), to_f32(cpu.x_out)), kTol);
  EXPECT_LT(rel_l2(two.dx_in, cpu.dx_in), kTol);
}

// Sparse layers (cuda/layers/moe.inl): a Qwen3-MoE layer (top-k renormalised or not), a Qwen3.5-MoE one (a shared
// expert; a Gated DeltaNet or attention mixer) and a GPT-OSS one (a sliding window, sinks, YaRN, the biased router,
// biased experts and the clamped SwiGLU), bf16 and f32 GEMMs, with the load-balancing loss on rows
// whose mask leaves some tokens out: against the CPU block to kTol (the routing is the same: n2 agrees bit for bit
// but where a rounding falls the other way, and the test's margins keep every choice), the aux loss's value too;
// the same bits in every thread order; a recomputed sparse layer gives the kept layer's bits.
enum class SparseKind { qwen3_moe, qwen3_5_moe, gpt_oss };
struct SparseCase {
  SparseKind kind;
  ComputeType compute;
  uint64_t seed;
};

struct SparseRun {
  std::vector<bf16_t> x_out;
  std::vector<uint8_t> stored;
  std::vector<float> dx_in, grads;
  std::vector<std::pair<std::string, std::vector<float>>> named;  // the layer's gradients by HF name
  double aux = 0;
};

TEST(CudaSimBlock, SparseLayersMatchTheCpuBlockAndRecomputeTheirBits) {
  const SparseCase cases[] = {{SparseKind::qwen3_moe, ComputeType::bf16, 3}, {SparseKind::qwen3_5_moe, ComputeType::f32, 6},
                              {SparseKind::gpt_oss, ComputeType::bf16, 7}, {SparseKind::gpt_oss, ComputeType::f32, 8}};
  for (const SparseCase& c : cases) {
    const char* kinds[] = {"qwen3_moe", "qwen3_5_moe", "gpt_oss"};
    SCOPED_TRACE(std::string(kinds[int(c.kind)]) + (c.compute == ComputeType::bf16 ? " bf16" : " f32") +
                 " GEMMs, seed " + std::to_string(c.seed));
    Rng rng(c.seed * 7919);
    ModelConfig cfg = c.kind == SparseKind::qwen3_5_moe ? lt::testing::random_hybrid_moe_config(rng)
                      : c.kind == SparseKind::gpt_oss   ? lt::testing::random_gpt_oss_config(rng)
                                                        : lt::testing::random_moe_config(rng);
    cfg.mlp_only_layers.clear();
    if (c.kind == SparseKind::gpt_oss) {  // the tested layer slides (window 4 over T = 9), its sinks on
      cfg.sliding_window = 4;
      cfg.layer_types.back() = LayerKind::sliding_attention;
    }
    const int64_t layer = cfg.num_layers - 1, B = 2, T = 9, N = B * T, C = cfg.hidden_size;
    ASSERT_TRUE(cfg.sparse_layer(layer));
    const BlockShape sh = BlockShape::make(cfg, B, T, DType::bf16).for_layer(cfg, layer);
    const ModelSlabs params = lt::testing::random_model_params(cfg, c.seed);
    ModelSlabs bf16_copy(cfg, DType::bf16);
    if (c.compute == ComputeType::bf16) make_compute_copy(bf16_copy, params);
    const ModelSlabs& weights = c.compute == ComputeType::bf16 ? bf16_copy : params;
    const BlockView w = BlockView::bind(weights.layout(SlabKind::layer, layer), weights.layer(layer));
    ASSERT_TRUE(w.sparse());
    std::vector<int32_t> pos(static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) pos[size_t(t)] = int32_t(t % T);
    std::vector<uint8_t> counted(static_cast<size_t>(N), 1);
    for (int64_t t = T - 3; t < T; ++t) counted[size_t(t)] = 0;  // the first row's last 3 tokens are padding
    const auto x_in = to_bf16(random_floats(static_cast<size_t>(N * C), c.seed + 10));
    const auto dx_out = random_floats(static_cast<size_t>(N * C), c.seed + 20, -0.1f, 0.1f);
    constexpr double kAuxWeight = 0.75;

    MoeAuxLoss cpu_aux(cfg.num_experts, counted.data(), kAuxWeight);
    const CpuRun cpu = run_cpu_block(cfg, sh, w, TokenInfo{pos.data(), nullptr, &cpu_aux}, x_in, dx_out, layer);
    ASSERT_GT(cpu_aux.value(), 0.0);

    std::vector<float> cos(static_cast<size_t>(T * sh.rotary / 2)), sin(cos.size());
    rope_table(cos.data(), sin.data(), T, sh.rotary, sh.rope);
    std::vector<uint8_t> scratch(cuda_block_scratch_bytes(BlockShape::make(cfg, B, T, DType::bf16)));
    auto run_gpu = [&](Saved saved) {
      MoeAuxLoss aux(cfg.num_experts, counted.data(), kAuxWeight);
      const CudaBlock blk{sh, w, TokenInfo{pos.data(), nullptr, &aux}, cos.data(), sin.data(), scratch.data()};
      CudaBlock no_aux = blk;
      no_aux.tok.moe_aux = nullptr;
      SparseRun r{std::vector<bf16_t>(static_cast<size_t>(N * C)), std::vector<uint8_t>(block_stored_bytes(sh)),
                  std::vector<float>(static_cast<size_t>(N * C)), {}, {}};
      sim::block_forward(GemmContext{}, nullptr, blk, r.x_out.data(), r.stored.data(), x_in.data());
      r.aux = aux.finish();
      ModelSlabs grads(cfg);
      BlockGrads g = BlockGrads::bind(grads.layout(SlabKind::layer, layer), grads.layer(layer));
      if (saved == Saved::recompute) {  // the executor's path: a recompute (no aux), then the halves
        std::vector<uint8_t> again(block_recompute_stored_bytes(sh));  // no room for the route slices' internals
        std::vector<bf16_t> x_out(r.x_out.size());
        sim::block_forward(GemmContext{}, nullptr, no_aux, x_out.data(), again.data(), x_in.data(), Saved::recompute);
        EXPECT_BITWISE_EQ(to_f32(x_out), to_f32(r.x_out));
        sim::block_recompute_internals(GemmContext{}, nullptr, blk, again.data(), x_in.data());
        sim::block_backward_mlp(GemmContext{}, nullptr, blk, g, dx_out.data(), again.data(), saved);
        sim::block_backward_attention(GemmContext{}, nullptr, blk, r.dx_in.data(), g, x_in.data(), again.data());
      } else {
        sim::block_backward(GemmContext{}, nullptr, blk, r.dx_in.data(), g, dx_out.data(), x_in.data(),
                            r.stored.data());
      }
      const uint8_t* bytes = grads.layer(layer);
      r.grads.assign(reinterpret_cast<const float*>(bytes),
                     reinterpret_cast<const float*>(bytes + grads.layout(SlabKind::layer, layer).bytes()));
      for (const auto& t : grads.named_tensors())
        if (t.hf_name.find("layers." + std::to_string(layer) + ".") != std::string::npos)
          r.named.emplace_back(t.hf_name, std::vector<float>(t.view.ptr<float>(), t.view.ptr<float>() + t.view.numel()));
      return r;
    };

    std::vector<SparseRun> first;
    testing::for_each_order([&] {
      const SparseRun r = run_gpu(Saved::stored);
      EXPECT_NEAR(r.aux, cpu_aux.value(), 1e-6 * cpu_aux.value());
      EXPECT_LT(rel_l2(to_f32(r.x_out), to_f32(cpu.x_out)), kTol);
      const StoredOffsets o = block_stored_offsets(sh);
      const int64_t width = N * sh.mlp_width();
      for (const int64_t offset : {o.gate, o.up, o.h})
        EXPECT_LT(rel_l2(floats_at(r.stored, offset, width, true), floats_at(cpu.stored, offset, width, true)), kTol)
            << "stored activation at byte " << offset;
      EXPECT_LT(rel_l2(r.dx_in, cpu.dx_in), kTol);
      std::map<std::string, std::vector<float>> theirs;
      for (const auto& t : cpu.grads.named_tensors())
        theirs[t.hf_name] = std::vector<float>(t.view.ptr<float>(), t.view.ptr<float>() + t.view.numel());
      ASSERT_FALSE(r.named.empty());
      for (const auto& [name, got] : r.named) {
        const std::vector<float>& want = theirs.at(name);
        auto zero = [](const std::vector<float>& v) { return std::all_of(v.begin(), v.end(), [](float x) { return x == 0; }); };
        if (zero(want)) {  // an expert no token chose
          EXPECT_TRUE(zero(got)) << name;
          continue;
        }
        EXPECT_LT(rel_l2(got, want), kTol) << name;
      }
      if (first.empty()) first.push_back(r);
      EXPECT_BITWISE_EQ(to_f32(r.x_out), to_f32(first[0].x_out));
      EXPECT_BITWISE_EQ(r.dx_in, first[0].dx_in);
      EXPECT_BITWISE_EQ(r.grads, first[0].grads);
      EXPECT_EQ(r.aux, first[0].aux);
    });
    const SparseRun recomputed = run_gpu(Saved::recompute);
    EXPECT_BITWISE_EQ(recomputed.dx_in, first[0].dx_in);
    EXPECT_BITWISE_EQ(recomputed.grads, first[0].grads);
    EXPECT_EQ(recomputed.aux, first[0].aux);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace lt::cuda
