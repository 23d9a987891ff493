// plan/simulate.cpp — builds the executor's operation graph for a plan and runs it on simulated lanes.
//
// The builder follows src/exec/executor.cpp statement by statement (acquire_weights, take_ring,
// launch_on, get_boundary, recompute_segment, the gradient hand-off); a change there needs the same
// change here, and the executor-vs-simulator table in docs/planner.md is how a drift shows.
#include "plan/simulate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "exec/weight_buffers.h"

namespace lt {
namespace {

enum class Lane : uint8_t { compute = 0, h2d = 1, d2h = 2, host = 3, nvme = 4, issue = 5, optimizer = 6 };
constexpr int kLanes = 7;
const char* lane_name(Lane l) {
  static const char* n[] = {"compute", "h2d", "d2h", "host", "nvme", "issue", "optimizer"};
  return n[int(l)];
}

struct Op {
  Lane lane;
  std::string name;
  int layer = -1;
  double dur = 0;     // compute / host: seconds
  double bytes = 0;   // copies and NVMe: bytes
  bool nvme_read = false;
  bool recompute = false;
  std::vector<int> deps;
  double start = -1, end = -1;
  double remaining = 0;  // copies: bytes left; then the latency tail
  double tail_end = -1;
};

class Engine {
 public:
  explicit Engine(const Instance& in) : in_(in) {}

  int add(Lane lane, std::string name, int layer, double dur, double bytes, std::vector<int> deps) {
    Op op;
    op.lane = lane;
    op.name = std::move(name);
    op.layer = layer;
    op.dur = dur;
    op.bytes = bytes;
    deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
    op.deps = std::move(deps);
    ops_.push_back(std::move(op));
    const int id = int(ops_.size()) - 1;
    queue_[int(lane)].push_back(id);
    return id;
  }
  Op& op(int id) { return ops_[size_t(id)]; }
  const std::vector<Op>& ops() const { return ops_; }

  // Runs every lane in order until all operations are done.
  void run(SimResult& r) {
    size_t head[kLanes] = {};
    int running[kLanes];
    std::fill(std::begin(running), std::end(running), -1);
    double now = 0, compute_free = 0;
    size_t done = 0;
    constexpr double eps = 1e-12;
    while (done < ops_.size()) {
      // Start whatever can start now.
      for (int l = 0; l < kLanes; ++l) {
        if (running[l] >= 0 || head[l] >= queue_[l].size()) continue;
        Op& o = ops_[size_t(queue_[l][head[l]])];
        bool ready = true;
        int last_dep = -1;
        for (int d : o.deps) {
          const Op& p = ops_[size_t(d)];
          if (p.end < 0 || p.end > now + eps) {
            ready = false;
            break;
          }
          if (last_dep < 0 || p.end > ops_[size_t(last_dep)].end) last_dep = d;
        }
        if (!ready) continue;
        o.start = now;
        running[l] = queue_[l][head[l]];
        if (Lane(l) == Lane::compute && now > compute_free + eps) {
          const double gap = now - compute_free;
          r.exposed_s += gap;
          const Lane from = last_dep >= 0 ? ops_[size_t(last_dep)].lane : Lane::compute;
          if (from == Lane::h2d) r.exposed_h2d_s += gap;
          else if (from == Lane::d2h) r.exposed_d2h_s += gap;
          else if (from == Lane::host || from == Lane::issue || from == Lane::optimizer) r.exposed_host_s += gap;
          else if (from == Lane::nvme) r.exposed_nvme_s += gap;
        }
        if (Lane(l) == Lane::h2d || Lane(l) == Lane::d2h) o.remaining = o.bytes;
        if (Lane(l) == Lane::nvme)
          o.dur = o.bytes / (o.nvme_read ? in_.bw_nvme_r : in_.bw_nvme_w);
      }
      // Link rates: each direction alone, or both at their duplex rates.
      const bool h_on = running[1] >= 0 && ops_[size_t(running[1])].tail_end < 0;
      const bool d_on = running[2] >= 0 && ops_[size_t(running[2])].tail_end < 0;
      const double both = in_.bw_sum > 0 && h_on && d_on ? in_.bw_sum / (in_.bw_h2d + in_.bw_d2h) : 1.0;
      const double rate[3] = {0, in_.bw_h2d * both, in_.bw_d2h * both};
      // Next event: each running operation's finish at the current rates; the earliest one finishes (exactly:
      // the comparison below uses the same numbers, so time always advances past an operation).
      double next = std::numeric_limits<double>::infinity();
      double finish[kLanes];
      for (int l = 0; l < kLanes; ++l) {
        finish[l] = std::numeric_limits<double>::infinity();
        if (running[l] < 0) continue;
        const Op& o = ops_[size_t(running[l])];
        if (l == 1 || l == 2) finish[l] = o.tail_end >= 0 ? o.tail_end : now + o.remaining / rate[l];
        else finish[l] = o.start + o.dur;
        next = std::min(next, finish[l]);
      }
      LT_CHECK(next < std::numeric_limits<double>::infinity(),
               "simulator: no operation can start at {:.6f} s (a dependency cycle in the issued graph)", now);
      const double dt = next - now;
      now = next;
      for (int l = 0; l < kLanes; ++l) {
        if (running[l] < 0) continue;
        Op& o = ops_[size_t(running[l])];
        bool finished = false;
        if (l == 1 || l == 2) {
          if (o.tail_end < 0) {
            o.remaining = finish[l] <= next ? 0.0 : std::max(0.0, o.remaining - rate[l] * dt);
            if (o.remaining <= 0.0) o.tail_end = now + in_.latency;
          }
          finished = o.tail_end >= 0 && o.tail_end <= now;
        } else {
          finished = finish[l] <= next;
        }
        if (finished) {
          o.end = now;
          if (Lane(l) == Lane::compute) compute_free = now;
          running[l] = -1;
          ++head[l];
          ++done;
        }
      }
    }
  }

