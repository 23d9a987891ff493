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
  p.embed_backward_s = 2e-5;
  p.accumulate_gbps = 100;
  p.link = {1, 1, 0, 0, 0};
  return p;
}

// A random instance with L layers. Byte sizes and times are redrawn after make_instance so that boundaries,
// internals and weights take comparable room and transfers compare with compute in every direction.
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
  in.A = MB * (0.5 + rng.uniform());
  in.A_nvme = in.A;
  in.I = in.A * (0.5 + 4 * rng.uniform());
  in.W = MB * (0.3 + 2 * rng.uniform());
  in.G = in.W * (1 + rng.uniform());
  in.HW = in.W * (0.5 + rng.uniform());
  in.HG = in.HW * 2;
  in.BS = in.I * (0.5 + rng.uniform());
  in.tokens = 1e3;
  for (double* x : {&in.A, &in.A_nvme, &in.I, &in.W, &in.G, &in.HW, &in.HG, &in.BS}) *x = 256 * std::ceil(*x / 256);
  // Bandwidths: a weight upload takes 0.2 .. 1.5 of a forward, an offload 0.2 .. 2.
  const double f = 1e-3;
  in.bw_h2d = in.W / (f * (0.2 + 1.3 * rng.uniform()));
  in.bw_d2h = in.A / (f * (0.2 + 1.8 * rng.uniform()));
  in.bw_sum = rng.below(3) == 0 ? 0.8 * (in.bw_h2d + in.bw_d2h) : 0.0;
  in.acc_layer = f * 0.5 * rng.uniform();
  in.acc_head = in.acc_layer;
  if (nvme) {
    in.bw_nvme_r = in.A / (f * (0.5 + 2 * rng.uniform()));
    in.bw_nvme_w = in.A / (f * (0.5 + 2 * rng.uniform()));
  }
  // Budgets: device between the smallest plan's need and keep-all's; host for a random number of boundaries.
  Plan keep = Plan::keep_all(L);
  Plan small = Plan::every(L, L);  // everything dropped but boundary 0
  const double hi = evaluate(in, keep).model_device_bytes;
  const double lo = evaluate(in, small).model_device_bytes;
  const double lo2 = std::min(lo, in.fixed_peak() + in.I + in.A);
  in.budget.device_bytes = size_t(lo2 + (hi - lo2) * rng.uniform() * 1.05);
  in.budget.host_act_bytes = size_t(in.A * double(rng.below(uint64_t(L + 1))));
  in.allow_host = rng.below(5) != 0;
  if (nvme) in.budget.nvme_bytes = size_t(in.A * double(rng.below(uint64_t(L + 1))));
  return in;
}

// An instance whose byte sizes are the real ones of a small model (so the executor's working set, its
// packing and fences, match the instance), with random per-layer times, links and budgets.
inline Instance realistic_instance(Rng& rng, int64_t L, MemoryModel memory, bool nvme = false) {
  ModelConfig cfg = tiny_plan_config(L, rng.next_u64());
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128 + 32 * int64_t(rng.below(3));
  cfg.vocab_size = 256;
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
  const double lo = std::min(evaluate(in, Plan::every(L, L)).model_device_bytes, in.fixed_peak() + in.I + in.A);
  in.budget.device_bytes = size_t(lo + (hi - lo) * rng.uniform() * 1.05);
  in.budget.host_act_bytes = size_t(in.A * double(rng.below(uint64_t(L + 1))));
  if (nvme) in.budget.nvme_bytes = size_t(in.A_nvme * double(rng.below(uint64_t(L + 1))));
  return in;
}

}  // namespace lt::testing
