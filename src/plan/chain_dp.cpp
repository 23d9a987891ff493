#include "plan/chain_dp.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/timer.h"

namespace lt {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Window time under the restricted rules (no NVMe): max over the channels, as evaluate() computes it.
double window_time(const Instance& in, double compute, double h2d, double d2h, double host) {
  double t = std::max(compute, h2d / in.bw_h2d);
  t = std::max(t, d2h / in.bw_d2h);
  if (in.bw_sum > 0) t = std::max(t, (h2d + d2h) / in.bw_sum);
  return std::max(t, host);
}

// The kept internals so far, as a count per distinct layer size (one group for a uniform model; Gated DeltaNet
// and attention layers for Qwen3.5), encoded mixed-radix in one index: the DP's memory state is then exact for
// layers of different sizes.
struct KeptCounts {
  std::vector<int> group;         // [L] the group of layer l
  std::vector<double> bytes;      // [groups] one layer's internals
  std::vector<int64_t> cap, stride;
  std::vector<double> total;      // [states] kept bytes of an index
  int64_t states = 1;

  KeptCounts(const Instance& in, double budget) {
    for (int64_t l = 0; l < in.L; ++l) {
      const double b = in.mem.internals[size_t(l)];
      const auto it = std::find(bytes.begin(), bytes.end(), b);
      group.push_back(int(it - bytes.begin()));
      if (it == bytes.end()) bytes.push_back(b);
    }
    cap.assign(bytes.size(), 0);
    for (int g : group) ++cap[size_t(g)];
    for (size_t g = 0; g < bytes.size(); ++g) {
      cap[g] = std::min<int64_t>(cap[g], int64_t(budget / bytes[g]));
      stride.push_back(states);
      states *= cap[g] + 1;
    }
    total.assign(size_t(states), 0.0);
    for (int64_t i = 0; i < states; ++i)
      for (size_t g = 0; g < bytes.size(); ++g) total[size_t(i)] += bytes[g] * double(count(i, int(g)));
  }
  int64_t count(int64_t i, int g) const { return (i / stride[size_t(g)]) % (cap[size_t(g)] + 1); }
  // The index with layer l's internals added, or -1 when its group is at its cap.
  int64_t add(int64_t i, int64_t l) const {
    const int g = group[size_t(l)];
    return count(i, g) < cap[size_t(g)] ? i + stride[size_t(g)] : -1;
  }
};

struct Dp {
  const Instance& in;
  const int64_t L;
  int64_t nd_cap = 0;
  double budget = 0;
  // F(l) with boundary l not offloaded (dropped or device) and with it offloaded (host)
  std::vector<double> f_plain, f_host;
  // prefix sums over l of f_plain; of plain interior backward windows B(k) (compute b+r, h2d W), [1]: with
  // the source boundary at or above the first resident layer (h2d 0: exec/weight_buffers.h)
  std::vector<double> f_prefix, b_prefix[2];
  int64_t resident = 0;  // Instance::first_resident()

  explicit Dp(const Instance& i) : in(i), L(i.L) {
    budget = double(in.budget.device_bytes);
    resident = in.first_resident();
    f_plain.resize(size_t(L));
    f_host.resize(size_t(L));
    for (int64_t l = 0; l < L; ++l) {
      const double up = l + 1 < L ? in.Wl[size_t(l + 1)] : in.HW;
      f_plain[size_t(l)] = window_time(in, in.f[size_t(l)], up, 0, 0);
      f_host[size_t(l)] = window_time(in, in.f[size_t(l)], up, in.A, 0);
    }
    f_prefix.assign(size_t(L + 1), 0.0);
    for (auto& b : b_prefix) b.assign(size_t(L + 1), 0.0);
    for (int64_t k = 0; k < L; ++k) {
      f_prefix[size_t(k + 1)] = f_prefix[size_t(k)] + f_plain[size_t(k)];
      for (int res = 0; res < 2; ++res)
        b_prefix[res][size_t(k + 1)] = b_prefix[res][size_t(k)] + interior(k, -1, -1, false, res == 1);
    }
  }
  double d2h_of(int64_t k) const { return in.grads_down(k); }
  double host_of(int64_t k) const { return in.accumulate_in(k); }

