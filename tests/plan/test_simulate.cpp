// The discrete-event simulator: against the MILP's own prediction for the plans it returns, against closed
// forms where the step is purely compute- or link-bound, and its memory against the executor's function.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "exec/working_set.h"
#include "model/finetune.h"
#include "plan/chain_dp.h"
#include "plan/milp.h"
#include "plan/plan_file.h"
#include "plan/simulate.h"
#include "plan_testing.h"

namespace lt {
namespace {

// For every plan the MILP returns, the simulated step (the executor's dependencies, in-order streams, ring
// slots, fences) is within 10% of the MILP's window model, and within 3% on average; and the executor accepts
// the plan with its transfer windows.
void expect_simulator_agrees(bool full, uint64_t seed0, bool hybrid = false) {
  double sum = 0;
  int n = 0;
  for (uint64_t seed = seed0; seed < seed0 + 25; ++seed) {
    Rng rng(seed);
    const int64_t L = 2 + int64_t(rng.below(10));
    const MemoryModel mm = seed % 2 ? MemoryModel::lifetime : MemoryModel::executor;
    Instance in = testing::realistic_instance(rng, L, mm, full && seed % 3 == 0, hybrid);
    if (!full) in = restrict_instance(in);
    MilpOptions o;
    o.time_limit_s = 20;
    MilpResult m = solve_milp(in, o);
    if (!m.has_solution) continue;
    const SimResult s = simulate(in, m.plan, m.windows);
    // The executor takes the plan with its windows as they are (the ring allows every window the MILP uses).
    const Plan exec_plan = executable_plan(in, m.plan, m.windows);
    EXPECT_EQ(exec_plan.boundary, normalize_plan(m.plan).boundary);
    const double err = s.iteration_s / m.objective - 1;
    EXPECT_LT(std::abs(err), 0.10) << "seed " << seed << " L " << L << ": simulated " << s.iteration_s << " s, MILP "
                                   << m.objective << " s";
    sum += std::abs(err);
    ++n;
  }
  ASSERT_GE(n, 15);
  EXPECT_LT(sum / n, 0.03) << "mean |simulated / MILP - 1| over " << n << " plans";
}

TEST(Simulate, AgreesWithTheMilpRestricted) { expect_simulator_agrees(false, 9000); }
TEST(Simulate, AgreesWithTheMilpFull) { expect_simulator_agrees(true, 9100); }
// Qwen3.5 hybrids: each layer's own weights, gradients, internals and times.
TEST(Simulate, AgreesWithTheMilpHybrid) { expect_simulator_agrees(true, 9200, true); }

// Infinite links and a host that takes no time: the step is its compute, in order, plus nothing.
TEST(Simulate, ComputeBoundStepIsTheComputeSum) {
  Rng rng(1);
  Instance in = testing::realistic_instance(rng, 6, MemoryModel::executor);
  in.bw_h2d = in.bw_d2h = 1e30;
  in.bw_sum = 0;
  in.acc.assign(size_t(in.L), 0.0);
  in.opt_layer.assign(size_t(in.L), 0.0);
  in.acc_head = in.embed_f = in.embed_b = in.opt_embed = in.opt_head = 0;
  for (const char* spec : {"keep-all", "every:1", "every:3", "host:2"}) {
    const Plan p = normalize_plan(Plan::parse(spec, 6));
    const SimResult s = simulate(in, p);
    const Prediction pr = evaluate(in, p);
    EXPECT_NEAR(s.step_s, pr.compute_s, 1e-9) << spec;
    EXPECT_NEAR(s.step_s, pr.step_s, 1e-9) << spec;
    EXPECT_NEAR(s.exposed_s, 0.0, 1e-9) << spec;
  }
}

// A link so slow that it dominates: the step is at least every byte over the link, and the simulator counts
// the same bytes as the cost model.
TEST(Simulate, LinkBoundStepCarriesEveryByte) {
  Rng rng(2);
  Instance in = testing::realistic_instance(rng, 5, MemoryModel::executor);
  in.budget.host_act_bytes = size_t(1) << 40;
  in.bw_h2d = in.bw_d2h = 1e3;  // 1 kB/s
  // 1 .. 6 weight buffers: the backward finds the top ones resident until its first upload (every:3 and
  // every:4 recompute from a resident boundary or not, depending on the count).
  for (int buffers = 1; buffers <= 6; ++buffers)
    for (const char* spec : {"keep-all", "every:2", "every:3", "every:4", "host:1"}) {
      in.opt.exec.weight_buffers = buffers;
      const Plan p = normalize_plan(Plan::parse(spec, 5));
      const SimResult s = simulate(in, p);
      const Prediction pr = evaluate(in, p);
      const std::string what = fmt::format("{} with {} weight buffers", spec, buffers);
      EXPECT_NEAR(s.h2d_bytes, pr.h2d_bytes, 1e-6 * pr.h2d_bytes) << what;
      EXPECT_NEAR(s.d2h_bytes, pr.d2h_bytes, 1e-6 * pr.d2h_bytes) << what;
      EXPECT_GE(s.step_s, s.h2d_bytes / in.bw_h2d * (1 - 1e-9)) << what;
      EXPECT_GT(s.exposed_h2d_s + s.exposed_d2h_s, 0.5 * s.step_s) << what;
    }
}

TEST(Simulate, MemoryIsTheExecutorsWorkingSet) {
  Rng rng(3);
  Instance in = testing::realistic_instance(rng, 7, MemoryModel::executor);
  for (const char* spec : {"keep-all", "every:1", "every:4", "host:1"}) {
    const Plan p = normalize_plan(Plan::parse(spec, 7));
    const WorkingSet ws = plan_working_set(in.cfg, in.B, in.T, p, in.opt.exec);
    const SimResult s = simulate(in, p);
    EXPECT_EQ(s.peak_device_bytes, ws.device_bytes()) << spec;
    EXPECT_EQ(s.window_device_bytes, double(*std::max_element(ws.window_bytes.begin(), ws.window_bytes.end()))) << spec;
  }
}

// The simulator times the executor's schedule itself: an operation moved in it moves the simulated timeline and
// the memory figures together. The head's weights uploaded first, ahead of every layer's: on a link-bound step
// each forward upload waits behind them (the step grows by about their transfer), and they hold their memory
// through every forward window.
TEST(Simulate, AMovedOperationMovesTheTimelineAndTheMemoryTogether) {
  Rng rng(8);
  Instance in = testing::realistic_instance(rng, 5, MemoryModel::executor);
  in.bw_h2d = in.W / (4 * in.f[0]);  // a layer's upload takes four forwards: the forward is link-bound
  in.bw_sum = 0;
  const StepSchedule s = build_step_schedule(in.cfg, in.B, in.T, Plan::keep_all(in.L), in.opt.exec);
  StepSchedule moved = s;
  auto find = [](const StepSchedule& x, const std::string& name) {
    for (int i = 0; i < int(x.ops.size()); ++i)
      if (x.ops[size_t(i)].name == name) return i;
    return -1;
  };
  move_operation(moved, find(s, "h2d head"), find(s, "fwd L0"), 0);
  const SimResult a = simulate_schedule(in, s), b = simulate_schedule(in, moved);
  EXPECT_GT(b.step_s, a.step_s + 0.5 * in.HW / in.bw_h2d) << a.step_s << " s before, " << b.step_s << " s after";
  EXPECT_NEAR(a.h2d_bytes, b.h2d_bytes, 1.0);  // the same bytes, moved
  const double head = double(s.buffer("head weights").bytes);
  for (int w = 0; w < int(in.L); ++w)
    EXPECT_EQ(double(moved.memory.window_bytes[size_t(w)]), double(s.memory.window_bytes[size_t(w)]) + head) << w;
  EXPECT_EQ(b.peak_device_bytes, moved.memory.device_bytes());
  EXPECT_GE(b.window_device_bytes, a.window_device_bytes);
}

TEST(Simulate, NvmeTierGoesThroughTheNvmeLane) {
  Rng rng(4);
  Instance in = testing::realistic_instance(rng, 6, MemoryModel::executor, true);
  const Plan p = normalize_plan(Plan::every(6, 2, Tier::nvme));
  const SimResult s = simulate(in, p);
  // Boundaries 2 and 4 written once; read for their own backward and once more as segment sources.
  EXPECT_NEAR(s.nvme_write_bytes, 2 * in.A_nvme, 1.0);
  EXPECT_NEAR(s.nvme_read_bytes, 4 * in.A_nvme, 1.0);
  const Prediction pr = evaluate(in, p);
  EXPECT_NEAR(pr.nvme_read_bytes, 4 * in.A, 1.0);
  EXPECT_GT(s.step_s, 0);
}

TEST(Simulate, SlowOptimizerIsExposed) {
  Rng rng(5);
  Instance in = testing::realistic_instance(rng, 6, MemoryModel::executor);
  const Plan p = Plan::every(6, 2);
  in.opt_layer.assign(size_t(in.L), 10 * in.f[0]);  // far slower than a forward window
  in.opt_embed = in.opt_head = in.f[0];
  const SimResult s = simulate(in, p);
  EXPECT_GT(s.optimizer_exposed_s, 5 * in.f[0]);
  EXPECT_NEAR(s.iteration_s, s.step_s + s.optimizer_exposed_s, 1e-12);
  // The cost model's closed form agrees within a window's length.
  const Prediction pr = evaluate(in, p);
  EXPECT_NEAR(pr.optimizer_exposed_s, s.optimizer_exposed_s, 2 * in.f[0]);
}

// Data parallel on paper: N ranks over a network move exactly (N-1)/N of each gradient slab per micro-batch, every
// rank's dx0 rows, and (N-1)/N of the updated masters and compute copy per step; each rank updates 1/N. A fast
// network leaves the step as one process's with the optimizer's share cut; a slow one exposes the exchange.
TEST(Simulate, DataParallelCountsTheExchange) {
  const ModelConfig cfg = testing::tiny_plan_config(4);
  Rng rng(7);
  const Profile prof = [&] {
    Profile p = testing::synthetic_profile(cfg, 2, 16, rng);
    p.optimizer_params_per_s = 1e7;
    return p;
  }();
  const Budgets budget{size_t(1) << 30, size_t(1) << 30, 0};
  InstanceOptions o;
  const Instance one = make_instance(cfg, 2, 16, prof, budget, o);
  o.ranks = 4;
  o.net_gbps = 2;
  const Instance four = make_instance(cfg, 2, 16, prof, budget, o);
  const double share = 3.0 / 4, net = 2e9, N = 32, C = double(cfg.hidden_size);
  double micro = share * one.HG + 3 * N * (C * 4 + 4), step = 0;
  for (int64_t l = 0; l < one.L; ++l) {
    EXPECT_DOUBLE_EQ(four.acc[size_t(l)], one.acc[size_t(l)] + share * one.Gl[size_t(l)] / net) << l;
    micro += share * one.Gl[size_t(l)];
    const double params = double(layer_parameters(cfg, cfg.layer_kind(l)));
    EXPECT_DOUBLE_EQ(four.opt_layer[size_t(l)], one.opt_layer[size_t(l)] / 4 + share * params * 4 / net) << l;
    step += share * params * 4;
  }
  EXPECT_DOUBLE_EQ(four.acc_head, one.acc_head + share * one.HG / net);
  EXPECT_DOUBLE_EQ(four.embed_b, one.embed_b + 3 * N * (C * 4 + 4) / net);
  EXPECT_NEAR(four.exchange_micro_bytes, micro, 1e-6 * micro);
  step += share * (double(cfg.vocab_size) * C + C) * 4;  // the table (tied: in the embedding) and the final norm
  EXPECT_NEAR(four.exchange_step_bytes, step, 1e-6 * step);
  {
    // bf16 compute: the layers' and head's bf16 copy alone is allgathered (their masters are sharded), the
    // embedding's f32 masters beside its copy (the lookup reads them on every rank).
    InstanceOptions b = o;
    b.exec.compute = ComputeType::bf16;
    const Instance bf = make_instance(cfg, 2, 16, prof, budget, b);
    double expect = share * (double(cfg.vocab_size) * C * (4 + 2) + C * 2);
    for (int64_t l = 0; l < bf.L; ++l) expect += share * double(layer_parameters(cfg, cfg.layer_kind(l))) * 2;
    EXPECT_NEAR(bf.exchange_step_bytes, expect, 1e-6 * expect);
  }
  // Fast network: the optimizer's quarter shows; slow: the exchange is exposed.
  const Plan p = Plan::every(4, 1);
  EXPECT_LT(simulate(four, p).iteration_s, simulate(one, p).iteration_s);
  o.net_gbps = 1e-3;
  EXPECT_GT(simulate(make_instance(cfg, 2, 16, prof, budget, o), p).iteration_s, 10 * simulate(one, p).iteration_s);
  o.net_gbps = 0;
  EXPECT_THROW(make_instance(cfg, 2, 16, prof, budget, o), Error);
}

// What the step moves and updates, as the executor's schedule does it: the embedding rows, summed on the device, go
// down in f32 at their bound (dx0's [N, C]) whatever the activations' dtype (before, the simulator and the cost model
// charged a bf16 boundary: half of it); a fine-tuning run's optimizer updates its trained parameters alone, and a
// frozen table has no rows, no add, no update.
TEST(Simulate, ChargesDx0InF32AndTheOptimizerForTheTrainedParameters) {
  ModelConfig cfg = testing::tiny_plan_config(4);
  cfg.tie_word_embeddings = false;
  Rng rng(8);
  Profile prof = testing::synthetic_profile(cfg, 2, 16, rng);
  prof.optimizer_params_per_s = 1e7;
  const Budgets budget{size_t(1) << 30, size_t(1) << 30, 0};
  InstanceOptions o;
  o.exec.activations = DType::bf16;
  Instance full = make_instance(cfg, 2, 16, prof, budget, o);
  const double dx0 = 32.0 * double(cfg.hidden_size) * 4;
  EXPECT_EQ(full.dx0, dx0);
  EXPECT_LT(full.A, dx0);  // the bf16 boundary
  full.bw_d2h = 1e3;       // 1 kB/s: the download's time is its bytes
  full.bw_sum = full.latency = 0;
  SimOptions rec;
  rec.record_ops = true;
  int seen = 0;
  for (const SimOpRecord& op : simulate(full, Plan::every(4, 1), rec).ops) {
    if (op.name == "d2h embedding rows") {  // at the bound: every token's id distinct
      EXPECT_NEAR(op.end - op.start, dx0 / full.bw_d2h, 1e-9 * dx0 / full.bw_d2h);
      ++seen;
    }
    if (op.name == "embedding rows") {  // the device half, the compute stream's last op
      EXPECT_EQ(op.lane, "compute");
      EXPECT_NEAR(op.end - op.start, prof.embed_rows_s, 1e-12);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2);
  EXPECT_GT(full.embed_rows, 0.0);
  const Prediction pr = evaluate(full, Plan::every(4, 1));
  const SimResult sr = simulate(full, Plan::every(4, 1));
  EXPECT_NEAR(sr.d2h_bytes, pr.d2h_bytes, 1e-6 * pr.d2h_bytes);  // the cost model counts the same bytes

  // Freeze: the last layer's MLP trains, the table does not.
  cfg.finetune = std::make_shared<const Finetune>(make_freeze(cfg, 1, {"mlp"}, {}));
  const Instance frozen = make_instance(cfg, 2, 16, prof, budget, o);
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    EXPECT_DOUBLE_EQ(frozen.opt_layer[size_t(l)],
                     double(SlabLayout::trained(cfg, SlabKind::layer, l).num_parameters()) / 1e7) << l;
  EXPECT_EQ(frozen.opt_layer[0], 0.0);
  EXPECT_GT(frozen.opt_layer[3], 0.0);
  EXPECT_LT(frozen.opt_layer[3], full.opt_layer[3]);
  EXPECT_EQ(frozen.opt_embed, 0.0);
  EXPECT_EQ(frozen.opt_head, 0.0);
  EXPECT_EQ(frozen.dx0, 0.0);
  EXPECT_EQ(frozen.embed_b, 0.0);
  EXPECT_EQ(frozen.embed_rows, 0.0);
  for (const SimOpRecord& op : simulate(frozen, Plan::every(4, 1), rec).ops) {
    EXPECT_NE(op.name, "d2h embedding rows");
    EXPECT_NE(op.name, "embedding rows");
  }
  EXPECT_NEAR(simulate(frozen, Plan::every(4, 1)).d2h_bytes, evaluate(frozen, Plan::every(4, 1)).d2h_bytes,
              1e-6 * evaluate(frozen, Plan::every(4, 1)).d2h_bytes);
}

// One process splits the embedding's update: the batch's rows (at their bound, min(N, V) of V) before the lookup,
// the others after the layers'. The simulator times the two parts as the executor orders them; the cost model's
// exposure agrees; data parallel keeps the whole update.
TEST(Simulate, TheEmbeddingsUpdateIsSplitAtTheBatchsRows) {
  ModelConfig cfg = testing::tiny_plan_config(4);
  cfg.vocab_size = 256;  // N = 2·16 = 32 tokens: at most 32 of 256 rows
  Rng rng(9);
  Profile prof = testing::synthetic_profile(cfg, 2, 16, rng);
  prof.optimizer_params_per_s = 1e6;  // slow, so the lookup's wait shows
  const Budgets budget{size_t(1) << 30, size_t(1) << 30, 0};
  const Instance in = make_instance(cfg, 2, 16, prof, budget, InstanceOptions{});
  EXPECT_DOUBLE_EQ(in.opt_embed_rows, in.opt_embed * 32.0 / 256.0);
  SimOptions rec;
  rec.record_ops = true;
  const SimResult r = simulate(in, Plan::every(4, 1), rec);
  double rows = -1, others = -1, others_start = -1, last_layer_end = -1;
  for (const SimOpRecord& op : r.ops) {
    if (op.name == "update embedding (batch rows)") rows = op.end - op.start;
    if (op.name == "update embedding (other rows)") others = op.end - op.start, others_start = op.start;
    if (op.name == "update L3") last_layer_end = op.end;
  }
  EXPECT_NEAR(rows, in.opt_embed_rows, 1e-12);
  EXPECT_NEAR(others, in.opt_embed - in.opt_embed_rows, 1e-12);
  EXPECT_GE(others_start, last_layer_end);
  // Split, the exposure is smaller than with the whole table first (the same instance, unsplit).
  Instance whole = in;
  whole.opt_embed_rows = 0;
  EXPECT_LT(evaluate(in, Plan::every(4, 1)).optimizer_exposed_s, evaluate(whole, Plan::every(4, 1)).optimizer_exposed_s);
  EXPECT_LT(r.optimizer_exposed_s, simulate(whole, Plan::every(4, 1)).optimizer_exposed_s);
  // Data parallel: the owners' parts are exchanged whole, no split.
  InstanceOptions dp;
  dp.ranks = 2;
  dp.net_gbps = 10;
  EXPECT_EQ(make_instance(cfg, 2, 16, prof, budget, dp).opt_embed_rows, 0.0);
}

TEST(Simulate, TraceHasEveryOperation) {
  Rng rng(6);
  Instance in = testing::realistic_instance(rng, 3, MemoryModel::executor);
  SimOptions o;
  o.record_ops = true;
  const SimResult s = simulate(in, Plan::every(3, 1), o);
  int fwd = 0, bwd = 0;
  for (const SimOpRecord& op : s.ops) {
    fwd += op.name.rfind("fwd L", 0) == 0;
    bwd += op.name.rfind("bwd L", 0) == 0;
    EXPECT_LE(op.start, op.end);
  }
  EXPECT_EQ(fwd, 3);
  EXPECT_EQ(bwd, 6);  // each layer's backward in its two halves (MLP, attention)
  EXPECT_TRUE(s.chrome_trace().contains("traceEvents"));
}

}  // namespace
}  // namespace lt
