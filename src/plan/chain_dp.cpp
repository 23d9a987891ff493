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
  in.opt_embed = in.opt_head = in.opt_embed_rows = 0;
  return in;
}

namespace {

// The DP over states (stored boundary s, its tier, whether it keeps its internals, device boundaries so far, kept
// internals so far, host boundaries so far), in passes over the executor model's outer choices (y: some layer
// recomputes its internals; R: the deepest recompute run), each pass relaxing edges s -> e to the next stored
// boundary.
class ChainSearch {
 public:
  ChainSearch(const Instance& in, int64_t work_limit, double time_limit_s)
      : in_(in), L_(in.L), dp_(in), kept_(in, double(in.budget.device_bytes)), work_limit_(work_limit),
        time_limit_s_(time_limit_s) {
    budget_ = double(in.budget.device_bytes);
    lifetime_ = in.memory == MemoryModel::lifetime;
    tiers_ = in.allow_host ? 2 : 1;  // 0 device, 1 host
    dp_.nd_cap = std::min<int64_t>(L_, int64_t(budget_ / in.A));
    // Host-tier boundaries are counted only when the host budget can bind.
    const double host_budget = double(in.budget.host_act_bytes) + 0.5;  // evaluate()'s tolerance
    count_host_ = in.allow_host && host_budget < in.A * double(L_ - 1);
    nh_cap_ = count_host_ ? std::min<int64_t>(L_, int64_t(host_budget / in.A)) : 0;
    ND_ = dp_.nd_cap + 1;
    NK_ = kept_.states;
    NH_ = nh_cap_ + 1;
    S_ = in.recompute_scratch();
  }

  ChainResult run() {
    ChainResult best;
    best.complete = true;
    // Executor model: enumerate y and R; its windows then peak in F(L-1), H or B(L-1), each a function of the
    // totals (checked at the end).
    std::vector<Outer> outers;
    if (lifetime_) {
      outers.push_back({1, L_ - 1});
    } else {
      outers.push_back({0, 0});
      for (int64_t R = 0; R < L_; ++R) outers.push_back({1, R});
    }
    for (const Outer& o : outers) {
      if (!pass(o)) {
        best.complete = false;
        break;
      }
    }
    best.seconds = timer_.seconds();
    best.states = work_;
    if (best_obj_ < kInf) {
      best.feasible = true;
      best.plan = best_plan_;
      best.objective = evaluate(in_, best_plan_).iteration_s;
    }
    return best;
  }

 private:
  struct Outer {
    int y;
    int64_t R;
  };

  size_t idx(int64_t s, int t, int k, int64_t nd, int64_t nk, int64_t nh) const {
    return (((((size_t(s) * 2 + size_t(t)) * 2 + size_t(k)) * size_t(ND_) + size_t(nd)) * size_t(NK_)) + size_t(nk)) *
               size_t(NH_) +
           size_t(nh);
  }
  void relax(size_t to, size_t from, double total) {
    if (total < val_[to]) {
      val_[to] = total;
      parent_[to] = int64_t(from);
    }
  }
  // Counts one unit of work; false once the work or time limit is reached.
  bool spend() {
    ++work_;
    return !((work_limit_ > 0 && work_ > work_limit_) ||
             (time_limit_s_ > 0 && (work_ & 0xffff) == 0 && timer_.seconds() > time_limit_s_));
  }

  // One pass for (y, R); false when the limits cut it short.
  bool pass(const Outer& o) {
    const size_t n_states = size_t(L_ + 1) * 4 * size_t(ND_) * size_t(NK_) * size_t(NH_);
    val_.assign(n_states, kInf);
    parent_.assign(n_states, -1);
    const double yI = double(o.y) * S_;
    static_extra_ = std::max({in_.fixed_window(in_.fwd(L_ - 1)) + yI, in_.fixed_window(in_.head_window()) + yI,
                              in_.fixed_window(in_.bwd(L_ - 1)) + yI + double(o.R) * in_.A});
    if (!lifetime_ && static_extra_ > budget_) return true;
    seed(o);
    for (int64_t s = 0; s < L_; ++s)
      for (int ts = 0; ts < (s == 0 ? 2 : tiers_); ++ts)
        for (int ks = 0; ks < 2; ++ks)
          for (int64_t nd = 0; nd < ND_; ++nd)
            for (int64_t nk = 0; nk < NK_; ++nk)
              for (int64_t nh = 0; nh < NH_; ++nh)
                if (!extend(o, State{s, ts, ks, nd, nk, nh})) return false;
    take_best();
    return true;
  }

  // Boundary 0's states (its "host" tier needs no host memory: the embedding output is there anyway).
  void seed(const Outer& o) {
    for (int t = 0; t < 2; ++t)
      for (int k = 0; k < 2; ++k) {
        if (o.y == 0 && k == 0) continue;
        const int64_t nd = t == 0 ? 1 : 0, nk = k ? kept_.add(0, 0) : 0;
        if (nd > dp_.nd_cap || nk < 0) continue;
        if (lifetime_) {
          const double m = in_.fixed_window(in_.bwd(0)) + in_.A * double(nd) + kept_.total[size_t(nk)] + (k ? 0.0 : S_);
          if (m > budget_) continue;
        }
        const double f0 = window_time(in_, in_.f[0], L_ > 1 ? in_.Wl[1] : in_.HW, 0, 0);
        const double b0 = window_time(in_, in_.b[0] + (k ? 0.0 : in_.r[0]), 0, dp_.d2h_of(0), dp_.host_of(0));
        val_[idx(0, t, k, nd, nk, 0)] = f0 + b0 + in_.prologue() + in_.epilogue();
      }
  }

