// Random planning instances for the planner's tests: a tiny real model config (so the executor's memory
// function applies), then times, bandwidths and budgets drawn so that every trade-off (keep, drop, host,
// transfer windows) can win somewhere. The seed is printed by the callers on failure.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/rng.h"
#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/instance.h"
#include "testing/exec_testing.h"

namespace lt::testing {

inline ModelConfig tiny_plan_config(int64_t L, uint64_t seed = 1) {
  Rng rng(seed);
  ModelConfig c;
  c.type = ModelType::qwen3;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48 + 16 * int64_t(rng.below(3));
  c.num_layers = L;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 512;
  return c;
}

// A profile for cfg at B x T with per-layer times around 1 ms.
inline Profile synthetic_profile(const ModelConfig& cfg, int64_t B, int64_t T, Rng& rng) {
  Profile p;
  p.name = "synthetic";
  p.source = "test";
  p.batch = B;
  p.seq = T;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const double f = 1e-3 * (0.5 + rng.uniform());
    p.forward_s.push_back(f);
    p.recompute_s.push_back(f * (0.9 + 0.2 * rng.uniform()));
    p.backward_s.push_back(f * (1.5 + rng.uniform()));
  }
  p.head_s = 1e-3 * (0.5 + rng.uniform());
  p.embed_forward_s = 1e-5;
  p.embed_rows_s = 4e-6;
  p.embed_backward_s = 2e-5;
  p.accumulate_gbps = 100;
  p.link = {1, 1, 0, 0, 0};
  return p;
}

