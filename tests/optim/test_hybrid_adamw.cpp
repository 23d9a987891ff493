// The whole-model optimizer: which tensors get 8-bit states, the state report, per-slab updates in any order
// and from several threads at once giving the bits of one sequential step, the bf16 compute copy written in
// the same pass, independence from the thread count, and checkpoint save/load (exact round trip, refusals).
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "io/json_file.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim_testing.h"
#include "testing/files_testing.h"

namespace lt {
namespace {

struct Model {
  ModelConfig cfg = testing::tiny_model_config();
  ModelSlabs params{cfg, DType::f32}, grads{cfg, DType::f32};
  explicit Model(uint64_t seed = 1) { init_random(params, seed, 0.5f); }
};

std::vector<uint8_t> slab_bytes(const ModelSlabs& s) {
  std::vector<uint8_t> out;
  auto add = [&](SlabKind kind, int64_t layer) {
    const uint8_t* p = s.slab(kind, layer);
    out.insert(out.end(), p, p + s.layout(kind).bytes());
  };
  add(SlabKind::embedding, 0);
  for (int64_t i = 0; i < s.num_layers(); ++i) add(SlabKind::layer, i);
  add(SlabKind::head, 0);
  return out;
}

std::vector<uint8_t> state_bytes(HybridAdamW& opt, int64_t layers) {
  std::vector<uint8_t> out;
  NamedTensors state;
  opt.slab_state(SlabKind::embedding).collect_state(state);
  for (int64_t i = 0; i < layers; ++i) opt.slab_state(SlabKind::layer, i).collect_state(state);
  opt.slab_state(SlabKind::head).collect_state(state);
  for (const auto& [name, view] : state) {
    const uint8_t* p = static_cast<const uint8_t*>(view.data);
    out.insert(out.end(), p, p + view.bytes());
  }
  return out;
}

GradNormPartials partials_of(const ModelSlabs& grads) {
  GradNormPartials p(grads.num_layers());
  auto set = [&](SlabKind kind, int64_t layer) {
    double s = 0;
    for (const SlabEntry& e : grads.layout(kind).entries())
      s += testing::dot_self(reinterpret_cast<const float*>(grads.slab(kind, layer) + e.offset), e.numel());
    p.set(kind, layer, s);
  };
  set(SlabKind::embedding, 0);
  for (int64_t i = 0; i < grads.num_layers(); ++i) set(SlabKind::layer, i);
  set(SlabKind::head, 0);
  return p;
}

TEST(HybridAdamW, WhichTensorsGet8BitStates) {
  Model m;
  HybridAdamW opt(m.params, m.grads, AdamWConfig{});
  auto precision = [&](SlabKind kind, int64_t layer, const std::string& suffix) {
    for (const OptimTensor& t : opt.slab_state(kind, layer).tensors())
      if (t.name.ends_with(suffix)) return t.precision;
    ADD_FAILURE() << "no tensor " << suffix;
    return StatePrecision::f32;
  };
  for (const char* q8 : {"q_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    EXPECT_EQ(precision(SlabKind::layer, 1, q8), StatePrecision::q8) << q8;
  for (const char* f32 : {"k_proj.weight", "v_proj.weight", "q_proj.bias", "input_layernorm.weight"})
    EXPECT_EQ(precision(SlabKind::layer, 1, f32), StatePrecision::f32) << f32;  // k, v: 2048 < 4096 elements
  EXPECT_EQ(precision(SlabKind::embedding, 0, "embed_tokens.weight"), StatePrecision::f32);
  EXPECT_EQ(precision(SlabKind::head, 0, "lm_head.weight"), StatePrecision::q8);
  EXPECT_EQ(precision(SlabKind::head, 0, "norm.weight"), StatePrecision::f32);

  // Rules: first match wins, before the size default.
  AdamWConfig cfg;
  cfg.rules = {{"model.layers.0.*", StatePrecision::f32},
               {"*.k_proj.weight", StatePrecision::q8},
               {"model.embed_tokens.weight", StatePrecision::q8}};
  HybridAdamW ruled(m.params, m.grads, cfg);
  for (const OptimTensor& t : ruled.slab_state(SlabKind::layer, 0).tensors())
    EXPECT_EQ(t.precision, StatePrecision::f32) << t.name;
  for (const OptimTensor& t : ruled.slab_state(SlabKind::layer, 2).tensors())
    if (t.name.ends_with("k_proj.weight")) {
      EXPECT_EQ(t.precision, StatePrecision::q8);
    }
  EXPECT_EQ(ruled.slab_state(SlabKind::embedding).tensors()[0].precision, StatePrecision::q8);

  EXPECT_TRUE(glob_match("model.layers.*.mlp.*", "model.layers.12.mlp.up_proj.weight"));
  EXPECT_TRUE(glob_match("*norm*", "model.layers.0.input_layernorm.weight"));
  EXPECT_TRUE(glob_match("model.layers.?.self_attn.q_proj.*", "model.layers.3.self_attn.q_proj.bias"));
  EXPECT_FALSE(glob_match("model.layers.?.self_attn.*", "model.layers.13.self_attn.q_proj.bias"));
  EXPECT_FALSE(glob_match("*.bias", "model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE(glob_match("*", ""));
}

TEST(HybridAdamW, StateReport) {
  Model m;
  HybridAdamW opt(m.params, m.grads, AdamWConfig{});
  const StateReport r = opt.state_report();
  EXPECT_EQ(r.parameters, m.cfg.num_parameters());
  int64_t q8 = 0;
  size_t bytes = 0;
  for (const auto& t : m.params.named_tensors()) {
    const int64_t n = t.view.numel();
    const bool is_q8 = t.view.dim() == 2 && n >= 4096 && t.hf_name != "model.embed_tokens.weight";
    q8 += is_q8 ? n : 0;
    bytes += is_q8 ? size_t(2 * n + 8 * ((n + 255) / 256)) : size_t(8 * n);
  }
  EXPECT_EQ(r.q8_parameters, q8);
  EXPECT_EQ(r.state_bytes, bytes);
  // A large 8-bit matrix alone: 2 + 8/256 bytes per parameter.
  AdamWConfig cfg;
  OptimTensor t;
  t.name = "w";
  t.shape = {1024, 1024};
  t.precision = StatePrecision::q8;
  EXPECT_DOUBLE_EQ(AdamWSlab({t}, cfg).report().bytes_per_parameter(), 2.03125);
  t.precision = StatePrecision::f32;
  EXPECT_DOUBLE_EQ(AdamWSlab({t}, cfg).report().bytes_per_parameter(), 8.0);
}

// Runs `steps` steps of `opt` with seeded gradients; order: slabs updated in `order`'s way.
enum class Order { step_call, reversed, threads };

void run_steps(Model& m, HybridAdamW& opt, int steps, Order order, ModelSlabs* copy = nullptr) {
  for (int s = 0; s < steps; ++s) {
    testing::random_grads(m.grads, uint64_t(100 + s), s == 1 ? 30.0f : 0.1f);  // step 2 clips hard
    const double lr = 1e-3 * (1 + s);
    if (order == Order::step_call) {
      ASSERT_FALSE(opt.step(partials_of(m.grads), lr, copy).skip);
      continue;
    }
    const StepPlan plan = opt.plan_step(partials_of(m.grads).sum_of_squares());
    const StepArgs args{plan.step, lr, plan.clip};
    auto copy_of = [&](SlabKind k, int64_t l) { return copy ? copy->slab(k, l) : nullptr; };
    if (order == Order::reversed) {
      opt.update(SlabKind::head, 0, args, copy_of(SlabKind::head, 0));
      for (int64_t i = m.params.num_layers() - 1; i >= 0; --i) opt.update(SlabKind::layer, i, args, copy_of(SlabKind::layer, i));
      opt.update(SlabKind::embedding, 0, args, copy_of(SlabKind::embedding, 0));
    } else {  // every slab on its own thread at once
      std::vector<std::thread> pool;
      pool.emplace_back([&] { opt.update(SlabKind::head, 0, args, copy_of(SlabKind::head, 0)); });
      pool.emplace_back([&] { opt.update(SlabKind::embedding, 0, args, copy_of(SlabKind::embedding, 0)); });
      for (int64_t i = 0; i < m.params.num_layers(); ++i)
        pool.emplace_back([&, i] { opt.update(SlabKind::layer, i, args, copy_of(SlabKind::layer, i)); });
      for (std::thread& t : pool) t.join();
    }
  }
}

TEST(HybridAdamW, PerSlabUpdatesInAnyOrderOrConcurrentlyGiveTheSameBits) {
  Model a, b, c;
  HybridAdamW oa(a.params, a.grads, AdamWConfig{}), ob(b.params, b.grads, AdamWConfig{}),
      oc(c.params, c.grads, AdamWConfig{});
  ModelSlabs copy(a.cfg, DType::bf16);
  run_steps(a, oa, 3, Order::step_call, &copy);
  run_steps(b, ob, 3, Order::reversed);
  run_steps(c, oc, 3, Order::threads);
  EXPECT_TRUE(slab_bytes(a.params) == slab_bytes(b.params));
  EXPECT_TRUE(slab_bytes(a.params) == slab_bytes(c.params));
  EXPECT_TRUE(state_bytes(oa, 3) == state_bytes(ob, 3));
  EXPECT_TRUE(state_bytes(oa, 3) == state_bytes(oc, 3));
  EXPECT_EQ(oa.steps_done(), 3);
  // The compute copy written in the update pass equals a conversion of the updated master weights.
  ModelSlabs want(a.cfg, DType::bf16);
  make_compute_copy(want, a.params);
  EXPECT_TRUE(slab_bytes(copy) == slab_bytes(want));
}

// The executor's split of the embedding's update (the next batch's rows before its lookup, the rest after): the
// two parts give the whole update's bits — masters, states, compute copy — with f32 states (the default) and with
// 8-bit states in blocks of 48 that straddle the 64-wide rows (a block touching a listed row goes with the rows).
TEST(HybridAdamW, TheEmbeddingsUpdateByRowsThenTheRestIsTheWholeUpdate) {
  for (const bool q8 : {false, true}) {
    AdamWConfig cfg;
    if (q8) {
      cfg.rules = {};
      cfg.block_size = 48;
    }
    Model a, b;
    HybridAdamW oa(a.params, a.grads, cfg), ob(b.params, b.grads, cfg);
    ASSERT_EQ(oa.slab_state(SlabKind::embedding).tensors()[0].precision, q8 ? StatePrecision::q8 : StatePrecision::f32);
    ModelSlabs ca(a.cfg, DType::bf16), cb(b.cfg, DType::bf16);
    const std::vector<std::vector<int32_t>> row_sets = {{0, 1, 2, 40, 41, 96}, {5}, {}, {3, 50, 51, 52, 95}};
    for (int s = 0; s < int(row_sets.size()); ++s) {
      testing::random_grads(a.grads, uint64_t(300 + s), 0.1f);
      testing::random_grads(b.grads, uint64_t(300 + s), 0.1f);
      const StepPlan plan = oa.plan_step(partials_of(a.grads).sum_of_squares());
      ASSERT_EQ(ob.plan_step(partials_of(b.grads).sum_of_squares()).step, plan.step);
      const StepArgs args{plan.step, 1e-3, plan.clip};
      oa.update(SlabKind::embedding, 0, args, ca.slab(SlabKind::embedding));
      const std::vector<int32_t>& rows = row_sets[size_t(s)];
      ob.update_embedding_rows(args, cb.slab(SlabKind::embedding), rows.data(), int64_t(rows.size()), false);
      ob.update_embedding_rows(args, cb.slab(SlabKind::embedding), rows.data(), int64_t(rows.size()), true);
    }
    const size_t bytes = a.params.layout(SlabKind::embedding).bytes();
    EXPECT_EQ(0, std::memcmp(a.params.slab(SlabKind::embedding), b.params.slab(SlabKind::embedding), bytes)) << q8;
    EXPECT_EQ(0, std::memcmp(ca.slab(SlabKind::embedding), cb.slab(SlabKind::embedding),
                             ca.layout(SlabKind::embedding).bytes())) << q8;
    NamedTensors sa, sb;
    oa.slab_state(SlabKind::embedding).collect_state(sa);
    ob.slab_state(SlabKind::embedding).collect_state(sb);
    for (const auto& [name, view] : sa)
      EXPECT_EQ(0, std::memcmp(view.data, sb.at(name).data, view.bytes())) << name;
  }
  // Rows must be ascending and in the table.
  Model m;
  HybridAdamW o(m.params, m.grads, AdamWConfig{});
  const int32_t unordered[] = {4, 2}, outside[] = {97};
  EXPECT_THROW(o.update_embedding_rows(StepArgs{}, nullptr, unordered, 2, false), Error);
  EXPECT_THROW(o.update_embedding_rows(StepArgs{}, nullptr, outside, 1, false), Error);
}

// Data parallel (ZeRO-1): three "ranks" each own a block-aligned third of every tensor (some own nothing of small
// tensors) and keep states for it alone. Each rank's elements of the masters and the compute copy, and its state
// pieces laid side by side, are the whole optimizer's bits; a whole state file loads into the parts.
TEST(HybridAdamW, ShardedOptimizersUpdateTheirElementsAsTheWholeOneDoes) {
  constexpr int kRanks = 3;
  Model whole;
  HybridAdamW ow(whole.params, whole.grads, AdamWConfig{});
  ModelSlabs whole_copy(whole.cfg, DType::bf16);
  run_steps(whole, ow, 3, Order::step_call, &whole_copy);
  testing::TempDir dir;
  ow.save_state(dir.file("whole.safetensors"));

  auto ranges_for = [&](int rank) {  // [L + 2][tensors]: a block-aligned third of each tensor
    HybridAdamW::OwnedRanges owned;
    auto slab = [&](SlabKind kind, int64_t layer) {
      std::vector<std::pair<int64_t, int64_t>> r;
      for (const SlabEntry& e : whole.params.layout(kind, layer).entries()) {
        auto cut = [&](int k) { return k == kRanks ? e.numel() : e.numel() * k / kRanks / 256 * 256; };
        r.push_back({cut(rank), cut(rank + 1)});
      }
      owned.push_back(r);
    };
    slab(SlabKind::embedding, 0);
    for (int64_t l = 0; l < whole.params.num_layers(); ++l) slab(SlabKind::layer, l);
    slab(SlabKind::head, 0);
    return owned;
  };
  std::vector<std::vector<uint8_t>> pieces(ow.state_pieces().size());  // each state tensor's bytes, ranks side by side
  size_t state_total = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    Model m;
    const HybridAdamW::OwnedRanges owned = ranges_for(rank);
    HybridAdamW opt(m.params, m.grads, AdamWConfig{}, &owned);
    ModelSlabs copy(m.cfg, DType::bf16);
    run_steps(m, opt, 3, Order::step_call, &copy);
    state_total += opt.state_report().state_bytes;
    size_t s = 0;
    auto check = [&](SlabKind kind, int64_t layer) {
      const auto& me = owned[s++];
      const auto& fl = m.params.layout(kind, layer).entries();
      const auto& cl = copy.layout(kind, layer).entries();
      for (size_t i = 0; i < fl.size(); ++i) {
        const auto [b, e] = me[i];
        EXPECT_EQ(0, std::memcmp(m.params.slab(kind, layer) + fl[i].offset + b * 4,
                                 whole.params.slab(kind, layer) + fl[i].offset + b * 4, size_t(e - b) * 4))
            << "rank " << rank << ": masters of " << fl[i].name;
        const size_t cs = dtype_size(cl[i].dtype);
        EXPECT_EQ(0, std::memcmp(copy.slab(kind, layer) + cl[i].offset + size_t(b) * cs,
                                 whole_copy.slab(kind, layer) + cl[i].offset + size_t(b) * cs, size_t(e - b) * cs))
            << "rank " << rank << ": compute copy of " << fl[i].name;
      }
    };
    check(SlabKind::embedding, 0);
    for (int64_t l = 0; l < m.params.num_layers(); ++l) check(SlabKind::layer, l);
    check(SlabKind::head, 0);
    const std::vector<StatePiece> mine = opt.state_pieces();
    ASSERT_EQ(mine.size(), pieces.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      ASSERT_EQ(mine[i].offset, pieces[i].size()) << "rank " << rank << ": " << mine[i].name << " is not the next part";
      pieces[i].insert(pieces[i].end(), mine[i].data, mine[i].data + mine[i].bytes);
    }
    // The whole optimizer's file loads into this rank's parts.
    Model fresh;
    HybridAdamW loaded(fresh.params, fresh.grads, AdamWConfig{}, &owned);
    loaded.load_state(dir.file("whole.safetensors"));
    const std::vector<StatePiece> got = loaded.state_pieces();
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(0, std::memcmp(got[i].data, mine[i].data, mine[i].bytes)) << "rank " << rank << ": " << got[i].name;
  }
  NamedTensors full;
  ow.slab_state(SlabKind::embedding).collect_state(full);
  for (int64_t l = 0; l < whole.params.num_layers(); ++l) ow.slab_state(SlabKind::layer, l).collect_state(full);
  ow.slab_state(SlabKind::head).collect_state(full);
  const std::vector<StatePiece> order = ow.state_pieces();
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorView& v = full.at(order[i].name);
    ASSERT_EQ(pieces[i].size(), v.bytes()) << order[i].name;
    EXPECT_EQ(0, std::memcmp(pieces[i].data(), v.data, v.bytes())) << order[i].name;
  }
  EXPECT_EQ(state_total, ow.state_report().state_bytes);  // nothing kept twice: every 8-bit block has one owner
}

TEST(HybridAdamW, BitsDoNotDependOnTheThreadCount) {
  const int saved = num_threads();
  std::vector<std::vector<uint8_t>> results;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Model m;
    HybridAdamW opt(m.params, m.grads, AdamWConfig{});
    run_steps(m, opt, 3, Order::step_call);
    results.push_back(slab_bytes(m.params));
    std::vector<uint8_t> s = state_bytes(opt, 3);
    results.back().insert(results.back().end(), s.begin(), s.end());
  }
  set_num_threads(saved);
  {  // the optimizer's own thread setting
    Model m;
    AdamWConfig cfg;
    cfg.threads = 1;
    HybridAdamW opt(m.params, m.grads, cfg);
    run_steps(m, opt, 3, Order::step_call);
    results.push_back(slab_bytes(m.params));
    std::vector<uint8_t> s = state_bytes(opt, 3);
    results.back().insert(results.back().end(), s.begin(), s.end());
    EXPECT_EQ(num_threads(), saved) << "update() must restore the caller's thread setting";
  }
  EXPECT_TRUE(results[0] == results[1]);
  EXPECT_TRUE(results[0] == results[2]);
}

TEST(HybridAdamW, SaveLoadRoundTripIsExact) {
  testing::TempDir dir;
  const std::string path = dir.file("optimizer.safetensors");
  Model a;
  HybridAdamW oa(a.params, a.grads, AdamWConfig{});
  run_steps(a, oa, 3, Order::step_call);
  oa.plan_step(std::numeric_limits<double>::quiet_NaN());  // a skip, so the count is saved too
  oa.save_state(path);

  Model b;
  HybridAdamW ob(b.params, b.grads, AdamWConfig{});
  ob.load_state(path);
  EXPECT_EQ(ob.steps_done(), 3);
  EXPECT_EQ(ob.consecutive_skips(), 1);
  EXPECT_TRUE(state_bytes(oa, 3) == state_bytes(ob, 3));
  // The next step from the restored state (parameters travel in the model checkpoint): same bits.
  for (int64_t i = 0; i < a.params.num_layers(); ++i)
    std::memcpy(b.params.layer(i), a.params.layer(i), a.params.layout(SlabKind::layer).bytes());
  std::memcpy(b.params.slab(SlabKind::embedding), a.params.slab(SlabKind::embedding),
              a.params.layout(SlabKind::embedding).bytes());
  std::memcpy(b.params.slab(SlabKind::head), a.params.slab(SlabKind::head), a.params.layout(SlabKind::head).bytes());
  testing::random_grads(a.grads, 7);
  testing::random_grads(b.grads, 7);
  oa.step(partials_of(a.grads), 1e-3);
  ob.step(partials_of(b.grads), 1e-3);
  EXPECT_TRUE(slab_bytes(a.params) == slab_bytes(b.params));
  EXPECT_TRUE(state_bytes(oa, 3) == state_bytes(ob, 3));

  // Refusals: another block size, another precision for a tensor, a file that is not an optimizer state.
  Model c;
  AdamWConfig other_block;
  other_block.block_size = 128;
  HybridAdamW oc(c.params, c.grads, other_block);
  EXPECT_THROW(oc.load_state(path), Error);
  AdamWConfig other_rules;
  other_rules.rules.push_back({"*.mlp.up_proj.weight", StatePrecision::f32});  // after the embedding rule
  HybridAdamW od(c.params, c.grads, other_rules);
  try {
    od.load_state(path);
    FAIL() << "loading 8-bit states into an f32 configuration must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.up_proj.weight"), std::string::npos) << e.what();
  }
  save_safetensors(c.params, dir.file("model.safetensors"), DType::f32);
  EXPECT_THROW(oc.load_state(dir.file("model.safetensors")), Error);