 private:
  const Instance& in_;
  std::vector<Op> ops_;
  std::vector<int> queue_[kLanes];
};

// The executor's step, issued as operations in the executor's order with its waits.
class Builder {
 public:
  Builder(const Instance& in, const Plan& plan, const TransferWindows& tw, Engine& eng)
      : in_(in), plan_(plan), eng_(eng), L_(in.L), wslots_(in.opt.exec.weight_buffers) {
    const int nw = in.opt.exec.weight_buffers, ng = in.opt.exec.grad_buffers, nr = in.opt.exec.boundary_ring;
    wready_.assign(size_t(nw), -1);
    wfree_.assign(size_t(nw), -1);
    gfree_.assign(size_t(ng), -1);
    slot_release_.assign(size_t(ng), -1);
    ring_.assign(size_t(nr), SlotUse{});
    offloaded_.assign(size_t(L_ + 1), -1);
    fetch_.assign(size_t(L_ + 1), Fetch{});
    nvme_wslot_.assign(2, -1);
    nvme_rslot_.assign(2, -1);
    fences_.assign(size_t(in.num_windows()), {-1, -1, -1});
    // The working set's memory reuse (window fences) — the executor's own buffers and lifetimes.
    {
      const WorkingSet ws = plan_working_set(in.cfg, in.B, in.T, plan, in.opt.exec);
      fence_waits_ = ws.fence_waits();
    }
    // Host-tier transfers by window: reload parts are issued with the operations of the window after theirs
    // (they run during their window, as prefetch), offload parts once the compute before their window is done.
    for (int64_t i = 0; i <= L_; ++i) {
      if (i < L_ && plan.boundary[size_t(i)] == Tier::nvme) continue;  // the executor's NVMe path below
      if (size_t(i) < tw.reload.size())
        for (const WindowPart& p : tw.reload[size_t(i)]) reload_at_[p.window + 1].push_back({i, p.fraction});
      if (size_t(i) < tw.offload.size())
        for (const WindowPart& p : tw.offload[size_t(i)]) offload_at_[p.window].push_back({i, p.fraction});
    }
  }

