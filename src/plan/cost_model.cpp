#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace lt {
namespace {

bool stored_tier(Tier t) { return t != Tier::drop; }

std::vector<int> range(int a, int b) {  // [a, b]
  std::vector<int> v;
  for (int w = a; w <= b; ++w) v.push_back(w);
  return v;
}

}  // namespace

std::vector<int> offload_windows(const Instance& in, int64_t i) {
  if (i < 1 || i >= in.L) return {};
  const int span = in.restricted ? 1 : in.opt.offload_span;
  return range(in.fwd(i), std::min<int>(in.fwd(i) + span - 1, in.fwd(in.L - 1)));
}

std::vector<int> reload_windows(const Instance& in, int64_t i) {
  if (i < 0 || i >= in.L) return {};
  // Boundary 0's re-upload (the embedding output) stays in its natural window: then an instance with no
  // other off-device tier has no transfer to place, and the chain DP is exact for it (planner.cpp).
  const int span = in.restricted || i == 0 ? 1 : in.opt.reload_span;
  const int last = in.bwd(i) - 1;
  return range(std::max<int>(in.head_window(), last - span + 1), last);
}

std::vector<int> nvme_write_windows(const Instance& in, int64_t i) {
  if (i < 1 || i >= in.L) return {};
  return range(in.fwd(i), std::min<int>(in.fwd(i) + in.opt.nvme_span - 1, in.head_window()));
}

std::vector<int> nvme_read_windows(const Instance& in, int64_t i) {
  if (i < 1 || i >= in.L) return {};
  const int last = in.bwd(i) - 1;
  return range(std::max<int>(in.head_window(), last - in.opt.nvme_span + 1), last);
}

std::vector<int64_t> segment_sources(const Plan& plan) {
  const int64_t L = plan.num_layers();
  std::vector<int64_t> src(static_cast<size_t>(L), -1);
  for (int64_t k = 1; k < L; ++k)
    if (!stored_tier(plan.boundary[size_t(k)]) && stored_tier(plan.boundary[size_t(k + 1)]))
      src[size_t(k)] = plan.source_below(k);
  return src;
}

TransferWindows TransferWindows::natural(const Instance& in, const Plan& plan) {
  TransferWindows tw;
  const size_t n = size_t(in.L + 1);
  tw.offload.resize(n);
  tw.reload.resize(n);
  tw.nvme_write.resize(n);
  tw.nvme_read.resize(n);
  for (int64_t i = 0; i < in.L; ++i) {
    const Tier t = plan.boundary[size_t(i)];
    const bool off_device = i == 0 ? t != Tier::device : (t == Tier::host || t == Tier::nvme);
    if (!off_device) continue;
    if (i >= 1) tw.offload[size_t(i)].push_back({in.fwd(i), 1.0});
    tw.reload[size_t(i)].push_back({in.bwd(i) - 1, 1.0});
    if (i >= 1 && t == Tier::nvme) {
      tw.nvme_write[size_t(i)].push_back({in.fwd(i), 1.0});
      tw.nvme_read[size_t(i)].push_back({in.bwd(i) - 1, 1.0});
    }
  }
  return tw;
}

bool TransferWindows::is_natural(const Instance& in, const Plan& plan) const {
  TransferWindows n = natural(in, plan);
  auto same = [](const std::vector<std::vector<WindowPart>>& a, const std::vector<std::vector<WindowPart>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      std::vector<WindowPart> x, y;
      for (const auto& p : a[i])
        if (p.fraction > 1e-9) x.push_back(p);
      for (const auto& p : b[i])
        if (p.fraction > 1e-9) y.push_back(p);
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (x[k].window != y[k].window || std::abs(x[k].fraction - y[k].fraction) > 1e-6) return false;
    }
    return true;
  };
  return same(offload, n.offload) && same(reload, n.reload) && same(nvme_write, n.nvme_write) &&
         same(nvme_read, n.nvme_read);
}

nlohmann::json TransferWindows::to_json(const Instance& in) const {
  nlohmann::json arr = nlohmann::json::array();
  auto emit = [&](const char* kind, const std::vector<std::vector<WindowPart>>& v) {
    for (size_t i = 0; i < v.size(); ++i)
      for (const WindowPart& p : v[i])
        if (p.fraction > 1e-9)
          arr.push_back({{"boundary", i},
                         {"kind", kind},
                         {"window", in.window_name(p.window)},
                         {"bytes", int64_t(std::llround(p.fraction * in.A))},
                         {"fraction", p.fraction}});
  };
  emit("offload", offload);
  emit("nvme_write", nvme_write);
  emit("nvme_read", nvme_read);
  emit("reload", reload);
  return arr;
}

