#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"
#include "core/units.h"
#include "model/finetune.h"
#include "optim/adamw.h"

namespace lt {
namespace {

std::string gb(double bytes) { return format_bytes(bytes); }

PlanCandidate candidate(const Instance& in, std::string name, const Plan& plan) {
  PlanCandidate c;
  c.name = std::move(name);
  c.plan = normalize_plan(plan);
  c.plan.name = c.name;
  c.windows = TransferWindows::natural(in, c.plan);
  c.prediction = evaluate(in, c.plan, c.windows);
  // The executor's packed working set is the truth for whether a plan runs.
  if (c.prediction.executor_device_bytes > in.budget.device_bytes) {
    c.prediction.feasible = false;
    c.prediction.violations.push_back(fmt::format("the executor's working set needs {} > budget {}",
                                                  gb(double(c.prediction.executor_device_bytes)),
                                                  gb(double(in.budget.device_bytes))));
  }
  return c;
}

nlohmann::json candidate_json(const Instance& in, const PlanCandidate& c) {
  const Prediction& p = c.prediction;
  return {{"name", c.name},
          {"feasible", p.feasible},
          {"violations", p.violations},
          {"step_s", p.step_s},
          {"iteration_s", p.iteration_s},
          {"optimizer_exposed_s", p.optimizer_exposed_s},
          {"tflops", p.tflops_6nd(in)},
          {"tflops_real", p.tflops_real()},
          {"tokens_per_s", p.tokens_per_s(in)},
          {"peak_device_bytes", p.model_device_bytes},
          {"executor_device_bytes", p.executor_device_bytes},
          {"lifetime_device_bytes", p.lifetime_device_bytes},
          {"host_act_bytes", p.host_act_bytes},
          {"nvme_bytes", p.nvme_bytes},
          {"exposed_h2d_s", p.exposed_h2d_s + p.exposed_link_s / 2},
          {"exposed_d2h_s", p.exposed_d2h_s + p.exposed_link_s / 2},
          {"exposed_nvme_s", p.exposed_nvme_s},
          {"exposed_host_s", p.exposed_host_s},
          {"recompute_s", p.recompute_s},
          {"boundaries", normalize_plan(c.plan).to_json()["boundaries"]},
          {"keep_internals", c.plan.keep_internals}};
}

}  // namespace

MemoryNeed minimum_device_memory(const Instance& in) {
  const int64_t L = in.L;
  const int64_t off = int64_t(in.allow_host ? double(in.budget.host_act_bytes) / in.A : 0) +
                      int64_t(in.allow_nvme ? double(in.budget.nvme_bytes) / in.A_nvme : 0);
  double best = 1e300;
  int64_t best_r = 0, best_dev = 0;
  for (int64_t R = 0; R < std::max<int64_t>(L, 1); ++R) {
    // Stored boundaries among 1..L-1 so that no run of dropped ones is longer than R.
    const int64_t interior = L - 1;
    const int64_t need = R >= interior ? 0 : (interior - R + R) / (R + 1);
    const int64_t dev = std::max<int64_t>(0, need - off);
    // The executor's windows with some layer recomputing (scratch) and a recompute run of R: F(L-1), H and
    // B(L-1) are the largest.
    const double S = in.recompute_scratch();
    const double m = std::max({in.fixed_window(in.fwd(L - 1)) + S, in.fixed_window(in.head_window()) + S,
                               in.fixed_window(in.bwd(L - 1)) + S + in.A * double(R)}) +
                     in.A * double(dev);
    if (m < best) {
      best = m;
      best_r = R;
      best_dev = dev;
    }
  }
  MemoryNeed n;
  n.device_bytes = best;
  n.breakdown = fmt::format(
      "the buffers every plan has {} in their largest window ({} weight buffers of {}, {} gradient buffers of {}, "
      "head {}, the ring, the compute's scratch) + the compute's recompute buffers {} + boundaries {} x {} (a "
      "recompute run of {}, {} on the device), in the executor's largest window",
      gb(in.fixed_peak()), in.opt.exec.weight_buffers, gb(in.W), in.opt.exec.grad_buffers, gb(in.G),
      gb(in.HW + in.HG), gb(in.recompute_scratch()), best_r + best_dev, gb(in.A), best_r, best_dev);
  return n;
}

namespace {
// The MLP's chunk-sized scratch for `tokens` tokens: gate, up, h and their gradients, f32.
double mlp_scratch_bytes(const ModelConfig& cfg, int64_t tokens) {
  return 6.0 * double(tokens) * double(cfg.intermediate_size) * 4;
}
}  // namespace

int64_t choose_mlp_chunk(const ModelConfig& cfg, int64_t B, int64_t T, size_t device_bytes) {
  const double cap = double(device_bytes) / 8;
  const int64_t N = B * T;
  if (mlp_scratch_bytes(cfg, N) <= cap || N <= kTokenSlice) return 0;
  int64_t chunk = kTokenSlice;
  while (chunk * 2 < N && mlp_scratch_bytes(cfg, chunk * 2) <= cap) chunk *= 2;
  return chunk;
}

namespace {
// The instance options with the MLP chunk resolved for batch B.
InstanceOptions resolved_options(const PlanRequest& rq, int64_t B) {
  InstanceOptions o = rq.options;
  o.exec.mlp_chunk_tokens =
      rq.mlp_chunk_tokens >= 0 ? rq.mlp_chunk_tokens : choose_mlp_chunk(rq.cfg, B, rq.T, rq.budget.device_bytes);
  return o;
}
}  // namespace

// The share of the time limit the chain DP may take before the MILP: most of it where the DP can prove the
// optimum alone (no host or NVMe tier), a tenth where it is only a warm start (its first passes, the shortest
// recompute runs, give good plans early; the host budget's dimension makes the later ones slow).
constexpr double kDpShareExact = 0.6, kDpShareWarm = 0.1;

PlanReport make_plan(const PlanRequest& rq) {
  Timer clock;
  PlanReport rep;
  rep.instance = make_instance(rq.cfg, rq.B, rq.T, rq.profile, rq.budget, resolved_options(rq, rq.B));
  Instance& in = rep.instance;
  const int64_t L = in.L;
  rep.notes.push_back(fmt::format("activations stored in {}", dtype_name(in.opt.exec.activations)));
  if (in.opt.exec.mlp_chunk_tokens > 0)
    rep.notes.push_back(fmt::format("MLP in chunks of {} tokens (of {}): its scratch {} instead of {}",
                                    in.opt.exec.mlp_chunk_tokens, in.B * in.T,
                                    gb(mlp_scratch_bytes(in.cfg, in.opt.exec.mlp_chunk_tokens)),
                                    gb(mlp_scratch_bytes(in.cfg, in.B * in.T))));
  rep.notes.push_back(fmt::format("memory model: {}", memory_model_name(in.memory)));

  // Baselines.
  rep.baselines.push_back(candidate(in, "keep-all", Plan::keep_all(L)));
  rep.baselines.push_back(candidate(in, "every:1", Plan::every(L, 1)));
  rep.baselines.push_back(candidate(in, "every:4", Plan::every(L, 4)));
  rep.baselines.push_back(candidate(in, "host:1", Plan::every(L, 1, Tier::host)));

  // The exact DP on the restricted problem (warm start and cross-check).
  std::vector<Plan> starts;
  // With no activation able to leave the device (beyond boundary 0's fixed re-upload) there is no transfer to
  // place, the forward windows and so the optimizer term do not depend on the plan, and the chain DP is exact
  // for the full problem.
  const bool chain_is_exact = !(in.allow_host && double(in.budget.host_act_bytes) >= in.A) && !in.allow_nvme;
  {
    // The DP may use a share of the time limit; the MILP gets the rest (the limit is a wall-clock promise).
    const Instance rin = restrict_instance(in);
    const double dp_limit =
        std::max(0.05, (chain_is_exact ? kDpShareExact : kDpShareWarm) * rq.milp.time_limit_s - clock.seconds());
    rep.dp = chain_dp(rin, rq.dp_work_limit, dp_limit);
    rep.dp_run = rep.dp.complete;
    if (!rep.dp.complete)
      rep.notes.push_back(fmt::format("chain DP stopped at its {} limit after {:.2f} s ({}); the MILP goes on {}",
                                      rep.dp.seconds >= dp_limit ? "time" : "work", rep.dp.seconds,
                                      rep.dp.feasible ? "its best plan so far is a warm start" : "no plan yet",
                                      rep.dp.feasible ? "from it" : "without it"));
    if (rep.dp.feasible) {
      rep.dp.plan.name = "chain-dp";
      starts.push_back(rep.dp.plan);
    }
  }
  for (const PlanCandidate& c : rep.baselines)
    if (c.prediction.feasible) starts.push_back(c.plan);

  // The MILP, re-solved with a tighter budget if the executor's own memory function disagrees.
  MilpOptions mo = rq.milp;
  mo.warm_starts = starts;
  // Where the chain DP is exact and finished, its optimum bounds the MILP's from below (used below), and CBC
  // gets at most 1 s.
  const bool dp_exact = chain_is_exact && rep.dp.feasible && rep.dp.complete;
  double time_limit = rq.milp.time_limit_s;
  if (dp_exact) time_limit = std::min(time_limit, clock.seconds() + 1.0);
  Instance solve_in = in;
  MilpResult m;
  for (int attempt = 0; attempt < 4; ++attempt) {
    mo.time_limit_s = std::max(0.1, time_limit - clock.seconds());
    m = solve_milp(solve_in, mo);
    if (!m.has_solution) break;
    const size_t exec_bytes = predict_peak_device_bytes(in.cfg, in.B, in.T, m.plan, in.opt.exec);
    if (exec_bytes <= in.budget.device_bytes) break;
    ++rep.resolves;
    rep.notes.push_back(fmt::format("the executor's memory function needs {} for the solved plan, over the budget: "
                                    "re-solving with the budget tightened by the difference",
                                    gb(double(exec_bytes))));
    solve_in.budget.device_bytes -= std::min(solve_in.budget.device_bytes, exec_bytes - in.budget.device_bytes);
    m = MilpResult{};
  }
  rep.status = m.status;
  rep.message = m.message;
  rep.gap = m.gap;
  rep.bound = m.bound;
  rep.milp_objective = m.objective;
  rep.proof = m.status == SolveStatus::optimal ? "cbc" : "";
  if (dp_exact && m.has_solution && m.status != SolveStatus::optimal) {
    const double dp_full = evaluate(in, rep.dp.plan).iteration_s;
    rep.bound = std::max(rep.bound, dp_full);
    if (m.objective <= dp_full * (1 + 1e-9)) {
      rep.status = SolveStatus::optimal;
      rep.gap = 0;
      rep.bound = m.objective;
      rep.proof = "chain-dp";
      rep.notes.push_back("optimal: proved by the exact chain DP (no activation can leave the device, so the full "
                          "problem is the chain problem); CBC alone stopped at its time limit");
    } else {
      rep.gap = std::max(0.0, (m.objective - rep.bound) / m.objective);
    }
  }
  if (m.has_solution) {
    rep.found = true;
    rep.best.name = "lazytrain";
    rep.best.plan = m.plan;
    rep.best.plan.name = "lazytrain";
    rep.best.windows = m.windows;
    rep.best.prediction = evaluate(in, m.plan, m.windows);
    if (std::abs(rep.best.prediction.iteration_s - m.objective) > 1e-6 * m.objective)
      rep.notes.push_back(fmt::format("the MILP's objective {:.6f} s differs from the cost model's {:.6f} s", m.objective,
                                      rep.best.prediction.iteration_s));
  } else {
    // No MILP solution (time limit before any): the best warm start stands.
    const PlanCandidate* b = nullptr;
    PlanCandidate dpc;
    if (rep.dp.feasible) {
      dpc = candidate(in, "lazytrain", rep.dp.plan);
      b = &dpc;
    }
    for (const PlanCandidate& c : rep.baselines)
      if (c.prediction.feasible && (!b || c.prediction.iteration_s < b->prediction.iteration_s)) b = &c;
    if (b) {
      rep.found = true;
      rep.best = *b;
      rep.best.name = "lazytrain";
      rep.best.plan.name = "lazytrain";
      rep.notes.push_back("the MILP found no solution in time: the best of the DP and the baselines is returned");
    }
  }
  if (!rep.found) {
    const MemoryNeed need = minimum_device_memory(in);
    LT_FAIL("no plan fits: B={} T={} needs at least {} of device memory with everything offloaded or recomputed "
            "({}), the budget is {}; host memory for activations {}, NVMe {}. Lower the batch or the sequence, or "
            "give more device memory",
            in.B, in.T, gb(need.device_bytes), need.breakdown, gb(double(in.budget.device_bytes)),
            gb(double(in.budget.host_act_bytes)), gb(double(in.budget.nvme_bytes)));
  }
  rep.executor_device_bytes = predict_peak_device_bytes(in.cfg, in.B, in.T, rep.best.plan, in.opt.exec);
  rep.solve_s = clock.seconds();
  return rep;
}

namespace {

// Host memory of one rank for the parameters while training (optim/adamw.h).
double host_bytes_per_rank(const Instance& in) {
  AdamWConfig ac;
  ac.matrix_states = in.opt.optimizer_state_bits == 8 ? StatePrecision::q8 : StatePrecision::f32;
  return host_parameter_bytes_per_rank(in.cfg, ac, in.opt.exec.compute == ComputeType::bf16, int(in.opt.ranks));
}

}  // namespace

nlohmann::json PlanReport::to_json() const {
  nlohmann::json plans = nlohmann::json::array();
  if (found) {
    nlohmann::json b = candidate_json(instance, best);
    b["windows"] = best.windows.to_json(instance);
    b["natural_windows"] = best.windows.is_natural(instance, best.plan);
    plans.push_back(b);
  }
  for (const PlanCandidate& c : baselines) plans.push_back(candidate_json(instance, c));
  nlohmann::json dpj = nullptr;
  nlohmann::json ranks = nullptr;
  if (instance.opt.ranks > 1)
    ranks = {{"ranks", instance.opt.ranks},
             {"net_gbps", instance.opt.net_gbps},
             {"exchange_micro_bytes", instance.exchange_micro_bytes},
             {"exchange_step_bytes", instance.exchange_step_bytes},
             {"host_parameter_bytes_per_rank", host_bytes_per_rank(instance)}};
  if (dp_run) dpj = {{"feasible", dp.feasible}, {"objective", dp.objective}, {"seconds", dp.seconds}};
  return {{"status", solve_status_name(status)},
          {"proof", proof},
          {"message", message},
          {"solve_s", solve_s},
          {"gap", gap},
          {"bound", bound},
          {"milp_objective", milp_objective},
          {"memory_model", memory_model_name(instance.memory)},
          {"batch", instance.B},
          {"seq", instance.T},
          {"layers", instance.L},
          {"device_budget_bytes", instance.budget.device_bytes},
          {"host_act_budget_bytes", instance.budget.host_act_bytes},
          {"nvme_budget_bytes", instance.budget.nvme_bytes},
          {"executor_device_bytes", executor_device_bytes},
          {"activation_dtype", dtype_name(instance.opt.exec.activations)},
          {"mlp_chunk_tokens", instance.opt.exec.mlp_chunk_tokens},
          {"resolves", resolves},
          {"chain_dp", dpj},
          {"data_parallel", ranks},
          {"notes", notes},
          {"plans", plans}};
}

std::string PlanReport::table() const {
  const Instance& in = instance;
  std::string s;
  s += fmt::format("plan for B={} T={} ({} layers) on {}: device {}, host activations {}, NVMe {}\n", in.B, in.T, in.L,
                   in.profile_name, gb(double(in.budget.device_bytes)), gb(double(in.budget.host_act_bytes)),
                   gb(double(in.budget.nvme_bytes)));
  s += fmt::format("solver: {} in {:.2f} s (gap {:.3g}%){}\n", solve_status_name(status), solve_s, 100 * gap,
                   message.empty() ? "" : " — " + message);
  if (found) {
    s += "\nlayer  boundary (input)  internals\n";
    for (int64_t l = 0; l < in.L; ++l) {
      const Tier t = best.plan.boundary[size_t(l)];
      s += fmt::format("{:5}  {:16}  {}\n", l, t == Tier::drop ? "recompute" : tier_name(t),
                       best.plan.keep_internals[size_t(l)] ? "kept" : "recomputed");
    }
    s += fmt::format("{:5}  {:16}  (head input)\n", in.L, "device");
    if (!best.windows.is_natural(in, best.plan)) {
      s += "transfers outside their natural window:\n";
      for (const auto& e : best.windows.to_json(in))
        s += fmt::format("  boundary {} {} {:.0f}% in {}\n", e["boundary"].get<int64_t>(), e["kind"].get<std::string>(),
                         100 * e["fraction"].get<double>(), e["window"].get<std::string>());
    }
  }
  s += fmt::format("\n{:10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>11} {:>11} {:>10} {:>9} {:>9} {:>9}\n", "plan", "fits",
                   "step s", "iter s", "tok/s", "TFLOPS", "TFLOPS real", "device", "host act", "exp h2d", "exp d2h",
                   "exp nvme");
  auto line = [&](const PlanCandidate& c) {
    const Prediction& p = c.prediction;
    s += fmt::format("{:10} {:>8} {:>10.4f} {:>10.4f} {:>8.0f} {:>8.2f} {:>11.2f} {:>11} {:>10} {:>9.4f} {:>9.4f} {:>9.4f}\n",
                     c.name, p.feasible ? "yes" : "no", p.step_s, p.iteration_s, p.tokens_per_s(in), p.tflops_6nd(in),
                     p.tflops_real(), gb(p.model_device_bytes), gb(p.host_act_bytes),
                     p.exposed_h2d_s + p.exposed_link_s / 2, p.exposed_d2h_s + p.exposed_link_s / 2, p.exposed_nvme_s);
  };
  if (found) line(best);
  for (const PlanCandidate& c : baselines) line(c);
  if (in.opt.ranks > 1 && found)
    s += fmt::format("\ndata parallel: {} ranks over {:.3g} GB/s each way: per rank {} exchanged per micro-batch and {} "
                     "per step (updated weights), counted above; the job {:.0f} tokens/s (tok/s x ranks); host "
                     "memory per rank {} (1/{} of the f32 gradients and optimizer states; {})\n",
                     in.opt.ranks, in.opt.net_gbps, gb(in.exchange_micro_bytes), gb(in.exchange_step_bytes),
                     best.prediction.tokens_per_s(in) * in.opt.ranks, gb(host_bytes_per_rank(in)),
                     in.opt.ranks,
                     in.opt.exec.compute == ComputeType::bf16
                         ? fmt::format("the bf16 compute copy, 1/{} of the f32 masters but the embedding's whole",
                                       in.opt.ranks)
                         : std::string("the f32 masters whole, the streamed weights"));
  if (in.opt.ranks == 1 && !in.cfg.trains_all()) {
    Instance full = in;
    full.cfg.finetune = nullptr;
    const bool bf16 = in.opt.exec.compute == ComputeType::bf16;
    s += fmt::format("\nhost memory for the parameters: {} ({}; every tensor in the {} streamed weights, f32 masters, "
                     "gradients and {}-bit optimizer states of the trained ones; read a layer at a time), plus host "
                     "activations and the data; full fine-tuning: {}\n",
                     gb(host_bytes_per_rank(in)), in.cfg.finetune->summary(in.cfg), bf16 ? "bf16" : "f32",
                     in.opt.optimizer_state_bits, gb(host_bytes_per_rank(full)));
  } else if (in.opt.ranks == 1)
    s += fmt::format("\nhost memory for the parameters: {} ({} parameters{}: f32 masters and gradients{}, {}-bit optimizer "
                     "states), plus host activations and the data\n",
                     gb(host_bytes_per_rank(in)), in.cfg.num_parameters(),
                     in.cfg.is_moe() ? fmt::format(", {} active per token", in.cfg.num_active_parameters()) : "",
                     in.opt.exec.compute == ComputeType::bf16 ? ", the bf16 compute copy" : "",
                     in.opt.optimizer_state_bits);
  if (found && executor_device_bytes)
    s += fmt::format("\nexecutor's memory function for the plan: {} (budget {})\n", gb(double(executor_device_bytes)),
                     gb(double(in.budget.device_bytes)));
  for (const std::string& n : notes) s += "note: " + n + "\n";
  return s;
}

nlohmann::json BatchSearch::to_json() const {
  nlohmann::json c = nlohmann::json::array();
  for (auto [b, t] : curve) c.push_back({{"batch", b}, {"tokens_per_s", t}});
  return {{"max_batch", max_batch}, {"best_batch", best_batch}, {"best_tokens_per_s", best_tokens_per_s}, {"curve", c}};
}

BatchSearch search_batch(const PlanRequest& rq, int64_t limit) {
  BatchSearch bs;
  auto inst = [&](int64_t B) { return make_instance(rq.cfg, B, rq.T, rq.profile, rq.budget, resolved_options(rq, B)); };
  auto fits = [&](int64_t B) {
    const Instance in = inst(B);
    return minimum_device_memory(in).device_bytes <= double(in.budget.device_bytes);
  };
  if (!fits(1)) return bs;
  int64_t lo = 1, hi = 2;
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, limit + 1);
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  bs.max_batch = lo;
  // Throughput: the restricted DP's optimum (exact for the chain problem, fast) at each batch of a grid.
  std::vector<int64_t> grid;
  for (int64_t b = 1; b <= bs.max_batch; b = std::max(b + 1, int64_t(std::llround(double(b) * 1.25)))) grid.push_back(b);
  if (grid.empty() || grid.back() != bs.max_batch) grid.push_back(bs.max_batch);
  for (int64_t B : grid) {
    const Instance rin = restrict_instance(inst(B));
    ChainResult r = chain_dp(rin, rq.dp_work_limit);
    if (!r.feasible) continue;
    const double tps = double(B * rq.T) / evaluate(inst(B), r.plan).iteration_s;
    bs.curve.push_back({B, tps});
    if (tps > bs.best_tokens_per_s) {
      bs.best_tokens_per_s = tps;
      bs.best_batch = B;
    }
  }
  return bs;
}

}  // namespace lt