  void build() {
    start_update();
    begin_window(in_.fwd(0));
    upload_tokens();
    forward();
    head();
    backward();
  }

  std::map<int64_t, int> w_upload_;  // first upload of each layer's weights
  int head_upload_ = -1;

 private:
  struct SlotUse {
    int compute = -1, copy = -1;
  };
  struct Boundary {
    int ready = -1;  // op that filled it (-1: compute-produced, ordered already)
    int ring = -1;
  };
  struct Fetch {  // a host boundary on its way back (reload parts issued ahead of get_boundary)
    int ring = -1, last = -1;
  };
  struct Part {
    int64_t boundary;
    double fraction;
  };

  Tier tier(int64_t i) const { return plan_.boundary[size_t(i)]; }

  // Every operation on a stream goes through here: it takes the stream's pending waits (events waited for
  // before it was issued) and becomes the stream's latest operation (what a fence records).
  int add(Lane lane, std::string name, int layer, double dur, double bytes, std::vector<int> deps) {
    if (int(lane) < 3) {
      auto& pending = pending_[int(lane)];
      deps.insert(deps.end(), pending.begin(), pending.end());
      pending.clear();
    }
    const int id = eng_.add(lane, std::move(name), layer, dur, bytes, std::move(deps));
    if (int(lane) < 3) last_[int(lane)] = id;
    return id;
  }
  void wait(Lane stream, int op) {
    if (op >= 0) pending_[int(stream)].push_back(op);
  }

  // begin_window(w): fences on every stream; the first writer of a buffer whose memory an earlier buffer
  // used waits for the streams that touched the earlier one (WorkingSet::fence_waits, as the executor).
  void begin_window(int w) {
    for (int k = 0; k < 3; ++k) fences_[size_t(w)][size_t(k)] = last_[k];
    if (fence_waits_.empty()) return;
    for (const FenceWait& f : fence_waits_[size_t(w)])
      wait(Lane(int(f.writer)), fences_[size_t(f.after + 1)][size_t(int(f.on))]);
  }

  // The previous step's optimizer update on the optimizer lane: embedding, layers, head, in order.
  void start_update() {
    if (!in_.has_optimizer()) return;
    update_embed_ = eng_.add(Lane::optimizer, "update embedding", -1, in_.opt_embed, 0, {});
    for (int64_t l = 0; l < L_; ++l)
      update_layer_[l] = eng_.add(Lane::optimizer, fmt::format("update L{}", l), int(l), in_.opt_layer[size_t(l)], 0, {});
    update_head_ = eng_.add(Lane::optimizer, "update head", -1, in_.opt_head, 0, {});
  }

  int take_ring(Lane writer) {
    const int r = next_ring_;
    next_ring_ = (next_ring_ + 1) % int(ring_.size());
    wait(writer, ring_[size_t(r)].compute);
    wait(writer, ring_[size_t(r)].copy);
    ring_[size_t(r)] = SlotUse{};
    return r;
  }

  int acquire_weights(int64_t l) {
    const WeightBuffers::Slot slot = wslots_.acquire(l);
    const int b = slot.buffer;
    if (!slot.upload) return b;
    wait(Lane::h2d, wfree_[size_t(b)]);
    if (!w_upload_.count(l) && update_layer_.count(l)) wait(Lane::h2d, update_layer_[l]);  // gate_upload
    wready_[size_t(b)] = add(Lane::h2d, fmt::format("h2d W{}", l), int(l), 0, in_.Wl[size_t(l)], {});
    if (!w_upload_.count(l)) w_upload_[l] = wready_[size_t(b)];
    return b;
  }