TransferWindows TransferWindows::from_json(const nlohmann::json& j, const Instance& in, const std::string& src) {
  LT_CHECK(j.is_array(), "{}: \"windows\" must be a list of {{boundary, kind, window, fraction}}", src);
  TransferWindows tw;
  const size_t n = size_t(in.L + 1);
  tw.offload.resize(n);
  tw.reload.resize(n);
  tw.nvme_write.resize(n);
  tw.nvme_read.resize(n);
  for (size_t k = 0; k < j.size(); ++k) {
    const auto& e = j[k];
    LT_CHECK(e.is_object() && e.contains("boundary") && e.contains("kind") && e.contains("window"),
             "{}: windows[{}] needs boundary, kind and window", src, k);
    const int64_t i = e["boundary"].get<int64_t>();
    LT_CHECK(i >= 0 && i <= in.L, "{}: windows[{}]: boundary {} is not in 0..{}", src, k, i, in.L);
    const int w = in.window_from_name(e["window"].get<std::string>());
    LT_CHECK(w >= 0, "{}: windows[{}]: '{}' is not a window (F0..F{}, H, B{}..B0)", src, k,
             e["window"].get<std::string>(), in.L - 1, in.L - 1);
    double frac = e.contains("fraction") ? e["fraction"].get<double>() : e.value("bytes", 0.0) / in.A;
    const std::string kind = e["kind"].get<std::string>();
    std::vector<std::vector<WindowPart>>* dst = kind == "offload"      ? &tw.offload
                                                : kind == "reload"     ? &tw.reload
                                                : kind == "nvme_write" ? &tw.nvme_write
                                                : kind == "nvme_read"  ? &tw.nvme_read
                                                                       : nullptr;
    LT_CHECK(dst, "{}: windows[{}]: kind '{}' is not offload, reload, nvme_write or nvme_read", src, k, kind);
    (*dst)[size_t(i)].push_back({w, frac});
  }
  return tw;
}

std::vector<double> window_device_bytes(const Instance& in, const Plan& plan0, MemoryModel model) {
  const Plan plan = normalize_plan(plan0);
  // The executor's: its schedule's buffers as linear terms (the recompute buffers all step and the recompute
  // cache, at the deepest run, over the backward whenever any layer needs them).
  if (model == MemoryModel::executor) return in.mem.window_bytes(plan);
  // Finer lifetimes: the scratch only in windows that recompute, the cache only as deep as the run rebuilt.
  const int64_t L = in.L;
  std::vector<double> bytes = in.mem.stored_bytes(plan);
  for (int w = 0; w < in.num_windows(); ++w) {
    double& m = bytes[size_t(w)];
    if (w < L) {
      if (!plan.keep_internals[size_t(w)]) m += in.recompute_scratch();  // layer w's internals: the scratch
    } else if (w > L) {
      const int64_t k = 2 * L - w;
      if (!plan.keep_internals[size_t(k)]) m += in.recompute_scratch();  // the recomputed internals
      // The recompute cache in B(k), k dropped: boundaries source+1 .. k, rebuilt at the run's top and kept
      // until their own backward.
      if (!plan.stored(k)) m += double(k - plan.source_below(k)) * in.A;
    }
  }
  return bytes;
}

