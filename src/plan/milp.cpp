// plan/milp.cpp — builds the MILP of milp.h from an Instance, solves it with CBC, decodes the plan.
//
// Units: times in seconds, memory rows in GB (1e9 bytes), transfer shares as fractions of one boundary,
// so that every coefficient lies within a few orders of magnitude of 1.
#include "plan/milp.h"

#include <coin/Cbc_C_Interface.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/timer.h"

namespace lt {

const char* solve_status_name(SolveStatus s) {
  switch (s) {
    case SolveStatus::optimal: return "optimal";
    case SolveStatus::time_limit: return "time limit";
    case SolveStatus::no_solution: return "no solution";
    case SolveStatus::infeasible: return "infeasible";
    case SolveStatus::error: return "error";
  }
  return "?";
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kGBScale = 1e-9;
constexpr double kNvmeSlots = 2;  // the executor's NVMe write and read staging slots (exec/executor.cpp)

struct Row {
  std::vector<std::pair<int, double>> terms;
  double lb, ub;
};

class Lp {
 public:
  int col(double lb, double ub, double obj, bool integer) {
    lb_.push_back(lb);
    ub_.push_back(ub);
    obj_.push_back(obj);
    int_.push_back(integer);
    return int(lb_.size()) - 1;
  }
  void row(std::vector<std::pair<int, double>> terms, double lb, double ub) {
    // Merge duplicate columns (a variable may appear through two paths).
    std::map<int, double> m;
    for (auto [c, v] : terms) m[c] += v;
    Row r{{}, lb, ub};
    for (auto [c, v] : m)
      if (v != 0.0) r.terms.push_back({c, v});
    rows_.push_back(std::move(r));
  }
  int cols() const { return int(lb_.size()); }
  int rows() const { return int(rows_.size()); }
  int integers() const { return int(std::count(int_.begin(), int_.end(), true)); }
  bool is_integer(int c) const { return int_[size_t(c)]; }

  Cbc_Model* build() const {
    const int nc = cols();
    std::vector<std::vector<std::pair<int, double>>> by_col(static_cast<size_t>(nc));
    for (size_t r = 0; r < rows_.size(); ++r)
      for (auto [c, v] : rows_[r].terms) by_col[size_t(c)].push_back({int(r), v});
    std::vector<CoinBigIndex> start;
    std::vector<int> index;
    std::vector<double> value;
    for (int c = 0; c < nc; ++c) {
      start.push_back(CoinBigIndex(index.size()));
      for (auto [r, v] : by_col[size_t(c)]) {
        index.push_back(r);
        value.push_back(v);
      }
    }
    start.push_back(CoinBigIndex(index.size()));
    std::vector<double> rlb, rub;
    for (const Row& r : rows_) {
      rlb.push_back(r.lb == -kInf ? -COIN_DBL_MAX_ : r.lb);
      rub.push_back(r.ub == kInf ? COIN_DBL_MAX_ : r.ub);
    }
    Cbc_Model* m = Cbc_newModel();
    Cbc_loadProblem(m, nc, rows(), start.data(), index.data(), value.data(), lb_.data(), ub_.data(), obj_.data(),
                    rlb.data(), rub.data());
    for (int c = 0; c < nc; ++c)
      if (int_[size_t(c)]) Cbc_setInteger(m, c);
    return m;
  }
  static constexpr double COIN_DBL_MAX_ = std::numeric_limits<double>::max();

 private:
  std::vector<double> lb_, ub_, obj_;
  std::vector<bool> int_;
  std::vector<Row> rows_;
};

// Column indices of the model's variables (-1: absent).
struct Vars {
  int64_t L = 0;
  std::vector<std::vector<int>> x;  // [s][e]
  std::vector<int> dev, host, nvme, keep;
  int y = -1, R = -1, E = -1, fence = -1;
  std::vector<int> u, un;  // [e]
  std::vector<int> T;  // [w]
  // [i] window -> column. Offload and reload shares are split by tier (h: host tier, n: nvme tier) so that
  // NVMe staging in host memory and the write/read order only concern the nvme tier's bytes.
  std::vector<std::map<int, int>> offh, offn, relh, reln, nw, nr;
};

struct Built {
  Lp lp;
  Vars v;
  // Objective weight of a share moved out of its natural window: a tie-break (a plan keeps its transfers
  // where the executor runs them today unless moving them saves time). Subtracted from the reported objective.
  double eps = 0;
  std::vector<int> off_natural;  // columns that carry eps
  double scale = 1;              // objective units per second
};

// Columns: the path of stored boundaries x[s][e], each boundary's tier and kept internals, the executor model's y
// and R, the segment reload indicators, every transfer share by window, the window times and the optimizer's
// exposure.
void add_columns(const Instance& in, Built& bt) {
  Lp& lp = bt.lp;
  Vars& v = bt.v;
  const int64_t L = in.L;
  const int nw = in.num_windows();
  v.L = L;
  const bool host_ok = in.allow_host;
  const bool nvme_ok = in.allow_nvme;
  const bool static_mem = in.memory == MemoryModel::executor;  // y and R exist only here
  v.x.assign(size_t(L + 1), std::vector<int>(size_t(L + 1), -1));
  for (int64_t s = 0; s < L; ++s)
    for (int64_t e = s + 1; e <= L; ++e) v.x[size_t(s)][size_t(e)] = lp.col(0, 1, 0, true);
  v.dev.assign(size_t(L), -1);
  v.host.assign(size_t(L), -1);
  v.nvme.assign(size_t(L), -1);
  v.keep.assign(size_t(L), -1);
  for (int64_t i = 0; i < L; ++i) {
    v.dev[size_t(i)] = lp.col(0, 1, 0, true);
    if (host_ok || i == 0) v.host[size_t(i)] = lp.col(0, 1, 0, true);
    if (nvme_ok && i >= 1) v.nvme[size_t(i)] = lp.col(0, 1, 0, true);
    v.keep[size_t(i)] = lp.col(0, 1, 0, true);
  }
  if (static_mem) {
    v.y = lp.col(0, 1, 0, true);
    v.R = lp.col(0, double(L), 0, false);
  }
  v.u.assign(size_t(L + 1), -1);
  v.un.assign(size_t(L + 1), -1);
  for (int64_t e = 2; e <= L; ++e) v.u[size_t(e)] = lp.col(0, 1, 0, false);
  if (nvme_ok)
    for (int64_t e = 3; e <= L; ++e) v.un[size_t(e)] = lp.col(0, 1, 0, false);
  for (auto* m : {&v.offh, &v.offn, &v.relh, &v.reln}) m->resize(size_t(L + 1));
  {
    double compute = in.head;
    for (int64_t l = 0; l < L; ++l) compute += in.f[size_t(l)] + in.b[size_t(l)];
    bt.eps = 1e-7 * compute / double(nw);
    // CBC's absolute tolerances (its cutoff increment defaults to 1e-5) must be small against the objective:
    // it is solved in units where the step's compute is ~1000.
    bt.scale = 1e3 / std::max(compute, 1e-12);
  }
  auto share = [&](int w, int natural) {
    const int c = lp.col(0, 1, w == natural ? 0.0 : bt.eps * bt.scale, false);
    if (w != natural) bt.off_natural.push_back(c);
    return c;
  };
  v.nw.resize(size_t(L + 1));
  v.nr.resize(size_t(L + 1));
  for (int64_t i = 0; i < L; ++i) {
    if (v.host[size_t(i)] < 0 && v.nvme[size_t(i)] < 0) continue;
    if (v.host[size_t(i)] >= 0) {
      for (int w : offload_windows(in, i)) v.offh[size_t(i)][w] = share(w, in.fwd(i));
      for (int w : reload_windows(in, i)) v.relh[size_t(i)][w] = share(w, in.bwd(i) - 1);
    }
    if (v.nvme[size_t(i)] >= 0) {
      for (int w : offload_windows(in, i)) v.offn[size_t(i)][w] = share(w, in.fwd(i));
      for (int w : reload_windows(in, i)) v.reln[size_t(i)][w] = share(w, in.bwd(i) - 1);
      for (int w : nvme_write_windows(in, i)) v.nw[size_t(i)][w] = share(w, in.fwd(i));
      for (int w : nvme_read_windows(in, i)) v.nr[size_t(i)][w] = share(w, in.bwd(i) - 1);
    }
  }
  v.T.resize(size_t(nw));
  for (int w = 0; w < nw; ++w) v.T[size_t(w)] = lp.col(0, kInf, bt.scale, false);
  const bool optimizer = in.has_optimizer();
  if (optimizer) v.E = lp.col(0, kInf, bt.scale, false);
  if (in.head_fence) v.fence = lp.col(0, kInf, bt.scale, false);
}

// Structure: one path of stored boundaries, a tier for each stored one, kept internals only above a stored
// boundary, the segment reloads, and transfer shares that add up to their tier in order.
void add_structure(const Instance& in, Built& bt) {
  Lp& lp = bt.lp;
  Vars& v = bt.v;
  const int64_t L = in.L;
  const int nw = in.num_windows();
  auto sigma = [&](int64_t i) {  // terms of "boundary i is stored" (out-flow), i >= 1
    std::vector<std::pair<int, double>> t;
    for (int64_t e = i + 1; e <= L; ++e) t.push_back({v.x[size_t(i)][size_t(e)], 1.0});
    return t;
  };
  auto offdev = [&](int64_t i, double c, std::vector<std::pair<int, double>>& t) {  // c·(host + nvme)
    if (v.host[size_t(i)] >= 0) t.push_back({v.host[size_t(i)], c});
    if (v.nvme[size_t(i)] >= 0) t.push_back({v.nvme[size_t(i)], c});
  };

  {
    std::vector<std::pair<int, double>> t;
    for (int64_t e = 1; e <= L; ++e) t.push_back({v.x[0][size_t(e)], 1.0});
    lp.row(t, 1, 1);
  }
  for (int64_t i = 1; i < L; ++i) {
    std::vector<std::pair<int, double>> t;
    for (int64_t s = 0; s < i; ++s) t.push_back({v.x[size_t(s)][size_t(i)], 1.0});
    for (auto [c, a] : sigma(i)) t.push_back({c, -a});
    lp.row(t, 0, 0);
  }
  // Boundary 0 is always stored: the embedding output stays on the host ("host" = upload it again).
  lp.row({{v.dev[0], 1.0}, {v.host[0], 1.0}}, 1, 1);
  for (int64_t i = 1; i < L; ++i) {
    std::vector<std::pair<int, double>> t = {{v.dev[size_t(i)], 1.0}};
    offdev(i, 1.0, t);
    for (auto [c, a] : sigma(i)) t.push_back({c, -a});
    lp.row(t, 0, 0);
    std::vector<std::pair<int, double>> k = {{v.keep[size_t(i)], 1.0}};
    for (auto [c, a] : sigma(i)) k.push_back({c, -a});
    lp.row(k, -kInf, 0);
  }
  // u[e] >= x[s,e] + host[s] + nvme[s] - 1: the segment below e recomputes from a boundary off the device,
  // fetched once more; un[e] likewise when that boundary is on NVMe (read once more).
  for (int64_t e = 2; e <= L; ++e)
    for (int64_t s = 0; s + 2 <= e; ++s) {
      std::vector<std::pair<int, double>> t = {{v.u[size_t(e)], 1.0}, {v.x[size_t(s)][size_t(e)], -1.0}};
      offdev(s, -1.0, t);
      if (t.size() > 2) lp.row(t, -1, kInf);
      if (v.nvme[size_t(s)] >= 0)
        lp.row({{v.un[size_t(e)], 1.0}, {v.x[size_t(s)][size_t(e)], -1.0}, {v.nvme[size_t(s)], -1.0}}, -1, kInf);
    }
  // Transfer shares add up to the tier.
  for (int64_t i = 0; i < L; ++i) {
    if (v.host[size_t(i)] < 0 && v.nvme[size_t(i)] < 0) continue;
    auto total = [&](const std::map<int, int>& parts, int tier_col) {
      if (tier_col < 0) return;
      std::vector<std::pair<int, double>> t = {{tier_col, -1.0}};
      for (auto [w, c] : parts) t.push_back({c, 1.0});
      lp.row(t, 0, 0);
    };
    if (i >= 1) total(v.offh[size_t(i)], v.host[size_t(i)]);
    total(v.relh[size_t(i)], v.host[size_t(i)]);
    if (v.nvme[size_t(i)] >= 0) {
      total(v.offn[size_t(i)], v.nvme[size_t(i)]);
      total(v.reln[size_t(i)], v.nvme[size_t(i)]);
      total(v.nw[size_t(i)], v.nvme[size_t(i)]);
      total(v.nr[size_t(i)], v.nvme[size_t(i)]);
      // Cumulative order: written only what was offloaded, reloaded only what was read.
      for (int w = 0; w < nw; ++w) {
        std::vector<std::pair<int, double>> a, b;
        for (auto [ww, c] : v.nw[size_t(i)])
          if (ww <= w) a.push_back({c, 1.0});
        for (auto [ww, c] : v.offn[size_t(i)])
          if (ww <= w) a.push_back({c, -1.0});
        if (!a.empty()) lp.row(a, -kInf, 0);
        for (auto [ww, c] : v.reln[size_t(i)])
          if (ww <= w) b.push_back({c, 1.0});
        for (auto [ww, c] : v.nr[size_t(i)])
          if (ww <= w) b.push_back({c, -1.0});
        if (!b.empty()) lp.row(b, -kInf, 0);
      }
    }
  }
}

// Window times: each window at least its compute, each link's bytes over its bandwidth (both directions over
// the duplex rate), its host work and its NVMe traffic.
void add_window_times(const Instance& in, Built& bt) {
  Lp& lp = bt.lp;
  Vars& v = bt.v;
  const int64_t L = in.L;
  const int nw = in.num_windows();
  const bool nvme_ok = in.allow_nvme;
  std::vector<std::vector<std::pair<int, double>>> h2d(static_cast<size_t>(nw)), d2h(static_cast<size_t>(nw));
  std::vector<double> h2d_c(static_cast<size_t>(nw), 0.0), d2h_c(static_cast<size_t>(nw), 0.0),
      host_c(static_cast<size_t>(nw), 0.0);  // bytes (and host seconds) per window
  for (int64_t l = 0; l < L; ++l) h2d_c[size_t(in.fwd(l))] += l + 1 < L ? in.Wl[size_t(l + 1)] : in.HW;
  // Backward weights (exec/weight_buffers.h, as cost_model.cpp counts them): none while the source of what a
  // window needs is at or above the lowest layer the forward left on the device. "The source of boundary i is
  // s" is the edge s -> e with s <= i < e, so "source(i) >= resident" is a sum of edges.
  const int64_t resident = in.first_resident();
  auto upload_unless_resident = [&](int w, int64_t i) {  // W_i · (1 - [source(i) >= resident])
    const double wi = in.Wl[size_t(i)];
    h2d_c[size_t(w)] += wi;
    for (int64_t s = resident; s <= i; ++s)
      for (int64_t e = i + 1; e <= L; ++e) h2d[size_t(w)].push_back({v.x[size_t(s)][size_t(e)], -wi});
  };
  if (L >= 2) upload_unless_resident(in.head_window(), L - 1);  // layer L-1 again after a segment below it
  for (int64_t k = 1; k < L; ++k) {
    const int w = in.bwd(k);
    upload_unless_resident(w, k - 1);  // layer k-1, the next window's first
    for (int64_t s = 0; s < std::min(k, resident); ++s)  // the segment's layers s .. k-1
      h2d[size_t(w)].push_back({v.x[size_t(s)][size_t(k + 1)], in.weights_of(s, k)});
    if (v.u[size_t(k)] >= 0) h2d[size_t(w)].push_back({v.u[size_t(k)], in.A});  // source reload for top k-1
  }
  if (v.u[size_t(L)] >= 0) h2d[size_t(in.head_window())].push_back({v.u[size_t(L)], in.A});
  for (int64_t k = 0; k < L; ++k) {
    d2h_c[size_t(in.bwd(k))] += in.grads_down(k);
    host_c[size_t(in.bwd(k))] += in.accumulate_in(k);
  }
  for (int64_t i = 0; i < L; ++i) {
    for (const auto* m : {&v.offh, &v.offn})
      for (auto [w, c] : (*m)[size_t(i)]) d2h[size_t(w)].push_back({c, in.A});
    for (const auto* m : {&v.relh, &v.reln})
      for (auto [w, c] : (*m)[size_t(i)]) h2d[size_t(w)].push_back({c, in.A});
  }
  for (int w = 0; w < nw; ++w) {
    const int T = v.T[size_t(w)];
    // compute
    if (w < L) {
      lp.row({{T, 1.0}}, in.f[size_t(w)], kInf);
    } else if (w == L) {
      lp.row({{T, 1.0}}, in.head, kInf);
    } else {
      const int64_t k = 2 * L - w;
      std::vector<std::pair<int, double>> t = {{T, 1.0}, {v.keep[size_t(k)], in.r[size_t(k)]}};
      for (int64_t s = 0; s + 1 < k + 1; ++s) {
        if (k + 1 - s < 2) continue;
        double cost = 0;
        for (int64_t m = s; m < k; ++m) cost += in.f[size_t(m)];  // a segment recomputes whole forwards
        t.push_back({v.x[size_t(s)][size_t(k + 1)], -cost});
      }
      lp.row(t, in.b[size_t(k)] + in.r[size_t(k)], kInf);
    }
    // links
    auto link_row = [&](const std::vector<std::vector<std::pair<int, double>>*>& parts, double cst, double bw) {
      std::vector<std::pair<int, double>> t = {{T, 1.0}};
      for (auto* p : parts)
        for (auto [c, a] : *p) t.push_back({c, -a / bw});
      if (t.size() > 1 || cst > 0) lp.row(t, cst / bw, kInf);
    };
    if (in.head_fence && w == L) lp.row({{v.fence, 1.0}}, in.HG / in.bw_d2h, kInf);  // B(L-1) waits for it
    link_row({&h2d[size_t(w)]}, h2d_c[size_t(w)], in.bw_h2d);
    if (in.bw_sum > 0) link_row({&h2d[size_t(w)], &d2h[size_t(w)]}, h2d_c[size_t(w)] + d2h_c[size_t(w)], in.bw_sum);
    link_row({&d2h[size_t(w)]}, d2h_c[size_t(w)], in.bw_d2h);
    if (host_c[size_t(w)] > 0) lp.row({{T, 1.0}}, host_c[size_t(w)], kInf);
    if (nvme_ok) {
      std::vector<std::pair<int, double>> t = {{T, 1.0}};
      for (int64_t i = 0; i < L; ++i) {
        if (auto it = v.nw[size_t(i)].find(w); it != v.nw[size_t(i)].end()) t.push_back({it->second, -in.A / in.bw_nvme_w});
        if (auto it = v.nr[size_t(i)].find(w); it != v.nr[size_t(i)].end()) t.push_back({it->second, -in.A / in.bw_nvme_r});
      }
      // A segment source on NVMe is read again in the window before the segment (window 2L - e).
      if (w >= L && 2 * L - w >= 3 && v.un[size_t(2 * L - w)] >= 0)
        t.push_back({v.un[size_t(2 * L - w)], -in.A / in.bw_nvme_r});
      if (t.size() > 1) lp.row(t, 0, kInf);
    }
  }
}

// Host optimizer exposure: E >= update finish - upload start, for every slab.
void add_optimizer_exposure(const Instance& in, Built& bt) {
  Lp& lp = bt.lp;
  Vars& v = bt.v;
  const int64_t L = in.L;
  if (in.has_optimizer()) {
    const double P = in.prologue();
    const double s0 = std::max(in.embed_f, in.token_upload / in.bw_h2d) + in.A / in.bw_h2d;
    lp.row({{v.E, 1.0}}, std::max(in.opt_embed_first(), in.opt_before(1) - s0), kInf);
    for (int64_t l = 1; l <= L; ++l) {  // l = L: the head's upload in F(L-1)
      std::vector<std::pair<int, double>> t = {{v.E, 1.0}};
      for (int64_t m = 0; m + 1 < l; ++m) t.push_back({v.T[size_t(in.fwd(m))], 1.0});
      const double need = l < L ? in.opt_before(l + 1) - P : in.opt_before(L) + in.opt_embed_rest() + in.opt_head - P;
      lp.row(t, need, kInf);
    }
  }
}

void add_device_memory(const Instance& in, Built& bt) {
  Lp& lp = bt.lp;
  Vars& v = bt.v;
  const int64_t L = in.L;
  const int nw = in.num_windows();
  const bool static_mem = in.memory == MemoryModel::executor;
  // --- device memory, per window ---------------------------------------------------------------------
  // Executor model: the executor's schedule's memory as linear terms (Instance::mem, exec/working_set.h): each
  // device boundary and kept internals over its span, the recompute buffers (y) and the recompute cache at the
  // deepest run (R) over theirs. Lifetime model: scratch only where used, the recompute cache only as deep as the
  // run's top.
  const double budget = double(in.budget.device_bytes);
  const double A = in.A * kGBScale, S = in.recompute_scratch() * kGBScale;
  const MemoryTerms& mem = in.mem;
  for (int w = 0; w < nw; ++w) {
    std::vector<std::pair<int, double>> t;
    double rhs = (budget - in.fixed_window(w)) * kGBScale;
    for (int64_t i = 0; i < L; ++i) {
      if (mem.boundary_span[size_t(i)].contains(w)) t.push_back({v.dev[size_t(i)], mem.boundary[size_t(i)] * kGBScale});
      if (mem.internals_span[size_t(i)].contains(w)) t.push_back({v.keep[size_t(i)], mem.internals[size_t(i)] * kGBScale});
    }
    if (static_mem) {
      if (mem.recompute_span.contains(w)) t.push_back({v.y, S});
      if (mem.cache_span.contains(w)) t.push_back({v.R, mem.cache_slot * kGBScale});
    } else if (w < L) {
      t.push_back({v.keep[size_t(w)], -S});  // layer w's internals: kept (counted) or in the scratch
      rhs -= S;
    } else if (w > L) {
      const int64_t k = 2 * L - w;
      t.push_back({v.keep[size_t(k)], -S});
      rhs -= S;
      for (int64_t s = 0; s < k; ++s) t.push_back({v.x[size_t(s)][size_t(k + 1)], double(k - s) * A});
    }
    lp.row(t, -kInf, rhs);
  }
  if (static_mem) {
    for (int64_t q = 0; q < L; ++q) lp.row({{v.y, 1.0}, {v.keep[size_t(q)], 1.0}}, 1, kInf);
    for (int64_t e = 2; e <= L; ++e) {
      std::vector<std::pair<int, double>> r = {{v.R, 1.0}};
      for (int64_t s = 0; s + 2 <= e; ++s) r.push_back({v.x[size_t(s)][size_t(e)], -double(e - 1 - s)});
      lp.row(r, 0, kInf);
    }
  }
}

// Host and NVMe capacity, and the executor's NVMe staging slots.
void add_host_and_nvme_capacity(const Instance& in, Built& bt) {
  Lp& lp = bt.lp;
  Vars& v = bt.v;
  const int64_t L = in.L;
  const int nw = in.num_windows();
  const bool nvme_ok = in.allow_nvme;
  const double A = in.A * kGBScale;
  {
    const double hb = double(in.budget.host_act_bytes) * kGBScale;
    std::vector<std::pair<int, double>> base;
    for (int64_t i = 1; i < L; ++i)
      if (v.host[size_t(i)] >= 0) base.push_back({v.host[size_t(i)], A});
    if (!nvme_ok) {
      if (!base.empty()) lp.row(base, -kInf, hb);
    } else {
      for (int w = 0; w < nw; ++w) {
        std::vector<std::pair<int, double>> t = base;
        for (int64_t i = 1; i < L; ++i) {
          if (v.nvme[size_t(i)] < 0) continue;
          for (auto [ww, c] : v.offn[size_t(i)])
            if (ww <= w) t.push_back({c, A});
          for (auto [ww, c] : v.nw[size_t(i)])
            if (ww < w) t.push_back({c, -A});
          for (auto [ww, c] : v.nr[size_t(i)])
            if (ww <= w) t.push_back({c, A});
          for (auto [ww, c] : v.reln[size_t(i)])
            if (ww < w) t.push_back({c, -A});
        }
        if (!t.empty()) lp.row(t, -kInf, hb);
      }
      std::vector<std::pair<int, double>> t;
      for (int64_t i = 1; i < L; ++i)
        if (v.nvme[size_t(i)] >= 0) t.push_back({v.nvme[size_t(i)], in.A_nvme * kGBScale});
      lp.row(t, -kInf, double(in.budget.nvme_bytes) * kGBScale);
      // The executor's NVMe staging: at most kNvmeSlots boundaries offloaded but not yet written, and read but
      // not yet fetched to the device, in any window.
      for (int w = 0; w < nw; ++w) {
        std::vector<std::pair<int, double>> wr, rd;
        for (int64_t i = 1; i < L; ++i) {
          for (auto [ww, c] : v.offn[size_t(i)])
            if (ww <= w) wr.push_back({c, 1.0});
          for (auto [ww, c] : v.nw[size_t(i)])
            if (ww < w) wr.push_back({c, -1.0});
          for (auto [ww, c] : v.nr[size_t(i)])
            if (ww <= w) rd.push_back({c, 1.0});
          for (auto [ww, c] : v.reln[size_t(i)])
            if (ww < w) rd.push_back({c, -1.0});
        }
        if (!wr.empty()) lp.row(wr, -kInf, kNvmeSlots);
        if (!rd.empty()) lp.row(rd, -kInf, kNvmeSlots);
      }
    }
  }
}

Built build(const Instance& in) {
  Built bt;
  add_columns(in, bt);
  add_structure(in, bt);
  add_window_times(in, bt);
  add_optimizer_exposure(in, bt);
  add_device_memory(in, bt);
  add_host_and_nvme_capacity(in, bt);
  return bt;
}

// Column values of a plan with natural windows (the MIP start).
std::vector<double> encode(const Instance& in, const Vars& v, int ncols, const Plan& plan0) {
  const Plan plan = normalize_plan(plan0);
  const int64_t L = in.L;
  std::vector<double> x(static_cast<size_t>(ncols), 0.0);
  Prediction pr = evaluate(in, plan);
  int64_t prev = 0;
  for (int64_t i = 1; i <= L; ++i)
    if (plan.stored(i)) {
      x[size_t(v.x[size_t(prev)][size_t(i)])] = 1;
      prev = i;
    }
  int64_t depth = 0;
  bool any = false;
  for (int64_t i = 0; i < L; ++i) {
    const Tier t = plan.boundary[size_t(i)];
    if (t == Tier::device) x[size_t(v.dev[size_t(i)])] = 1;
    if (t == Tier::host) x[size_t(v.host[size_t(i)])] = 1;
    if (t == Tier::nvme) x[size_t(v.nvme[size_t(i)])] = 1;
    if (plan.keep_internals[size_t(i)]) x[size_t(v.keep[size_t(i)])] = 1;
    else any = true;
    if (!plan.stored(i)) depth = std::max(depth, i - plan.source_below(i));
  }
  if (v.y >= 0) x[size_t(v.y)] = any ? 1 : 0;
  if (v.R >= 0) x[size_t(v.R)] = double(depth);
  const std::vector<int64_t> src = segment_sources(plan);
  for (int64_t k = 1; k < L; ++k) {
    if (src[size_t(k)] < 0) continue;
    const Tier st = plan.boundary[size_t(src[size_t(k)])];
    if (st != Tier::device && v.u[size_t(k + 1)] >= 0) x[size_t(v.u[size_t(k + 1)])] = 1;
    if (st == Tier::nvme && v.un[size_t(k + 1)] >= 0) x[size_t(v.un[size_t(k + 1)])] = 1;
  }
  TransferWindows tw = TransferWindows::natural(in, plan);
  auto put = [&](const std::vector<std::vector<WindowPart>>& parts, const std::vector<std::map<int, int>>& host_cols,
                 const std::vector<std::map<int, int>>& nvme_cols) {
    for (size_t i = 0; i < parts.size() && i < size_t(L); ++i) {
      const auto& cols = plan.boundary[i] == Tier::nvme ? nvme_cols[i] : host_cols[i];
      for (const WindowPart& p : parts[i])
        if (auto it = cols.find(p.window); it != cols.end()) x[size_t(it->second)] = p.fraction;
    }
  };
  put(tw.offload, v.offh, v.offn);
  put(tw.reload, v.relh, v.reln);
  put(tw.nvme_write, v.nw, v.nw);
  put(tw.nvme_read, v.nr, v.nr);
  for (size_t w = 0; w < v.T.size(); ++w) x[size_t(v.T[w])] = pr.windows[w].time_s;
  if (v.E >= 0) x[size_t(v.E)] = pr.optimizer_exposed_s;
  if (v.fence >= 0) x[size_t(v.fence)] = pr.fence_s;
  return x;
}

void decode(const Instance& in, const Vars& v, const std::vector<double>& x, Plan& plan, TransferWindows& tw) {
  const int64_t L = in.L;
  auto on = [&](int c) { return c >= 0 && x[size_t(c)] > 0.5; };
  plan = Plan();
  plan.name = "lazytrain";
  plan.boundary.assign(size_t(L + 1), Tier::drop);
  plan.keep_internals.assign(size_t(L), false);
  plan.boundary[size_t(L)] = Tier::device;
  for (int64_t i = 0; i < L; ++i) {
    if (on(v.dev[size_t(i)])) plan.boundary[size_t(i)] = Tier::device;
    else if (on(v.host[size_t(i)])) plan.boundary[size_t(i)] = Tier::host;
    else if (on(v.nvme[size_t(i)])) plan.boundary[size_t(i)] = Tier::nvme;
    plan.keep_internals[size_t(i)] = on(v.keep[size_t(i)]) && plan.stored(i);
  }
  tw = TransferWindows();
  tw.offload.resize(size_t(L + 1));
  tw.reload.resize(size_t(L + 1));
  tw.nvme_write.resize(size_t(L + 1));
  tw.nvme_read.resize(size_t(L + 1));
  auto take = [&](const std::map<int, int>& cols, std::vector<WindowPart>& out, bool wanted) {
    if (!wanted) return;
    double sum = 0;
    for (auto [w, c] : cols) {
      const double f = x[size_t(c)];
      if (f > 1e-7) {
        out.push_back({w, f});
        sum += f;
      }
    }
    for (WindowPart& p : out) p.fraction /= sum;  // clean the solver's tolerance away
  };
  for (int64_t i = 0; i < L; ++i) {
    const Tier t = plan.boundary[size_t(i)];
    const bool off_device = i == 0 ? t != Tier::device : (t == Tier::host || t == Tier::nvme);
    const auto& off = t == Tier::nvme ? v.offn[size_t(i)] : v.offh[size_t(i)];
    const auto& rel = t == Tier::nvme ? v.reln[size_t(i)] : v.relh[size_t(i)];
    if (i >= 1) take(off, tw.offload[size_t(i)], off_device);
    take(rel, tw.reload[size_t(i)], off_device);
    take(v.nw[size_t(i)], tw.nvme_write[size_t(i)], t == Tier::nvme);
    take(v.nr[size_t(i)], tw.nvme_read[size_t(i)], t == Tier::nvme);
  }
}

struct RawSolution {
  int status = -1, secondary = -1;
  int optimal = 0, infeasible = 0, has_solution = 0, abandoned = 0;
  double objective = 0, bound = 0;
  std::vector<double> x;
};

RawSolution run_cbc(Cbc_Model* m) {
  RawSolution r;
  Cbc_solve(m);
  r.status = Cbc_status(m);
  r.secondary = Cbc_secondaryStatus(m);
  r.optimal = Cbc_isProvenOptimal(m);
  r.infeasible = Cbc_isProvenInfeasible(m);
  r.abandoned = Cbc_isAbandoned(m);
  const double* best = Cbc_bestSolution(m);
  r.has_solution = best != nullptr;
  r.objective = Cbc_getObjValue(m);
  r.bound = Cbc_getBestPossibleObjValue(m);
  if (best) r.x.assign(best, best + Cbc_getNumCols(m));
  return r;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}

// Reads n bytes before `deadline` (Timer seconds); false on timeout or EOF.
bool read_all(int fd, void* p, size_t n, const Timer& clock, double deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const double left = deadline - clock.seconds();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int pr = ::poll(&pfd, 1, int(std::ceil(left * 1000)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return false;
    ssize_t k = ::read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}

// Runs CBC in a child process; kills it at the deadline. Empty optional-like result (status -1) on timeout.
RawSolution run_isolated(Cbc_Model* m, int ncols, double deadline, const Timer& clock, std::string& err) {
  int fds[2];
  if (::pipe(fds) != 0) {
    err = fmt::format("pipe: {}", std::strerror(errno));
    return {};
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    err = fmt::format("fork: {}", std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return {};
  }
  if (pid == 0) {  // child: solve, send, leave without running the parent's destructors
    ::close(fds[0]);
    RawSolution r = run_cbc(m);
    int hdr[6] = {r.status, r.secondary, r.optimal, r.infeasible, r.has_solution, r.abandoned};
    double vals[2] = {r.objective, r.bound};
    r.x.resize(size_t(ncols), 0.0);
    bool ok = write_all(fds[1], hdr, sizeof(hdr)) && write_all(fds[1], vals, sizeof(vals)) &&
              write_all(fds[1], r.x.data(), sizeof(double) * size_t(ncols));
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  RawSolution r;
  int hdr[6];
  double vals[2];
  r.x.resize(size_t(ncols));
  bool ok = read_all(fds[0], hdr, sizeof(hdr), clock, deadline) && read_all(fds[0], vals, sizeof(vals), clock, deadline) &&
            read_all(fds[0], r.x.data(), sizeof(double) * size_t(ncols), clock, deadline);
  ::close(fds[0]);
  if (!ok) {
    ::kill(pid, SIGKILL);
    err = "the solver did not finish within the wall-clock limit (stopped)";
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!ok) return {};
  r.status = hdr[0];
  r.secondary = hdr[1];
  r.optimal = hdr[2];
  r.infeasible = hdr[3];
  r.has_solution = hdr[4];
  r.abandoned = hdr[5];
  r.objective = vals[0];
  r.bound = vals[1];
  if (!r.has_solution) r.x.clear();
  return r;
}

std::mutex& cbc_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

MilpResult solve_milp(const Instance& in, const MilpOptions& o) {
  Timer clock;
  MilpResult res;
  Built bt = build(in);
  const int ncols = bt.lp.cols();
  res.rows = bt.lp.rows();
  res.cols = ncols;
  res.integers = bt.lp.integers();
  const double constant = in.prologue() + in.epilogue();

  // Warm start: the best feasible candidate by the cost model.
  const Plan* start = nullptr;
  double start_obj = kInf;
  for (const Plan& p : o.warm_starts) {
    if (p.num_layers() != in.L) continue;
    Prediction pr = evaluate(in, p);
    if (pr.feasible && pr.iteration_s < start_obj) {
      start_obj = pr.iteration_s;
      start = &p;
    }
  }
  Cbc_Model* m = bt.lp.build();
  std::vector<double> start_x;
  if (start) {
    start_x = encode(in, bt.v, ncols, *start);
    // Integer columns only: CBC completes the continuous ones by an LP (a full vector tripped its column-name
    // lookup on larger models: "Illegal index in ClpModel::getColumnName").
    std::vector<int> idx;
    std::vector<double> val;
    for (int c = 0; c < ncols; ++c)
      if (bt.lp.is_integer(c)) {
        idx.push_back(c);
        val.push_back(start_x[size_t(c)]);
      }
    Cbc_setMIPStartI(m, int(idx.size()), idx.data(), val.data());
    res.warm_start = start->name;
    res.warm_start_objective = start_obj;
  }
  const double limit = std::max(0.05, o.time_limit_s - clock.seconds());
  Cbc_setParameter(m, "log", o.verbose ? "1" : "0");
  Cbc_setParameter(m, "timeMode", "elapsed");
  Cbc_setParameter(m, "sec", fmt::format("{:.3f}", limit).c_str());
  Cbc_setParameter(m, "threads", std::to_string(std::max(1, o.threads)).c_str());
  Cbc_setParameter(m, "ratioGap", "1e-6");  // proof to 1e-6 relative, not CBC's loose 1e-4 default
  Cbc_setParameter(m, "allowableGap", "1e-7");
  Cbc_setParameter(m, "increment", "1e-7");
  // One round of cuts at the root: on the paper's instances further rounds never moved the bound and held
  // the root past the limit (docs/planner.md, "Solve time"); branching closes the gaps instead.
  Cbc_setParameter(m, "passCuts", "1");
  // No strong branching: on the paper's instances it cost more than it pruned (the 64-layer one with the
  // paper's budgets proves optimal in ~4 s instead of 10; turning CBC's heuristics off too was worse).
  Cbc_setParameter(m, "strongBranching", "0");
  // CBC 2.10 maps a MIP start by column names after its integer preprocessing has renumbered the columns
  // ("Illegal index in ClpModel::getColumnName", the start then lost): with a start, preprocessing is off.
  if (start) Cbc_setParameter(m, "preprocess", "off");

  RawSolution raw;
  std::string err;
  if (o.isolate) {
    // The child's own limit stops it normally; the deadline here is the backstop for an uninterruptible
    // presolve (plus a little time to write the answer).
    raw = run_isolated(m, ncols, clock.seconds() + limit + 0.5, clock, err);
  } else {
    std::lock_guard<std::mutex> lock(cbc_mutex());
    raw = run_cbc(m);
  }
  Cbc_deleteModel(m);
  res.solve_s = clock.seconds();

  if (raw.status == -1 && !err.empty()) {  // killed or failed: the warm start stands
    res.message = err;
    if (start) {
      res.status = SolveStatus::time_limit;
      raw.has_solution = 1;
      raw.x = start_x;
      raw.objective = (start_obj - constant) * bt.scale;
      raw.bound = 0;
    } else {
      res.status = SolveStatus::no_solution;
      return res;
    }
  } else if (raw.infeasible && !raw.has_solution) {
    res.status = SolveStatus::infeasible;
    res.message = "no plan fits the memory budgets";
    return res;
  } else if (raw.abandoned) {
    res.status = SolveStatus::error;
    res.message = "CBC abandoned the search (numerical difficulties)";
  } else if (raw.optimal) {
    res.status = SolveStatus::optimal;
  } else if (raw.has_solution) {
    res.status = SolveStatus::time_limit;
  } else if (raw.status == 0 && !raw.has_solution) {
    res.status = SolveStatus::infeasible;
    res.message = "no plan fits the memory budgets";
    return res;
  } else {
    res.status = SolveStatus::no_solution;
    res.message = "no solution within the time limit";
    return res;
  }
  if (!raw.has_solution) return res;
  res.has_solution = true;
  decode(in, bt.v, raw.x, res.plan, res.windows);
  raw.objective /= bt.scale;
  raw.bound /= bt.scale;
  double penalty = 0;
  for (int c : bt.off_natural) penalty += bt.eps * raw.x[size_t(c)];
  const double max_penalty = bt.eps * double(bt.off_natural.size());
  res.objective = raw.objective - penalty + constant;
  // Optimal: proven to CBC's tolerance (the tie-break moves it by at most max_penalty, ~1e-7 relative).
  res.bound = res.status == SolveStatus::optimal ? res.objective
                                                 : std::min(res.objective, raw.bound - max_penalty + constant);
  res.gap = res.objective > 0 ? std::max(0.0, (res.objective - res.bound) / res.objective) : 0.0;
  return res;
}

}  // namespace lt