  // Backward window B(k) of a dropped boundary k inside the run (s, e); s = e = -1: a plain interior window.
  // resident_src: the run's source is at or above the first resident layer, so no weights are uploaded.
  double interior(int64_t k, int64_t s, int64_t e, bool host_s, bool resident_src) const {
    double compute = in.b[size_t(k)] + in.r[size_t(k)];
    double h2d = k >= 1 && !resident_src ? in.Wl[size_t(k - 1)] : 0.0;
    if (e >= 0 && k == e - 1) {
      for (int64_t m = s; m < k; ++m) compute += in.f[size_t(m)];  // the segment: whole forwards
      if (!resident_src) h2d += in.weights_of(s, k);
    }
    if (s >= 0 && k - 1 == s && host_s) h2d += in.A;
    return window_time(in, compute, h2d, d2h_of(k), host_of(k));
  }
  // Σ of windows strictly between stored boundaries s and e (F(l) and B(l) for s < l < e).
  double between(int64_t s, int64_t e, bool host_s) const {
    if (e <= s + 1) return 0.0;
    const bool res = s >= resident;
    double t = f_prefix[size_t(e)] - f_prefix[size_t(s + 1)];
    t += b_prefix[res][size_t(e)] - b_prefix[res][size_t(s + 1)];
    // Replace the special windows: B(s+1) (own reload of s) and B(e-1) (the segment).
    std::vector<int64_t> special = {s + 1};
    if (e - 1 != s + 1) special.push_back(e - 1);
    for (int64_t k : special) t += interior(k, s, e, host_s, res) - interior(k, -1, -1, false, res);
    return t;
  }
  // B(e) for a stored e (1 <= e < L) reached from s (the source of e - 1, whose weights it uploads).
  double stored_bwd(int64_t s, int64_t e, bool host_s, bool keep_e) const {
    const double compute = in.b[size_t(e)] + (keep_e ? 0.0 : in.r[size_t(e)]);
    const double h2d = (s >= resident ? 0.0 : in.Wl[size_t(e - 1)]) + (host_s ? in.A : 0.0);
    return window_time(in, compute, h2d, d2h_of(e), host_of(e));
  }
  double head_window(int64_t s, bool host_s) const {
    const double h2d = (s >= resident ? 0.0 : in.Wl[size_t(L - 1)]) + (host_s ? in.A : 0.0);  // layer L-1 again
    // The head's compute with the backward's first uploads under it; then (the executor's fence) B(L-1)'s
    // compute may wait for the head gradients' download.
    return window_time(in, in.head, h2d, 0.0, 0.0) + (in.head_fence ? in.HG / in.bw_d2h : 0.0);
  }
};

}  // namespace

Instance restrict_instance(const Instance& in0) {
  Instance in = in0;
  in.restricted = true;
  in.opt.restricted = true;
  in.allow_nvme = false;
  in.opt_layer.assign(in.opt_layer.size(), 0.0);
  in.opt_embed = in.opt_head = 0;
  return in;
}

