#include "plan/instance.h"

#include <algorithm>
#include <cmath>

#include "core/aligned.h"
#include "core/error.h"
#include "exec/step_schedule.h"
#include "model/block.h"
#include "model/finetune.h"
#include "model/layout.h"
#include "plan/hardware.h"

namespace lt {

const char* memory_model_name(MemoryModel m) {
  return m == MemoryModel::executor ? "executor" : "lifetime";
}

std::string Instance::window_name(int w) const { return lt::window_name(w, L); }

int Instance::window_from_name(const std::string& s) const { return window_parse(s, L); }

double Instance::fixed_peak() const { return *std::max_element(mem.fixed.begin(), mem.fixed.end()); }

double Instance::prologue() const { return std::max(embed_f, token_upload / bw_h2d) + (A + Wl[0]) / bw_h2d; }

double Instance::epilogue() const {
  return std::max(Gl[0] / bw_d2h, embed_rows) + std::max(acc[0], dx0 / bw_d2h) + embed_b;
}

double Instance::weights_of(int64_t a, int64_t b) const {
  double w = 0;
  for (int64_t m = a; m < b; ++m) w += Wl[size_t(m)];
  return w;
}

double Instance::grads_down(int64_t k) const {
  if (k < L - 1) return Gl[size_t(k + 1)];
  return head_fence ? 0.0 : HG;  // with the fence the head's download is the fence itself
}

double Instance::accumulate_in(int64_t k) const { return k < L - 1 ? acc[size_t(k + 1)] : acc_head; }

bool Instance::has_optimizer() const {
  if (opt_embed > 0 || opt_head > 0) return true;
  for (double t : opt_layer)
    if (t > 0) return true;
  return false;
}

double Instance::opt_before(int64_t l) const {
  double t = opt_embed_first();
  for (int64_t m = 0; m < l; ++m) t += opt_layer[size_t(m)];
  return t;
}

Plan normalize_plan(const Plan& p) {
  Plan q = p;
  if (!q.boundary.empty() && q.boundary[0] == Tier::drop) q.boundary[0] = Tier::host;
  if (!q.boundary.empty() && q.boundary[0] == Tier::nvme) q.boundary[0] = Tier::host;
  return q;
}

namespace {

// The parameters a slab trains (model/finetune.h): all of them under full fine-tuning, none of a frozen slab.
double trained_parameters(const ModelConfig& cfg, SlabKind kind, int64_t layer = 0) {
  return double(SlabLayout::trained(cfg, kind, layer).num_parameters());
}

// Data parallel: the host lane's and the optimizer's extra work per rank (InstanceOptions::ranks).
void add_data_parallel(Instance& in, const ModelConfig& cfg, int64_t N, const InstanceOptions& o) {
  LT_CHECK(o.net_gbps > 0, "{} ranks: the network bandwidth per rank (GB/s) is needed to count the exchange", o.ranks);
  const double n = o.ranks, share = (n - 1) / n, net = o.net_gbps * 1e9;
  const double C = double(cfg.hidden_size);
  // Gradients: reduce-scatter of each slab as it is accumulated (the adds themselves are unchanged).
  double micro = 0;
  for (int64_t l = 0; l < in.L; ++l) {
    in.acc[size_t(l)] += share * in.Gl[size_t(l)] / net;
    micro += share * in.Gl[size_t(l)];
  }
  in.acc_head += share * in.HG / net;
  micro += share * in.HG;
  // The embedding: every rank's rows [P, C] f32 and their ids to every rank, at the bound P = N (none for a
  // frozen table).
  const double rows = in.dx0 > 0 ? (n - 1) * double(N) * (C * 4 + 4) : 0.0;
  in.embed_b += rows / net;
  micro += rows;
  in.exchange_micro_bytes = micro;
  if (!in.has_optimizer()) return;  // left out of the prediction: so is its exchange
  // The optimizer: 1/N of each slab, then its updated weights allgathered (dist/data_parallel.h): the streamed
  // weights — the bf16 copy, or the f32 masters in f32 compute — and the embedding's f32 masters (the lookup's).
  const bool bf16 = o.exec.compute == ComputeType::bf16;
  double step = 0;
  auto sharded = [&](double& t, double params, double bytes_per_param) {
    t = t / n + share * params * bytes_per_param / net;
    step += share * params * bytes_per_param;
  };
  const double streamed = bf16 ? 2 : 4;
  for (int64_t l = 0; l < in.L; ++l)
    sharded(in.opt_layer[size_t(l)], trained_parameters(cfg, SlabKind::layer, l), streamed);
  sharded(in.opt_embed, trained_parameters(cfg, SlabKind::embedding), bf16 ? 4 + 2 : 4);
  sharded(in.opt_head, trained_parameters(cfg, SlabKind::head), streamed);
  in.exchange_step_bytes = step;
}

}  // namespace

Instance make_instance(const ModelConfig& cfg, int64_t B, int64_t T, const Profile& profile0, const Budgets& budget,
                       const InstanceOptions& o) {
  LT_CHECK(B >= 1 && T >= 1, "batch {} x seq {}: both must be >= 1", B, T);
  LT_CHECK(cfg.num_layers >= 1, "the model has no layers");
  Profile profile = scale_profile(profile0, B, T);
  profile.validate(cfg.num_layers);
  Instance in;
  in.cfg = cfg;
  in.L = cfg.num_layers;
  in.B = B;
  in.T = T;
  in.opt = o;
  in.budget = budget;
  in.restricted = o.restricted;
  in.profile_name = profile.name;
  const int64_t N = B * T;
  const DType mdt = o.exec.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  const BlockShape s = BlockShape::make(cfg, B, T, o.exec.activations, o.exec.mlp_chunk_tokens);
  auto al = [](double bytes) { return double(align_up(size_t(std::ceil(bytes)), kDeviceAlign)); };
  in.A = al(double(s.boundary_bytes()));
  in.A_nvme = double(align_up(s.boundary_bytes(), kPageAlign));
  in.mem = memory_terms(cfg, B, T, o.exec);
  in.dx0 = in.mem.dx0_download;
  for (int64_t l = 0; l < in.L; ++l) {
    const SlabLayout g = SlabLayout::trained(cfg, SlabKind::layer, l);  // frozen tensors: no gradient (finetune.h)
    in.Wl.push_back(al(double(SlabLayout::make_layer(cfg, l, mdt).bytes())));
    in.Gl.push_back(al(double(g.bytes())));
    in.W = std::max(in.W, in.Wl.back());
    in.G = std::max(in.G, in.Gl.back());
    in.mlp_grad_share.push_back(g.bytes() ? 1.0 - double(g.mlp_offset()) / double(g.bytes()) : 0.0);
  }
  double hw = double(SlabLayout::make(cfg, SlabKind::head, mdt).bytes());
  double hg = double(SlabLayout::trained(cfg, SlabKind::head).bytes());
  if (cfg.tie_word_embeddings) {
    hw += double(SlabLayout::make(cfg, SlabKind::embedding, mdt).bytes());
    hg += double(SlabLayout::trained(cfg, SlabKind::embedding).bytes());
  }
  in.HW = al(hw);
  in.HG = al(hg);
  in.token_upload = in.mem.token_upload;

  in.f = profile.forward_s;
  in.b = profile.backward_s;
  // A frozen run's backward stops at its lowest trained layer (model/finetune.h lowest_backward_layer): none below.
  for (int64_t l = 0; l < std::min<int64_t>(lowest_backward_layer(cfg), in.L); ++l) in.b[size_t(l)] = 0;
  in.r = profile.recompute_s;
  in.head = profile.head_s;
  in.embed_f = profile.embed_forward_s;
  in.embed_rows = profile.embed_rows_s;
  in.embed_b = profile.embed_backward_s;
  if (in.dx0 == 0) in.embed_rows = in.embed_b = 0;  // a frozen table: no rows, no scatter (the schedule has neither)
  for (double g : in.Gl) in.acc.push_back(g / (profile.accumulate_gbps * 1e9));
  in.acc_head = in.HG / (profile.accumulate_gbps * 1e9);
  in.bw_h2d = profile.link.h2d_gbps * 1e9;
  in.bw_d2h = profile.link.d2h_gbps * 1e9;
  const double hd = profile.link.h2d_duplex_gbps > 0 ? profile.link.h2d_duplex_gbps : profile.link.h2d_gbps;
  const double dd = profile.link.d2h_duplex_gbps > 0 ? profile.link.d2h_duplex_gbps : profile.link.d2h_gbps;
  in.bw_sum = (hd + dd) * 1e9 < in.bw_h2d + in.bw_d2h - 1.0 ? (hd + dd) * 1e9 : 0.0;
  in.latency = profile.link.latency_s;
  in.bw_nvme_r = profile.nvme_read_gbps * 1e9;
  in.bw_nvme_w = profile.nvme_write_gbps * 1e9;
  if (o.include_optimizer && !o.restricted && profile.optimizer_params_per_s > 0) {
    // The optimizer updates the trained parameters alone (a frozen tensor, a LoRA run's base weights: none).
    const double rate = profile.optimizer_params_per_s;
    for (int64_t l = 0; l < in.L; ++l) in.opt_layer.push_back(trained_parameters(cfg, SlabKind::layer, l) / rate);
    in.opt_embed = trained_parameters(cfg, SlabKind::embedding) / rate;
    in.opt_head = trained_parameters(cfg, SlabKind::head) / rate;
  }
  in.parameters = cfg.num_active_parameters();
  in.head_fence = true;  // what-if sizes: assume the executor's usual packing
  if (in.L >= 1) {
    const WorkingSet ws = plan_working_set(cfg, B, T, Plan::every(in.L, 1), o.exec);
    in.head_fence = false;
    const std::vector<std::vector<FenceWait>> waits = ws.fence_waits();  // (a temporary's element would dangle)
    for (const FenceWait& f : waits[size_t(in.bwd(in.L - 1))])
      if (f.writer == StreamKind::compute && f.on == StreamKind::d2h) in.head_fence = true;
  }
  for (int64_t l = 0; l < in.L; ++l) {
    in.layer_flops.push_back(layer_forward_flops(cfg, B, T, l));
    in.mlp_share.push_back(mlp_flops_share(cfg, B, T, l));
  }
  in.opt_layer.resize(size_t(in.L), 0.0);
  in.head_flops = head_flops(cfg, B, T);
  LT_CHECK(o.ranks >= 1, "ranks must be >= 1, got {}", o.ranks);
  if (o.ranks > 1) add_data_parallel(in, cfg, N, o);
  else if (splits_embedding_update(cfg, false) && in.opt_embed > 0)  // the batch's rows first, at their bound
    in.opt_embed_rows = in.opt_embed * double(std::min<int64_t>(N, cfg.vocab_size)) / double(cfg.vocab_size);

  in.allow_host = o.allow_host;
  in.allow_nvme = o.allow_nvme && !o.restricted && budget.nvme_bytes > 0 && in.bw_nvme_r > 0 && in.bw_nvme_w > 0 &&
                  in.L >= 2;
  in.memory = o.memory;
  LT_CHECK(o.offload_span >= 1 && o.reload_span >= 1 && o.nvme_span >= 1, "transfer window spans must be >= 1");
  return in;
}

}  // namespace lt