namespace {

void fail(Prediction& p, std::string why) {
  p.feasible = false;
  p.violations.push_back(std::move(why));
}

// Compute per window: forwards, the head, backwards with recomputed internals and recompute segments. The step's
// FLOPs.
void add_compute(const Instance& in, const Plan& plan, const std::vector<int64_t>& src, Prediction& p) {
  const int64_t L = in.L;
  auto& win = p.windows;
  double flops = 0;
  for (int64_t l = 0; l < L; ++l) {
    win[size_t(in.fwd(l))].compute_s += in.f[size_t(l)];
    flops += in.layer_flops[size_t(l)];
  }
  win[size_t(in.head_window())].compute_s += in.head;
  flops += in.head_flops;
  for (int64_t k = 0; k < L; ++k) {
    WindowCost& c = win[size_t(in.bwd(k))];
    c.compute_s += in.b[size_t(k)];
    flops += 2 * in.layer_flops[size_t(k)];
    // Recomputed internals: the layer's forward but the down projection (model/block.h); a recompute segment
    // runs whole forwards.
    if (!plan.keep_internals[size_t(k)]) {
      c.compute_s += in.r[size_t(k)];
      c.recompute_s += in.r[size_t(k)];
      flops += in.layer_flops[size_t(k)] * (1 - in.mlp_share[size_t(k)] / 3);
    }
    if (src[size_t(k)] >= 0)
      for (int64_t m = src[size_t(k)]; m < k; ++m) {
        c.compute_s += in.f[size_t(m)];
        c.recompute_s += in.f[size_t(m)];
        flops += in.layer_flops[size_t(m)];
      }
  }
  p.real_flops = flops;
}

// The transfers every plan makes: weights up (the backward's by exec/weight_buffers.h's rule), gradients down and
// their accumulation, a recompute segment's source fetched once more.
void add_mandatory_traffic(const Instance& in, const Plan& plan, const std::vector<int64_t>& src, Prediction& p) {
  const int64_t L = in.L;
  auto& win = p.windows;
  auto tier = [&](int64_t i) { return plan.boundary[size_t(i)]; };
  for (int64_t l = 0; l < L; ++l) win[size_t(in.fwd(l))].h2d_bytes += l + 1 < L ? in.Wl[size_t(l + 1)] : in.HW;
  // Backward weights (exec/weight_buffers.h): nothing while the source boundary of what a window needs is at
  // or above the lowest layer the forward left on the device; else layer L-1 again in the head window if a
  // segment below it ran first, and in B(k) the segment's layers and layer k-1 (the next window's first).
  const int64_t resident = in.first_resident();
  auto source = [&](int64_t i) { return plan.source_below(i); };
  if (source(L - 1) < resident) win[size_t(in.head_window())].h2d_bytes += in.Wl[size_t(L - 1)];
  for (int64_t k = 1; k < L; ++k) {
    double& h2d = win[size_t(in.bwd(k))].h2d_bytes;
    if (src[size_t(k)] >= 0 && src[size_t(k)] < resident) h2d += in.weights_of(src[size_t(k)], k);  // the segment
    if (source(k - 1) < resident) h2d += in.Wl[size_t(k - 1)];              // the next window's first
  }
  for (int64_t k = 0; k < L; ++k) {
    WindowCost& c = win[size_t(in.bwd(k))];
    c.d2h_bytes += in.grads_down(k);
    c.host_s += in.accumulate_in(k);
  }
  // A recompute segment from a boundary off the device fetches it once more (from NVMe: reads it once more),
  // in the window before the segment.
  for (int64_t k = 1; k < L; ++k) {
    const int64_t s = src[size_t(k)];
    if (s < 0) continue;
    if (tier(s) != Tier::device) win[size_t(in.bwd(k) - 1)].h2d_bytes += in.A;
    if (tier(s) == Tier::nvme) win[size_t(in.bwd(k) - 1)].nvme_read_bytes += in.A;
  }
}

// The plan's activation transfers in their windows (each share within the windows allowed, adding up to its tier),
// NVMe staging in host memory; the host tier's bytes.
void add_activation_transfers(const Instance& in, const Plan& plan, const TransferWindows& tw, Prediction& p,
                              std::vector<double>& staged, double& host_tier) {
  const int64_t L = in.L;
  auto& win = p.windows;
  const int nw = in.num_windows();
  auto tier = [&](int64_t i) { return plan.boundary[size_t(i)]; };
  auto check_parts = [&](const char* what, int64_t i, const std::vector<WindowPart>& parts, double need,
                         const std::vector<int>& allowed) {
    double sum = 0;
    for (const WindowPart& q : parts) {
      sum += q.fraction;
      if (q.fraction < -1e-9) fail(p, fmt::format("boundary {}: negative {} share", i, what));
      if (std::find(allowed.begin(), allowed.end(), q.window) == allowed.end() && q.fraction > 1e-9)
        fail(p, fmt::format("boundary {}: {} in window {} (allowed: {} .. {})", i, what, in.window_name(q.window),
                         allowed.empty() ? "none" : in.window_name(allowed.front()),
                         allowed.empty() ? "none" : in.window_name(allowed.back())));
    }
    if (std::abs(sum - need) > 1e-6) fail(p, fmt::format("boundary {}: {} shares sum to {:.6f}, need {}", i, what, sum, need));
  };
  // Boundaries (fractions) offloaded but not yet written, and read but not yet fetched, per window: the
  // executor has kNvmeSlots staging slots each way.
  constexpr double kNvmeSlots = 2;
  std::vector<double> wstage(static_cast<size_t>(nw), 0.0), rstage(static_cast<size_t>(nw), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    const Tier t = tier(i);
    const bool off_device = i == 0 ? t != Tier::device : (t == Tier::host || t == Tier::nvme);
    const double need = off_device ? 1.0 : 0.0;
    if (i >= 1) check_parts("offload", i, tw.offload[size_t(i)], need, offload_windows(in, i));
    check_parts("reload", i, tw.reload[size_t(i)], need, reload_windows(in, i));
    const double nv = t == Tier::nvme && i >= 1 ? 1.0 : 0.0;
    if (i >= 1) {
      check_parts("nvme write", i, tw.nvme_write[size_t(i)], nv, nvme_write_windows(in, i));
      check_parts("nvme read", i, tw.nvme_read[size_t(i)], nv, nvme_read_windows(in, i));
    }
    if (t == Tier::host && i >= 1) host_tier += in.A;
    if (t == Tier::nvme && !in.allow_nvme) fail(p, fmt::format("boundary {} is on NVMe but this instance has no NVMe tier", i));
    if (t == Tier::host && i >= 1 && !in.allow_host) fail(p, fmt::format("boundary {} is on the host but the host tier is off", i));
    for (const WindowPart& q : tw.offload[size_t(i)]) win[size_t(q.window)].d2h_bytes += q.fraction * in.A;
    for (const WindowPart& q : tw.reload[size_t(i)]) win[size_t(q.window)].h2d_bytes += q.fraction * in.A;
    for (const WindowPart& q : tw.nvme_write[size_t(i)]) win[size_t(q.window)].nvme_write_bytes += q.fraction * in.A;
    for (const WindowPart& q : tw.nvme_read[size_t(i)]) win[size_t(q.window)].nvme_read_bytes += q.fraction * in.A;
    if (nv > 0) {  // staged on the host: offloaded but not yet written, or read but not yet reloaded
      auto cum = [&](const std::vector<WindowPart>& parts, int w, bool inclusive) {
        double s = 0;
        for (const WindowPart& q : parts)
          if (q.window < w || (inclusive && q.window == w)) s += q.fraction;
        return s;
      };
      for (int w = 0; w < nw; ++w) {
        const double off = cum(tw.offload[size_t(i)], w, true), wr = cum(tw.nvme_write[size_t(i)], w, false);
        const double rd = cum(tw.nvme_read[size_t(i)], w, true), rl = cum(tw.reload[size_t(i)], w, false);
        staged[size_t(w)] += in.A * (off - wr + rd - rl);
        wstage[size_t(w)] += off - wr;
        rstage[size_t(w)] += rd - rl;
        if (cum(tw.nvme_write[size_t(i)], w, true) > off + 1e-6)
          fail(p, fmt::format("boundary {}: NVMe write in {} before its offload", i, in.window_name(w)));
        if (cum(tw.reload[size_t(i)], w, true) > rd + 1e-6)
          fail(p, fmt::format("boundary {}: reload in {} before its NVMe read", i, in.window_name(w)));
      }
      p.nvme_bytes += in.A_nvme;
    }
  }

  for (int w = 0; w < nw; ++w)
    if (wstage[size_t(w)] > kNvmeSlots + 1e-6 || rstage[size_t(w)] > kNvmeSlots + 1e-6)
      fail(p, fmt::format("window {}: more than {} boundaries waiting in NVMe staging", in.window_name(w), kNvmeSlots));
}

// Each window's time (the slowest of its channels) and what it exposes; the step's totals.
void time_windows(const Instance& in, Prediction& p) {
  auto& win = p.windows;
  const int nw = in.num_windows();
  if (in.head_fence) {  // B(L-1)'s compute waits for the head gradients' download
    p.fence_s = in.HG / in.bw_d2h;
    p.exposed_d2h_s += p.fence_s;
  }
  for (int w = 0; w < nw; ++w) {
    WindowCost& c = win[size_t(w)];
    struct Ch {
      double t;
      const char* name;
    } ch[] = {{c.compute_s, "compute"},
              {c.h2d_bytes / in.bw_h2d, "h2d"},
              {c.d2h_bytes / in.bw_d2h, "d2h"},
              {in.bw_sum > 0 ? (c.h2d_bytes + c.d2h_bytes) / in.bw_sum : 0.0, "link"},
              {(in.bw_nvme_r > 0 ? c.nvme_read_bytes / in.bw_nvme_r : 0.0) +
                   (in.bw_nvme_w > 0 ? c.nvme_write_bytes / in.bw_nvme_w : 0.0),
               "nvme"},
              {c.host_s, "host"}};
    c.time_s = 0;
    c.bound = "compute";
    for (const Ch& x : ch)
      if (x.t > c.time_s + 1e-15) {
        c.time_s = x.t;
        c.bound = x.name;
      }
    const double exposed = c.time_s - c.compute_s;
    if (exposed > 0) {
      if (c.bound == "h2d") p.exposed_h2d_s += exposed;
      else if (c.bound == "d2h") p.exposed_d2h_s += exposed;
      else if (c.bound == "link") p.exposed_link_s += exposed;
      else if (c.bound == "nvme") p.exposed_nvme_s += exposed;
      else if (c.bound == "host") p.exposed_host_s += exposed;
    }
    p.compute_s += c.compute_s;
    p.recompute_s += c.recompute_s;
    p.h2d_bytes += c.h2d_bytes;
    p.d2h_bytes += c.d2h_bytes;
    p.nvme_read_bytes += c.nvme_read_bytes;
    p.nvme_write_bytes += c.nvme_write_bytes;
  }
  p.prologue_s = in.prologue();
  p.epilogue_s = in.epilogue();
  p.h2d_bytes += in.token_upload + in.A + in.Wl[0];  // prologue
  p.d2h_bytes += in.Gl[0] + in.dx0;                   // epilogue: layer 0's gradients and dx0
  if (in.head_fence) p.d2h_bytes += in.HG;  // in the fence
  p.compute_s += in.embed_f + in.embed_rows + in.embed_b;
  p.step_s = p.prologue_s + p.epilogue_s + p.fence_s;
  for (const WindowCost& c : win) p.step_s += c.time_s;
}

// The host optimizer: slabs update in order while the next step's forward needs them.
void add_optimizer_exposure(const Instance& in, Prediction& p) {
  const int64_t L = in.L;
  auto& win = p.windows;
  if (in.has_optimizer()) {
    double e = in.opt_embed_first();  // the embedding lookup waits for the embedding's update (its rows)
    const double s0 = std::max(in.embed_f, in.token_upload / in.bw_h2d) + in.A / in.bw_h2d;
    e = std::max(e, in.opt_before(1) - s0);
    double start = p.prologue_s;  // start of window l-1: where W[l]'s upload runs
    for (int64_t l = 1; l < L; ++l) {
      e = std::max(e, in.opt_before(l + 1) - start);
      start += win[size_t(in.fwd(l - 1))].time_s;
    }
    // `start` is now the start of F(L-1), where the head weights upload.
    e = std::max(e, in.opt_before(L) + in.opt_embed_rest() + in.opt_head - start);
    p.optimizer_exposed_s = std::max(0.0, e);
  }
}

// Memory per window under the instance's model, and the budgets.
void check_memory(const Instance& in, const Plan& plan, const std::vector<double>& staged, double host_tier,
                  Prediction& p) {
  auto& win = p.windows;
  const int nw = in.num_windows();
  const std::vector<double> exec_w = window_device_bytes(in, plan, MemoryModel::executor);
  const std::vector<double> life_w = window_device_bytes(in, plan, MemoryModel::lifetime);
  const std::vector<double>& model_w = in.memory == MemoryModel::executor ? exec_w : life_w;
  for (int w = 0; w < nw; ++w) {
    win[size_t(w)].device_bytes = model_w[size_t(w)];
    win[size_t(w)].host_bytes = host_tier + staged[size_t(w)];
    p.host_act_bytes = std::max(p.host_act_bytes, win[size_t(w)].host_bytes);
  }
  p.lifetime_device_bytes = *std::max_element(life_w.begin(), life_w.end());
  p.executor_window_bytes = *std::max_element(exec_w.begin(), exec_w.end());
  p.model_device_bytes = *std::max_element(model_w.begin(), model_w.end());
  // The executor's packed block (its packing is the costly part; the restricted instances of the DP and the
  // brute force do not need it).
  if (!in.restricted)
    p.executor_device_bytes = predict_peak_device_bytes(in.cfg, in.B, in.T, plan, in.opt.exec);
  const double budget = double(in.budget.device_bytes);
  if (p.model_device_bytes > budget)
    fail(p, fmt::format("device memory {} > budget {} ({} model, in window {})", format_bytes(p.model_device_bytes),
                     format_bytes(budget), memory_model_name(in.memory),
                     in.window_name(int(std::max_element(model_w.begin(), model_w.end()) - model_w.begin()))));
  if (p.host_act_bytes > double(in.budget.host_act_bytes) + 0.5)
    fail(p, fmt::format("host activation memory {} > budget {}", format_bytes(p.host_act_bytes),
                     format_bytes(double(in.budget.host_act_bytes))));
  if (p.nvme_bytes > double(in.budget.nvme_bytes) + 0.5)
    fail(p, fmt::format("NVMe space {} > budget {}", format_bytes(p.nvme_bytes), format_bytes(double(in.budget.nvme_bytes))));
}

}  // namespace