  struct State {
    int64_t s;
    int ts, ks;
    int64_t nd, nk, nh;
  };

  // Every edge from state `x` to the next stored boundary e (s < e <= s + 1 + R); false when out of work.
  bool extend(const Outer& o, const State& x) {
    const size_t from = idx(x.s, x.ts, x.ks, x.nd, x.nk, x.nh);
    const double v = val_[from];
    if (v == kInf) return true;
    const bool host_s = x.ts == 1;
    const double held = in_.A * double(x.nd) + kept_.total[size_t(x.nk)];
    const int64_t e_max = std::min<int64_t>(L_, x.s + 1 + o.R);
    for (int64_t e = x.s + 1; e <= e_max; ++e) {
      if (!spend()) return false;
      if (o.y == 0 && e > x.s + 1) break;  // every layer keeps: nothing is dropped
      if (lifetime_ && e > x.s + 1) {      // the recompute cache peaks in B(e-1)
        const double m = in_.fixed_window(in_.bwd(e - 1)) + held + S_ + in_.A * double(e - 1 - x.s);
        if (m > budget_) break;
      }
      const double mid = dp_.between(x.s, e, host_s);
      if (e == L_) {
        // Final memory checks.
        if (lifetime_) {
          const int keep_last = x.s == L_ - 1 ? x.ks : 0;
          const double mf = in_.fixed_window(in_.fwd(L_ - 1)) + held + (keep_last ? 0.0 : S_);
          const double mh = in_.fixed_window(in_.head_window()) + held;
          if (mf > budget_ || mh > budget_) continue;
        } else if (static_extra_ + held > budget_) {
          continue;
        }
        relax(idx(L_, 0, 0, x.nd, x.nk, x.nh), from, v + mid + dp_.head_window(x.s, host_s));
        continue;
      }
      for (int te = 0; te < tiers_; ++te)
        for (int ke = 0; ke < 2; ++ke) {
          if (o.y == 0 && ke == 0) continue;
          const int64_t nd2 = x.nd + (te == 0 ? 1 : 0), nk2 = ke ? kept_.add(x.nk, e) : x.nk;
          const int64_t nh2 = x.nh + (count_host_ && te == 1 ? 1 : 0);
          if (nd2 > dp_.nd_cap || nk2 < 0 || nh2 > nh_cap_) continue;
          const double held2 = in_.A * double(nd2) + kept_.total[size_t(nk2)];
          if (held2 > budget_) continue;
          if (lifetime_ && in_.fixed_window(in_.bwd(e)) + held2 + (ke ? 0.0 : S_) > budget_) continue;
          const double fe = te == 1 ? dp_.f_host[size_t(e)] : dp_.f_plain[size_t(e)];
          relax(idx(e, te, ke, nd2, nk2, nh2), from, v + mid + fe + dp_.stored_bwd(x.s, e, host_s, ke == 1));
        }
    }
    return true;
  }

  // The best end state of this pass, if better than the best so far.
  void take_best() {
    for (int64_t nd = 0; nd < ND_; ++nd)
      for (int64_t nk = 0; nk < NK_; ++nk)
        for (int64_t nh = 0; nh < NH_; ++nh) {
          const size_t end = idx(L_, 0, 0, nd, nk, nh);
          if (val_[end] >= best_obj_) continue;
          best_obj_ = val_[end];
          best_plan_ = reconstruct(end);
        }
  }

  // The plan of an end state, following parents back to boundary 0.
  Plan reconstruct(size_t end) const {
    Plan p;
    p.name = "chain-dp";
    p.boundary.assign(size_t(L_ + 1), Tier::drop);
    p.keep_internals.assign(size_t(L_), false);
    p.boundary[size_t(L_)] = Tier::device;
    size_t cur = size_t(parent_[end]);
    while (true) {
      size_t rest = cur / size_t(NH_) / size_t(NK_) / size_t(ND_);
      const int k = int(rest % 2);
      rest /= 2;
      const int t = int(rest % 2);
      rest /= 2;
      const int64_t s = int64_t(rest);
      p.boundary[size_t(s)] = t == 0 ? Tier::device : Tier::host;
      p.keep_internals[size_t(s)] = k == 1;
      if (s == 0) break;
      cur = size_t(parent_[cur]);
    }
    return p;
  }

  const Instance& in_;
  const int64_t L_;
  Dp dp_;
  const KeptCounts kept_;
  const int64_t work_limit_;
  const double time_limit_s_;
  Timer timer_;
  double budget_ = 0, S_ = 0, static_extra_ = 0;
  bool lifetime_ = false, count_host_ = false;
  int tiers_ = 1;
  int64_t nh_cap_ = 0, ND_ = 1, NK_ = 1, NH_ = 1;
  std::vector<double> val_;
  std::vector<int64_t> parent_;
  int64_t work_ = 0;
  double best_obj_ = kInf;
  Plan best_plan_;
};

}  // namespace

ChainResult chain_dp(const Instance& in, int64_t work_limit, double time_limit_s) {
  LT_CHECK(in.restricted, "chain_dp solves the restricted problem: build the instance with restrict_instance()");
  return ChainSearch(in, work_limit, time_limit_s).run();
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