  int launch_on(int b, const std::vector<Boundary*>& inputs, std::string name, int64_t layer, double dur,
                bool recompute = false) {
    wait(Lane::compute, wready_[size_t(b)]);
    for (Boundary* x : inputs) wait(Lane::compute, x->ready);
    const int done = add(Lane::compute, std::move(name), int(layer), dur, 0, {});
    eng_.op(done).recompute = recompute;
    wfree_[size_t(b)] = done;
    for (Boundary* x : inputs)
      if (x->ring >= 0) ring_[size_t(x->ring)].compute = done;
    return done;
  }

  void upload_tokens() {
    const double n4 = double(in_.B * in_.T) * 4;
    add(Lane::h2d, "h2d tokens", -1, 0, n4, {});
    tokens_ready_ = add(Lane::h2d, "h2d targets", -1, 0, n4, {});
  }

  // Host-tier offload parts whose window opens once `opened_by` (the compute ending the previous window) is done.
  void issue_offloads(int window, int opened_by) {
    auto it = offload_at_.find(window);
    if (it == offload_at_.end()) return;
    for (const Part& p : it->second) {
      const int64_t i = p.boundary;
      wait(Lane::d2h, opened_by);
      wait(Lane::d2h, produced_[i]);
      const int op = add(Lane::d2h, fmt::format("d2h x{}", i), int(i), 0, p.fraction * in_.A, {});
      offloaded_[size_t(i)] = op;
      if (ring_of_[i] >= 0) ring_[size_t(ring_of_[i])].copy = op;
    }
  }

  // Host-tier reload parts placed in the window before `window`, issued now.
  void issue_reloads(int window) {
    auto it = reload_at_.find(window);
    if (it == reload_at_.end()) return;
    for (const Part& p : it->second) {
      const int64_t i = p.boundary;
      Fetch& f = fetch_[size_t(i)];
      if (f.ring < 0) f.ring = take_ring(Lane::h2d);
      wait(Lane::h2d, offloaded_[size_t(i)]);  // the forward's D2H must have landed (x0 lives on the host)
      f.last = add(Lane::h2d, fmt::format("h2d x{}", i), int(i), 0, p.fraction * in_.A, {});
      ring_[size_t(f.ring)].copy = f.last;
    }
  }

  // NVMe tier, as the executor: d2h into one of two write staging slots (the d2h stream waits for the slot),
  // the nvme lane writes it; in the backward the nvme lane reads into one of two read slots (freed after the
  // h2d copy), the h2d stream waits for the read.
  void offload_to_nvme(int64_t i, int ring, int produced) {
    const int k = next_nvme_w_;
    next_nvme_w_ = (next_nvme_w_ + 1) % 2;
    wait(Lane::d2h, produced);
    wait(Lane::d2h, nvme_wslot_[size_t(k)]);  // "wait nvme staging"
    const int copy = add(Lane::d2h, fmt::format("d2h x{} (nvme)", i), int(i), 0, in_.A, {});
    ring_[size_t(ring)].copy = copy;
    const int write = eng_.add(Lane::nvme, fmt::format("write x{}", i), int(i), 0, in_.A_nvme, {copy});
    nvme_wslot_[size_t(k)] = write;
  }
  Boundary fetch_from_nvme(int64_t i) {
    const int k = next_nvme_r_;
    next_nvme_r_ = (next_nvme_r_ + 1) % 2;
    const int read = eng_.add(Lane::nvme, fmt::format("read x{}", i), int(i), 0, in_.A_nvme, {nvme_rslot_[size_t(k)]});
    eng_.op(read).nvme_read = true;
    const int r = take_ring(Lane::h2d);
    wait(Lane::h2d, read);
    const int copy = add(Lane::h2d, fmt::format("h2d x{} (nvme)", i), int(i), 0, in_.A, {});
    nvme_rslot_[size_t(k)] = copy;  // "free nvme staging" after the copy
    ring_[size_t(r)].copy = copy;
    return Boundary{copy, r};
  }