ChainResult chain_dp(const Instance& in, int64_t work_limit, double time_limit_s) {
  LT_CHECK(in.restricted, "chain_dp solves the restricted problem: build the instance with restrict_instance()");
  Timer timer;
  ChainResult best;
  best.complete = true;
  const int64_t L = in.L;
  Dp dp(in);
  const double budget = double(in.budget.device_bytes);
  const bool lifetime = in.memory == MemoryModel::lifetime;
  const int tiers = in.allow_host ? 2 : 1;  // 0 device, 1 host
  dp.nd_cap = std::min<int64_t>(L, int64_t(budget / in.A));
  const KeptCounts kept(in, budget);
  // Host-tier boundaries are counted only when the host budget can bind.
  const double host_budget = double(in.budget.host_act_bytes) + 0.5;  // evaluate()'s tolerance
  const bool count_host = in.allow_host && host_budget < in.A * double(L - 1);
  const int64_t nh_cap = count_host ? std::min<int64_t>(L, int64_t(host_budget / in.A)) : 0;
  const int64_t ND = dp.nd_cap + 1, NK = kept.states, NH = nh_cap + 1;
  auto idx = [&](int64_t s, int t, int k, int64_t nd, int64_t nk, int64_t nh) {
    return (((((size_t(s) * 2 + size_t(t)) * 2 + size_t(k)) * size_t(ND) + size_t(nd)) * size_t(NK)) + size_t(nk)) *
               size_t(NH) +
           size_t(nh);
  };
  const size_t n_states = size_t(L + 1) * 4 * size_t(ND) * size_t(NK) * size_t(NH);
  std::vector<double> val;
  std::vector<int64_t> parent;
  int64_t work = 0;
  double best_obj = kInf;
  Plan best_plan;

  // Executor model: enumerate the scratch (y: some layer recomputes its internals) and the recompute depth R;
  // its windows then peak in F(L-1), H or B(L-1), each a function of the totals (checked at the end).
  struct Outer {
    int y;
    int64_t R;
  };
  std::vector<Outer> outers;
  if (lifetime) outers.push_back({1, L - 1});
  else {
    outers.push_back({0, 0});
    for (int64_t R = 0; R < L; ++R) outers.push_back({1, R});
  }
  for (const Outer& o : outers) {
    val.assign(n_states, kInf);
    parent.assign(n_states, -1);
    const double S = in.recompute_scratch();
    const double yI = double(o.y) * S;
    const double static_extra = std::max({in.fixed_window(in.fwd(L - 1)) + yI, in.fixed_window(in.head_window()) + yI,
                                          in.fixed_window(in.bwd(L - 1)) + yI + double(o.R) * in.A});
    if (!lifetime && static_extra > budget) continue;
    // Base: boundary 0 (its "host" tier needs no host memory: the embedding output is there anyway).
    for (int t = 0; t < 2; ++t)
      for (int k = 0; k < 2; ++k) {
        if (o.y == 0 && k == 0) continue;
        const int64_t nd = t == 0 ? 1 : 0, nk = k ? kept.add(0, 0) : 0;
        if (nd > dp.nd_cap || nk < 0) continue;
        if (lifetime) {
          const double m = in.fixed_window(in.bwd(0)) + in.A * double(nd) + kept.total[size_t(nk)] +
                           (k ? 0.0 : S);
          if (m > budget) continue;
        }
        const double f0 = window_time(in, in.f[0], L > 1 ? in.Wl[1] : in.HW, 0, 0);
        const double b0 = window_time(in, in.b[0] + (k ? 0.0 : in.r[0]), 0, dp.d2h_of(0), dp.host_of(0));
        val[idx(0, t, k, nd, nk, 0)] = f0 + b0 + in.prologue() + in.epilogue();
      }
    for (int64_t s = 0; s < L; ++s)
      for (int ts = 0; ts < (s == 0 ? 2 : tiers); ++ts)
        for (int ks = 0; ks < 2; ++ks)
          for (int64_t nd = 0; nd < ND; ++nd)
            for (int64_t nk = 0; nk < NK; ++nk)
              for (int64_t nh = 0; nh < NH; ++nh) {
              const size_t from = idx(s, ts, ks, nd, nk, nh);
              const double v = val[from];
              if (v == kInf) continue;
              const bool host_s = ts == 1;
              const int64_t e_max = std::min<int64_t>(L, s + 1 + o.R);
              for (int64_t e = s + 1; e <= e_max; ++e) {
                ++work;
                if ((work_limit > 0 && work > work_limit) ||
                    (time_limit_s > 0 && (work & 0xffff) == 0 && timer.seconds() > time_limit_s)) {
                  best.complete = false;
                  goto done;
                }
                if (o.y == 0 && e > s + 1) break;  // every layer keeps: nothing is dropped
                if (lifetime && e > s + 1) {  // the recompute cache peaks in B(e-1)
                  const double m = in.fixed_window(in.bwd(e - 1)) + in.A * double(nd) + kept.total[size_t(nk)] + S +
                                   in.A * double(e - 1 - s);
                  if (m > budget) break;
                }
                const double mid = dp.between(s, e, host_s);
                if (e == L) {
                  const double total = v + mid + dp.head_window(s, host_s);
                  // Final memory checks.
                  if (lifetime) {
                    const int keep_last = s == L - 1 ? ks : 0;
                    const double mf = in.fixed_window(in.fwd(L - 1)) + in.A * double(nd) + kept.total[size_t(nk)] +
                                      (keep_last ? 0.0 : S);
                    const double mh = in.fixed_window(in.head_window()) + in.A * double(nd) + kept.total[size_t(nk)];
                    if (mf > budget || mh > budget) continue;
                  } else if (static_extra + in.A * double(nd) + kept.total[size_t(nk)] > budget) {
                    continue;
                  }
                  const size_t to = idx(L, 0, 0, nd, nk, nh);
                  if (total < val[to]) {
                    val[to] = total;
                    parent[to] = int64_t(from);
                  }
                  continue;
                }
                for (int te = 0; te < tiers; ++te)
                  for (int ke = 0; ke < 2; ++ke) {
                    if (o.y == 0 && ke == 0) continue;
                    const int64_t nd2 = nd + (te == 0 ? 1 : 0), nk2 = ke ? kept.add(nk, e) : nk;
                    const int64_t nh2 = nh + (count_host && te == 1 ? 1 : 0);
                    if (nd2 > dp.nd_cap || nk2 < 0 || nh2 > nh_cap) continue;
                    if (in.A * double(nd2) + kept.total[size_t(nk2)] > budget) continue;
                    if (lifetime) {
                      const double m = in.fixed_window(in.bwd(e)) + in.A * double(nd2) + kept.total[size_t(nk2)] +
                                       (ke ? 0.0 : S);
                      if (m > budget) continue;
                    }
                    const double fe = te == 1 ? dp.f_host[size_t(e)] : dp.f_plain[size_t(e)];
                    const double total = v + mid + fe + dp.stored_bwd(s, e, host_s, ke == 1);
                    const size_t to = idx(e, te, ke, nd2, nk2, nh2);
                    if (total < val[to]) {
                      val[to] = total;
                      parent[to] = int64_t(from);
                    }
                  }
              }
            }
    // Best end state of this pass.
    for (int64_t nd = 0; nd < ND; ++nd)
      for (int64_t nk = 0; nk < NK; ++nk)
        for (int64_t nh = 0; nh < NH; ++nh) {
        const size_t end = idx(L, 0, 0, nd, nk, nh);
        if (val[end] >= best_obj) continue;
        // Reconstruct.
        Plan p;
        p.name = "chain-dp";
        p.boundary.assign(size_t(L + 1), Tier::drop);
        p.keep_internals.assign(size_t(L), false);
        p.boundary[size_t(L)] = Tier::device;
        size_t cur = size_t(parent[end]);
        while (true) {
          size_t rest = cur / size_t(NH);
          const size_t nk_i = rest % size_t(NK);
          rest /= size_t(NK);
          rest /= size_t(ND);
          const int k = int(rest % 2);
          rest /= 2;
          const int t = int(rest % 2);
          rest /= 2;
          const int64_t s = int64_t(rest);
          (void)nk_i;
          p.boundary[size_t(s)] = t == 0 ? Tier::device : Tier::host;
          p.keep_internals[size_t(s)] = k == 1;
          if (s == 0) break;
          cur = size_t(parent[cur]);
        }
        best_obj = val[end];
        best_plan = p;
      }
  }
done:
  best.seconds = timer.seconds();
  best.states = work;
  if (best_obj < kInf) {
    best.feasible = true;
    best.plan = best_plan;
    best.objective = evaluate(in, best_plan).iteration_s;
  }
  return best;
}