// A random instance with L layers. Byte sizes and times are redrawn after make_instance so that boundaries,
// internals and weights take comparable room and transfers compare with compute in every direction. Half the
// instances have two kinds of layer with their own internals, weights and gradients (as Qwen3.5's Gated DeltaNet
// and attention layers), in a random order.
inline Instance random_instance(Rng& rng, int64_t L, MemoryModel memory, bool restricted, bool nvme = false) {
  const ModelConfig cfg = tiny_plan_config(L, rng.next_u64());
  Profile prof = synthetic_profile(cfg, 2, 16, rng);
  InstanceOptions o;
  o.memory = memory;
  o.restricted = restricted;
  o.include_optimizer = !restricted;
  prof.optimizer_params_per_s = restricted || rng.below(2) ? 0 : 1e6 * (0.5 + rng.uniform());
  if (nvme) {
    prof.nvme_read_gbps = 1;
    prof.nvme_write_gbps = 1;
  }
  Budgets bud{size_t(1) << 40, size_t(1) << 40, nvme ? size_t(1) << 40 : 0};
  Instance in = make_instance(cfg, 2, 16, prof, bud, o);
  in.opt.exec.weight_buffers = 1 + int(rng.below(4));  // how many top layers the backward finds resident
  const double MB = 1e6;
  auto round_up = [](double x) { return 256 * std::ceil(x / 256); };
  in.A = round_up(MB * (0.5 + rng.uniform()));
  in.A_nvme = in.A;
  const int kinds = 1 + int(rng.below(2));
  double I[2], W[2], G[2];
  for (int k = 0; k < kinds; ++k) {
    I[k] = round_up(in.A * (0.5 + 4 * rng.uniform()));
    W[k] = round_up(MB * (0.3 + 2 * rng.uniform()));
    G[k] = round_up(W[k] * (1 + rng.uniform()));
  }
  in.Wl.clear();
  in.Gl.clear();
  in.W = in.G = 0;
  std::vector<double> internals;
  for (int64_t l = 0; l < L; ++l) {
    const int k = int(rng.below(uint64_t(kinds)));
    internals.push_back(I[k]);
    in.Wl.push_back(W[k]);
    in.Gl.push_back(G[k]);
    in.W = std::max(in.W, W[k]);
    in.G = std::max(in.G, G[k]);
  }
  in.HW = round_up(in.W * (0.5 + rng.uniform()));
  in.HG = in.HW * 2;
  // The memory terms with these sizes, shaped as the executor's (weights, ring and tokens all step; the head's
  // buffers in H; gradient buffers, backward scratch and activation gradients over the backward; boundaries and
  // internals over their spans), with the terms' spans as make_instance read them off the schedule.
  {
    MemoryTerms& m = in.mem;
    const int nw = in.num_windows();
    const double scratch = round_up(internals[0] * (0.5 + rng.uniform())), tokens = 1e3;
    const ExecOptions& e = in.opt.exec;
    m.fixed.assign(size_t(nw), 0.0);
    for (int w = 0; w < nw; ++w) {
      double f = double(e.weight_buffers) * in.W + tokens + double(e.boundary_ring) * in.A;
      if (w == L - 1 || w == L) f += in.A;  // the head's input
      if (w == L) f += in.HW + in.HG;
      if (w >= L) f += 2 * in.A;            // activation gradients (f32: about twice a bf16 boundary)
      if (w > L) f += double(e.grad_buffers) * in.G + scratch;
      if (w == L + 1) f += in.HG;           // downloaded in H: taken one window longer
      m.fixed[size_t(w)] = f;
    }
    m.boundary.assign(size_t(L), in.A);
    m.internals = internals;
    for (int64_t i = 0; i < L; ++i) {
      m.boundary_span.push_back({in.fwd(std::max<int64_t>(i - 1, 0)), in.bwd(i)});
      m.internals_span.push_back({in.fwd(i), in.bwd(i)});
    }
    m.recompute = round_up(internals[0] * (0.8 + rng.uniform()));
    m.recompute_span = {0, nw - 1};
    m.cache_slot = in.A;
    m.cache_span = {in.bwd(L - 1), nw - 1};
  }
  // Bandwidths: a weight upload takes 0.2 .. 1.5 of a forward, an offload 0.2 .. 2.
  const double f = 1e-3;
  in.bw_h2d = in.W / (f * (0.2 + 1.3 * rng.uniform()));
  in.bw_d2h = in.A / (f * (0.2 + 1.8 * rng.uniform()));
  in.bw_sum = rng.below(3) == 0 ? 0.8 * (in.bw_h2d + in.bw_d2h) : 0.0;
  const double acc = f * 0.5 * rng.uniform() / in.G;  // seconds per gradient byte
  in.acc.clear();
  for (double g : in.Gl) in.acc.push_back(g * acc);
  in.acc_head = in.G * acc;
  if (nvme) {
    in.bw_nvme_r = in.A / (f * (0.5 + 2 * rng.uniform()));
    in.bw_nvme_w = in.A / (f * (0.5 + 2 * rng.uniform()));
  }
  // Budgets: device between the smallest plan's need and keep-all's; host for a random number of boundaries.
  Plan keep = Plan::keep_all(L);
  Plan small = Plan::every(L, L);  // everything dropped but boundary 0
  const double hi = evaluate(in, keep).model_device_bytes;
  const double lo = evaluate(in, small).model_device_bytes;
  const double lo2 = std::min(lo, in.fixed_peak() + in.mem.internals[0] + in.A);
  in.budget.device_bytes = size_t(lo2 + (hi - lo2) * rng.uniform() * 1.05);
  in.budget.host_act_bytes = size_t(in.A * double(rng.below(uint64_t(L + 1))));
  in.allow_host = rng.below(5) != 0;
  if (nvme) in.budget.nvme_bytes = size_t(in.A * double(rng.below(uint64_t(L + 1))));
  return in;
}

