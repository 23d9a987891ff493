// plan/simulate.cpp — the executor's own schedule of a step (exec/step_schedule.h), timed on simulated lanes with
// the instance's costs: nothing here decides an order or a dependency.
#include "plan/simulate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "exec/step_schedule.h"
#include "plan/plan_file.h"

namespace lt {
namespace {

constexpr int kLanes = kNumLanes;

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

// What an operation of the schedule costs on the instance: seconds of compute or host work, or bytes to move.
struct Cost {
  double seconds = 0, bytes = 0;
};
Cost cost_of(const Instance& in, const StepOp& op) {
  const size_t l = size_t(std::max<int64_t>(op.layer, 0));
  switch (op.kind) {
    case OpKind::update:
      if (op.slab == SlabKind::embedding)
        return {op.rows == UpdateRows::all ? in.opt_embed
                                           : op.rows == UpdateRows::batch ? in.opt_embed_first() : in.opt_embed_rest(), 0};
      return {op.slab == SlabKind::head ? in.opt_head : in.opt_layer[l], 0};
    case OpKind::embed: return {in.embed_f, 0};
    case OpKind::upload_tokens: return {0, in.token_upload};
    case OpKind::upload_weights: return {0, in.Wl[l]};
    case OpKind::upload_head: return {0, in.HW};
    case OpKind::upload_boundary:
    case OpKind::download_boundary: return {0, op.fraction * in.A};
    case OpKind::nvme_write:
    case OpKind::nvme_read: return {0, in.A_nvme};
    case OpKind::forward:
    case OpKind::recompute: return {in.f[l], 0};
    case OpKind::recompute_internals: return {in.r[l], 0};
    case OpKind::backward_mlp: return {in.b[l] * in.mlp_share[l], 0};
    case OpKind::backward_attention: return {in.b[l] * (1 - in.mlp_share[l]), 0};
    case OpKind::head: return {in.head, 0};
    case OpKind::embedding_rows: return {in.embed_rows, 0};
    case OpKind::download_loss: return {0, double(op.bytes)};
    case OpKind::download_head_grads: return {0, in.HG};
    case OpKind::download_grads: {  // the MLP half is the slab's tail (offset > 0), the attention half its head;
      // a trained layout of MLP tensors alone (model/finetune.h) has the MLP half at offset 0
      const double mlp = in.Gl[l] * in.mlp_grad_share[l];
      return {0, op.offset > 0 || in.mlp_grad_share[l] == 1.0 ? mlp : in.Gl[l] - mlp};
    }
    case OpKind::download_embedding_rows: return {0, double(op.bytes)};  // at the schedule's bound, f32 [N, C]
    case OpKind::accumulate_head: return {in.acc_head, 0};
    case OpKind::accumulate_grads: return {in.acc[l], 0};
    case OpKind::embedding_backward: return {in.embed_b, 0};
  }
  return {};
}

// The schedule's operations on the engine's lanes, with their deps.
void load(Engine& eng, const Instance& in, const StepSchedule& sched) {
  for (const StepOp& op : sched.ops) {
    const Cost c = cost_of(in, op);
    const int id = eng.add(op.lane, op.name, int(op.layer), c.seconds, c.bytes, op.waits_for());
    eng.op(id).nvme_read = op.kind == OpKind::nvme_read;
    eng.op(id).recompute = op.kind == OpKind::recompute || op.kind == OpKind::recompute_internals;
  }
}

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

SimResult simulate_schedule(const Instance& in, const StepSchedule& sched, const SimOptions& opt) {
  Engine eng(in);
  load(eng, in, sched);
  SimResult r;
  eng.run(r);
  for (const Op& o : eng.ops()) {
    const double d = o.end - o.start;
    r.step_s = std::max(r.step_s, o.end);
    switch (o.lane) {
      case Lane::compute:
        r.compute_s += d;
        if (o.recompute) r.recompute_s += d;
        break;
      case Lane::h2d: r.h2d_bytes += o.bytes; r.h2d_busy_s += d; break;
      case Lane::d2h: r.d2h_bytes += o.bytes; r.d2h_busy_s += d; break;
      case Lane::host:
      case Lane::optimizer: r.host_busy_s += d; break;
      case Lane::issue: break;
      case Lane::nvme: (o.nvme_read ? r.nvme_read_bytes : r.nvme_write_bytes) += o.bytes; break;
    }
    if (opt.record_ops) r.ops.push_back({o.name, lane_name(o.lane), o.layer, o.start, o.end, o.bytes});
  }
  r.iteration_s = r.step_s;
  // Memory: the schedule's own (the packed block the executor allocates, >= every window).
  r.peak_device_bytes = sched.memory.device_bytes();
  r.window_device_bytes = double(*std::max_element(sched.memory.window_bytes.begin(), sched.memory.window_bytes.end()));
  return r;
}

SimResult simulate(const Instance& in, const Plan& plan_in, const TransferWindows& tw, const SimOptions& opt) {
  // The plan as the executor takes it: its host-tier copies placed in the given windows.
  const Plan plan = executable_plan(in, normalize_plan(plan_in), tw);
  // The step as the executor runs it; with the optimizer, the previous step's update pipelined into it (the
  // step without it gives the optimizer's exposed part).
  StepScheduleOptions so;
  SimResult r = simulate_schedule(in, build_step_schedule(in.cfg, in.B, in.T, plan, in.opt.exec, so), opt);
  if (in.has_optimizer()) {
    so.update = true;
    so.split_embedding_update = in.opt_embed_rows > 0;  // one process, a trained table (the executor's rule)
    SimResult with = simulate_schedule(in, build_step_schedule(in.cfg, in.B, in.T, plan, in.opt.exec, so), opt);
    with.optimizer_exposed_s = std::max(0.0, with.step_s - r.step_s);
    with.step_s = r.step_s;
    r = with;
  }
  // The cost model's lifetime peak and host figures alongside.
  const Prediction p = evaluate(in, plan_in, tw);
  r.lifetime_device_bytes = p.lifetime_device_bytes;
  r.host_act_bytes = p.host_act_bytes;
  r.nvme_bytes = p.nvme_bytes;
  return r;
}

}  // namespace lt