Prediction evaluate(const Instance& in, const Plan& plan_in, const TransferWindows& tw) {
  const Plan plan = normalize_plan(plan_in);
  plan.validate(in.L);
  const int nw = in.num_windows();
  Prediction p;
  p.windows.assign(size_t(nw), WindowCost{});
  const std::vector<int64_t> src = segment_sources(plan);
  std::vector<double> staged(static_cast<size_t>(nw), 0.0);  // NVMe staging bytes in host memory per window
  double host_tier = 0;
  add_compute(in, plan, src, p);
  add_mandatory_traffic(in, plan, src, p);
  add_activation_transfers(in, plan, tw, p, staged, host_tier);
  time_windows(in, p);
  add_optimizer_exposure(in, p);
  p.iteration_s = p.step_s + p.optimizer_exposed_s;
  check_memory(in, plan, staged, host_tier, p);
  return p;
}

nlohmann::json Prediction::to_json(const Instance& in) const {
  nlohmann::json w = nlohmann::json::array();
  for (size_t i = 0; i < windows.size(); ++i) {
    const WindowCost& c = windows[i];
    w.push_back({{"window", in.window_name(int(i))},
                 {"time_s", c.time_s},
                 {"bound", c.bound},
                 {"compute_s", c.compute_s},
                 {"recompute_s", c.recompute_s},
                 {"h2d_bytes", c.h2d_bytes},
                 {"d2h_bytes", c.d2h_bytes},
                 {"nvme_read_bytes", c.nvme_read_bytes},
                 {"nvme_write_bytes", c.nvme_write_bytes},
                 {"host_s", c.host_s},
                 {"device_bytes", c.device_bytes},
                 {"host_bytes", c.host_bytes}});
  }
  return {{"feasible", feasible},
          {"violations", violations},
          {"step_s", step_s},
          {"optimizer_exposed_s", optimizer_exposed_s},
          {"iteration_s", iteration_s},
          {"fence_s", fence_s},
          {"tokens_per_s", tokens_per_s(in)},
          {"tflops", tflops_6nd(in)},
          {"tflops_real", tflops_real()},
          {"compute_s", compute_s},
          {"recompute_s", recompute_s},
          {"h2d_bytes", h2d_bytes},
          {"d2h_bytes", d2h_bytes},
          {"nvme_read_bytes", nvme_read_bytes},
          {"nvme_write_bytes", nvme_write_bytes},
          {"exposed_h2d_s", exposed_h2d_s},
          {"exposed_d2h_s", exposed_d2h_s},
          {"exposed_link_s", exposed_link_s},
          {"exposed_nvme_s", exposed_nvme_s},
          {"exposed_host_s", exposed_host_s},
          {"peak_device_bytes", model_device_bytes},
          {"lifetime_device_bytes", lifetime_device_bytes},
          {"executor_window_bytes", executor_window_bytes},
          {"executor_device_bytes", executor_device_bytes},
          {"host_act_bytes", host_act_bytes},
          {"nvme_bytes", nvme_bytes},
          {"windows", w}};
}

}  // namespace lt