  void forward() {
    // The issuing thread waits for the embedding's update, looks up the embedding, then issues the rest.
    embed_ = eng_.add(Lane::issue, "embedding", -1, in_.embed_f, 0, {update_embed_});
    for (Lane k : {Lane::compute, Lane::h2d, Lane::d2h}) wait(k, embed_);
    wait(Lane::compute, tokens_ready_);
    Boundary in;
    if (tier(0) == Tier::device) {
      in.ready = add(Lane::h2d, "h2d x0", 0, 0, in_.A, {});
    } else {
      in.ring = take_ring(Lane::h2d);
      in.ready = add(Lane::h2d, "h2d x0", 0, 0, in_.A, {});
    }
    for (int64_t l = 0; l < L_; ++l) {
      if (l > 0) begin_window(in_.fwd(l));
      Boundary out;
      const Tier t = tier(l + 1);
      if (!(l + 1 == L_ || t == Tier::device)) out.ring = take_ring(Lane::compute);
      const int b = acquire_weights(l);
      const int done = launch_on(b, {&in}, fmt::format("fwd L{}", l), l, in_.f[size_t(l)]);
      if (out.ring >= 0) ring_[size_t(out.ring)].compute = done;
      if (l + 1 < L_ && t == Tier::nvme) offload_to_nvme(l + 1, out.ring, done);
      if (l + 1 < L_ && t == Tier::host) {
        produced_[l + 1] = done;
        ring_of_[l + 1] = out.ring;
      }
      if (l + 1 < L_) issue_offloads(in_.fwd(l + 1), done);
      in = out;
      in.ready = -1;
    }
  }

  void head() {
    begin_window(in_.head_window());
    if (update_head_ >= 0) wait(Lane::h2d, update_head_);  // gate_upload(head)
    head_upload_ = add(Lane::h2d, "h2d head", -1, 0, in_.HW, {});
    wait(Lane::compute, head_upload_);
    const int done = add(Lane::compute, "head fwd+bwd", -1, in_.head, 0, {});
    wait(Lane::d2h, done);
    const int d = add(Lane::d2h, "d2h head grads", -1, 0, in_.HG, {});
    eng_.add(Lane::host, "accumulate head grads", -1, in_.acc_head, 0, {d});
  }

  // `own`: the fetch for layer i's own backward, which may use reload parts issued ahead in their windows;
  // a recompute segment's source is always fetched afresh (the cost model's extra reload).
  Boundary get_boundary(int64_t i, bool own = true) {
    if (cached_.count(i)) return Boundary{-1, -1};
    const Tier t = tier(i);
    if (t == Tier::device) return Boundary{-1, -1};
    if (i > 0 && t == Tier::drop) {
      recompute_segment(i);
      return Boundary{-1, -1};
    }
    if (i > 0 && t == Tier::nvme) return fetch_from_nvme(i);
    Fetch f;
    if (own) {
      f = fetch_[size_t(i)];
      fetch_[size_t(i)] = Fetch{};
    }
    if (f.last < 0) {
      f.ring = take_ring(Lane::h2d);
      wait(Lane::h2d, offloaded_[size_t(i)]);
      f.last = add(Lane::h2d, fmt::format("h2d x{}", i), int(i), 0, in_.A, {});
      ring_[size_t(f.ring)].copy = f.last;
    }
    return Boundary{f.last, f.ring};
  }

  void recompute_segment(int64_t i) {
    const int64_t j = plan_.source_below(i);
    cached_.clear();
    Boundary in = get_boundary(j, false);
    for (int64_t m = j; m < i; ++m) {
      const int b = acquire_weights(m);
      launch_on(b, {&in}, fmt::format("recompute L{}", m), m, in_.f[size_t(m)], true);  // whole forwards
      cached_.insert(m + 1);
      in = Boundary{-1, -1};
    }
  }