  // A damaged counter in the metadata (the same length, so the header still parses): an lt::Error naming it.
  std::string bytes = read_file(path);
  const size_t at = bytes.find("\"step\":\"3\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 8] = 'x';
  write_file_atomic(dir.file("damaged.safetensors"), bytes);
  HybridAdamW oe(c.params, c.grads, AdamWConfig{});
  const std::string e = testing::error_of([&] { oe.load_state(dir.file("damaged.safetensors")); });
  EXPECT_NE(e.find("metadata 'step' is 'x', expected a count"), std::string::npos) << e;
}

TEST(HybridAdamW, RefusesMismatchedSlabsAndBadConfig) {
  Model m;
  ModelConfig other = m.cfg;
  other.num_layers = 2;
  ModelSlabs g2(other, DType::f32), bf(m.cfg, DType::bf16);
  EXPECT_THROW(HybridAdamW(m.params, g2, AdamWConfig{}), Error);
  EXPECT_THROW(HybridAdamW(m.params, bf, AdamWConfig{}), Error);
  AdamWConfig bad;
  bad.block_size = 100;
  EXPECT_THROW(HybridAdamW(m.params, m.grads, bad), Error);
  bad.block_size = 256;
  bad.max_consecutive_skips = 0;
  EXPECT_THROW(HybridAdamW(m.params, m.grads, bad), Error);
  HybridAdamW opt(m.params, m.grads, AdamWConfig{});
  EXPECT_THROW(opt.update(SlabKind::layer, 3, {1, 1e-3, 1.0f}), Error);
  ModelSlabs f32copy(m.cfg, DType::f32);
  EXPECT_THROW(opt.step(partials_of(m.grads), 1e-3, &f32copy), Error);
}

}  // namespace
}  // namespace lt