ChainResult brute_force(const Instance& in) {
  LT_CHECK(in.restricted, "brute_force enumerates the restricted problem: build the instance with restrict_instance()");
  LT_CHECK(in.L <= 10, "brute force over {} layers is too large (at most 10)", in.L);
  Timer timer;
  ChainResult best;
  const int64_t L = in.L;
  // Per boundary 1..L-1: 0 drop, 1 device, 2 device+keep, 3 host, 4 host+keep; boundary 0: 1..4.
  std::vector<int> code(static_cast<size_t>(L), 0);
  code[0] = 1;
  for (int64_t i = 1; i < L; ++i) code[size_t(i)] = 0;
  Plan p;
  p.name = "brute-force";
  p.boundary.assign(size_t(L + 1), Tier::drop);
  p.boundary[size_t(L)] = Tier::device;
  p.keep_internals.assign(size_t(L), false);
  double best_obj = kInf;
  while (true) {
    bool ok = true;
    for (int64_t i = 0; i < L; ++i) {
      const int c = code[size_t(i)];
      if ((c == 3 || c == 4) && !in.allow_host && i > 0) ok = false;
      p.boundary[size_t(i)] = c == 0 ? Tier::drop : c <= 2 ? Tier::device : Tier::host;
      p.keep_internals[size_t(i)] = c == 2 || c == 4;
    }
    if (ok) {
      ++best.states;
      Prediction pr = evaluate(in, p);
      if (pr.feasible && pr.iteration_s < best_obj) {
        best_obj = pr.iteration_s;
        best.plan = p;
      }
    }
    int64_t i = 0;
    for (; i < L; ++i) {
      if (++code[size_t(i)] <= 4) break;
      code[size_t(i)] = i == 0 ? 1 : 0;
    }
    if (i == L) break;
  }
  best.seconds = timer.seconds();
  if (best_obj < kInf) {
    best.feasible = true;
    best.objective = best_obj;
  }
  return best;
}

}  // namespace lt