  void backward() {
    wslots_.begin_backward();
    for (int64_t l = L_ - 1; l >= 0; --l) {
      begin_window(in_.bwd(l));
      issue_reloads(in_.bwd(l));
      Boundary xin = get_boundary(l);
      if (!plan_.keep_internals[size_t(l)]) {
        const int b = acquire_weights(l);
        launch_on(b, {&xin}, fmt::format("recompute internals L{}", l), l, in_.r[size_t(l)], true);
      }
      const int b = acquire_weights(l);
      const int g = next_g_;
      next_g_ = (next_g_ + 1) % int(gfree_.size());
      wait(Lane::compute, gfree_[size_t(g)]);
      const double bl = in_.b[size_t(l)], mlp = in_.mlp_share[size_t(l)];
      const int mlp_done = launch_on(b, {&xin}, fmt::format("bwd L{} mlp", l), l, bl * mlp);
      const int done = launch_on(b, {&xin}, fmt::format("bwd L{} attention", l), l, bl * (1 - mlp));
      // Gradients out once the host worker has emptied the staging slot (the MLP half's while the attention
      // half runs), then accumulated on the host.
      wait(Lane::d2h, mlp_done);
      wait(Lane::d2h, slot_release_[size_t(g)]);
      const double grad_bytes = in_.Gl[size_t(l)], mlp_bytes = grad_bytes * in_.mlp_grad_share[size_t(l)];
      add(Lane::d2h, fmt::format("d2h dW{} mlp", l), int(l), 0, mlp_bytes, {});
      wait(Lane::d2h, done);
      const int d = add(Lane::d2h, fmt::format("d2h dW{} attention", l), int(l), 0, grad_bytes - mlp_bytes, {});
      gfree_[size_t(g)] = d;
      slot_release_[size_t(g)] = eng_.add(Lane::host, fmt::format("accumulate dW{}", l), int(l), in_.acc[size_t(l)], 0, {d});
    }
    const int dx0 = add(Lane::d2h, "d2h dx0", 0, 0, in_.A, {});
    eng_.add(Lane::host, "embedding backward", 0, in_.embed_b, 0, {dx0});
  }

  const Instance& in_;
  const Plan& plan_;
  Engine& eng_;
  const int64_t L_;
  std::vector<int> wready_, wfree_;
  WeightBuffers wslots_;
  std::vector<int> gfree_, slot_release_;
  int next_g_ = 0;
  std::vector<SlotUse> ring_;
  int next_ring_ = 0;
  std::vector<int> offloaded_;
  std::vector<Fetch> fetch_;
  std::vector<int> nvme_wslot_, nvme_rslot_;
  int next_nvme_w_ = 0, next_nvme_r_ = 0;
  std::map<int64_t, int> produced_, ring_of_;
  std::map<int, std::vector<Part>> reload_at_, offload_at_;
  std::vector<int> pending_[3];
  int last_[3] = {-1, -1, -1};
  std::vector<std::array<int, 3>> fences_;
  std::vector<std::vector<FenceWait>> fence_waits_;
  std::set<int64_t> cached_;
  int tokens_ready_ = -1, embed_ = -1;
  int update_embed_ = -1, update_head_ = -1;
  std::map<int64_t, int> update_layer_;
};

}  // namespace

nlohmann::json SimResult::to_json() const {
  return {{"step_s", step_s},
          {"optimizer_exposed_s", optimizer_exposed_s},
          {"iteration_s", iteration_s},
          {"compute_s", compute_s},
          {"recompute_s", recompute_s},
          {"h2d_bytes", h2d_bytes},
          {"d2h_bytes", d2h_bytes},
          {"nvme_read_bytes", nvme_read_bytes},
          {"nvme_write_bytes", nvme_write_bytes},
          {"h2d_busy_s", h2d_busy_s},
          {"d2h_busy_s", d2h_busy_s},
          {"host_busy_s", host_busy_s},
          {"exposed_s", exposed_s},
          {"exposed_h2d_s", exposed_h2d_s},
          {"exposed_d2h_s", exposed_d2h_s},
          {"exposed_host_s", exposed_host_s},
          {"exposed_nvme_s", exposed_nvme_s},
          {"peak_device_bytes", peak_device_bytes},
          {"window_device_bytes", window_device_bytes},
          {"lifetime_device_bytes", lifetime_device_bytes},
          {"host_act_bytes", host_act_bytes},
          {"nvme_bytes", nvme_bytes}};
}

nlohmann::json SimResult::chrome_trace() const {
  static const std::map<std::string, int> tid = {{"compute", 1}, {"h2d", 2}, {"d2h", 3}, {"nvme", 4}, {"host", 5},
                                                     {"issue", 6}, {"optimizer", 7}};
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& [lane, id] : tid)
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", id}, {"args", {{"name", lane}}}});
  for (const SimOpRecord& o : ops)
    ev.push_back({{"name", o.name},
                  {"cat", o.lane},
                  {"ph", "X"},
                  {"pid", 1},
                  {"tid", tid.at(o.lane)},
                  {"ts", o.start * 1e6},
                  {"dur", (o.end - o.start) * 1e6},
                  {"args", {{"bytes", o.bytes}, {"layer", o.layer}}}});
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
}