// A Qwen3.5 hybrid of L layers, both kinds in a random order (random_hybrid_config's sizes).
inline ModelConfig hybrid_plan_config(int64_t L, Rng& rng) {
  ModelConfig cfg = random_hybrid_config(rng);
  cfg.num_layers = L;
  cfg.layer_types.clear();
  for (int64_t l = 0; l < L; ++l)
    cfg.layer_types.push_back(rng.below(3) ? LayerKind::linear_attention : LayerKind::full_attention);
  cfg.layer_types[size_t(rng.below(uint64_t(L)))] = LayerKind::full_attention;
  return cfg;
}

// An instance whose byte sizes are the real ones of a small model (so the executor's working set, its
// packing and fences, match the instance), with random per-layer times, links and budgets. `hybrid`: a Qwen3.5
// model (layers of two kinds, L >= 2).
inline Instance realistic_instance(Rng& rng, int64_t L, MemoryModel memory, bool nvme = false, bool hybrid = false) {
  ModelConfig cfg = tiny_plan_config(L, rng.next_u64());
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128 + 32 * int64_t(rng.below(3));
  cfg.vocab_size = 256;
  if (hybrid) {  // the same widths (the window model's agreement with the simulator depends on them)
    const ModelConfig base = cfg;
    cfg = hybrid_plan_config(L, rng);
    cfg.hidden_size = base.hidden_size;
    cfg.intermediate_size = base.intermediate_size;
    cfg.vocab_size = base.vocab_size;
    cfg.head_dim = 16;
    cfg.linear_key_head_dim = 16;
    cfg.linear_value_head_dim = 16;
  }
  const int64_t B = 2 + int64_t(rng.below(3)), T = 64;
  Profile prof = synthetic_profile(cfg, B, T, rng);
  prof.optimizer_params_per_s = rng.below(2) ? 0 : 3e7 * (0.5 + rng.uniform());
  InstanceOptions o;
  o.memory = memory;
  Instance probe = make_instance(cfg, B, T, prof, Budgets{size_t(1) << 40, size_t(1) << 40, 0}, o);
  // Links: a weight upload takes 0.2 .. 1.5 of a forward, an offload 0.2 .. 2.
  const double f = 1e-3;
  prof.link.h2d_gbps = probe.W / (f * (0.2 + 1.3 * rng.uniform())) / 1e9;
  prof.link.d2h_gbps = probe.A / (f * (0.2 + 1.8 * rng.uniform())) / 1e9;
  if (rng.below(3) == 0) {
    prof.link.h2d_duplex_gbps = 0.7 * prof.link.h2d_gbps;
    prof.link.d2h_duplex_gbps = 0.7 * prof.link.d2h_gbps;
  }
  prof.accumulate_gbps = probe.G / (f * 0.5 * (0.1 + rng.uniform())) / 1e9;
  if (nvme) {
    prof.nvme_read_gbps = probe.A / (f * (0.5 + 2 * rng.uniform())) / 1e9;
    prof.nvme_write_gbps = probe.A / (f * (0.5 + 2 * rng.uniform())) / 1e9;
  }
  Instance in = make_instance(cfg, B, T, prof, Budgets{size_t(1) << 40, size_t(1) << 40, nvme ? size_t(1) << 40 : 0}, o);
  // 2 .. 4 weight buffers (the backward finds the top ones resident). With 1 there is no prefetch at all, which
  // the planner's window model (each window's transfers overlap its compute) does not describe.
  in.opt.exec.weight_buffers = 2 + int(rng.below(3));
  const double hi = evaluate(in, Plan::keep_all(L)).model_device_bytes;
  const double lo = std::min(evaluate(in, Plan::every(L, L)).model_device_bytes, in.fixed_peak() + in.mem.internals[0] + in.A);
  in.budget.device_bytes = size_t(lo + (hi - lo) * rng.uniform() * 1.05);
  in.budget.host_act_bytes = size_t(in.A * double(rng.below(uint64_t(L + 1))));
  if (nvme) in.budget.nvme_bytes = size_t(in.A_nvme * double(rng.below(uint64_t(L + 1))));
  return in;
}

}  // namespace lt::testing