SimResult simulate(const Instance& in, const Plan& plan_in, const TransferWindows& tw, const SimOptions& opt) {
  const Plan plan = normalize_plan(plan_in);
  plan.validate(in.L);
  // The step as the executor runs it; with the optimizer, the previous step's update pipelined into it (the
  // step without it gives the optimizer's exposed part).
  const bool optimizer = in.has_optimizer();
  Instance plain = in;
  plain.opt_layer.assign(plain.opt_layer.size(), 0.0);
  plain.opt_embed = plain.opt_head = 0;
  SimResult r;
  auto run = [&](const Instance& inst, SimResult& out, bool record) {
    Engine eng(inst);
    Builder b(inst, plan, tw, eng);
    b.build();
    eng.run(out);
    double end = 0;
    for (const Op& o : eng.ops()) end = std::max(end, o.end);
    if (!record) return end;
    for (const Op& o : eng.ops()) {
      const double d = o.end - o.start;
      switch (o.lane) {
        case Lane::compute:
          out.compute_s += d;
          if (o.recompute) out.recompute_s += d;
          break;
        case Lane::h2d: out.h2d_bytes += o.bytes; out.h2d_busy_s += d; break;
        case Lane::d2h: out.d2h_bytes += o.bytes; out.d2h_busy_s += d; break;
        case Lane::host:
        case Lane::optimizer: out.host_busy_s += d; break;
        case Lane::issue: break;
        case Lane::nvme: (o.nvme_read ? out.nvme_read_bytes : out.nvme_write_bytes) += o.bytes; break;
      }
      if (opt.record_ops) out.ops.push_back({o.name, lane_name(o.lane), o.layer, o.start, o.end, o.bytes});
    }
    return end;
  };
  r.step_s = run(plain, r, !optimizer);
  r.iteration_s = r.step_s;
  if (optimizer) {
    SimResult with;
    r.iteration_s = run(in, with, true);
    r.optimizer_exposed_s = std::max(0.0, r.iteration_s - r.step_s);
    with.step_s = r.step_s;
    with.iteration_s = r.iteration_s;
    with.optimizer_exposed_s = r.optimizer_exposed_s;
    r = with;
  }
  // Memory: the executor's working set (what it allocates); the lifetime model's peak alongside.
  const Prediction p = evaluate(in, plan, tw);
  r.lifetime_device_bytes = p.lifetime_device_bytes;
  {
    const WorkingSet ws = plan_working_set(in.cfg, in.B, in.T, plan, in.opt.exec);
    r.peak_device_bytes = ws.device_bytes();  // the packed block the executor allocates (>= every window)
    r.window_device_bytes = *std::max_element(ws.window_bytes.begin(), ws.window_bytes.end());
  }
  r.host_act_bytes = p.host_act_bytes;
  r.nvme_bytes = p.nvme_bytes;
  return r;
}

}  // namespace lt
