#include "train/session.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/procfs.h"
#include "core/units.h"
#include "io/json_file.h"
#include "io/paths.h"
#include "model/finetune.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/peft.h"
#include "plan/measure.h"
#include "plan/plan_file.h"
#include "plan/planner.h"
#include "train/evaluate.h"

namespace fs = std::filesystem;

namespace lt {
namespace {

// The keys whose values change a run's results, as saved with its checkpoints. Data parallel: what changes results
// is the global number of micro-batches per step (ranks × gradient_accumulation_steps), not how they are dealt, so
// that is saved instead and a run resumes on any number of ranks that keeps it.
// The MoE load-balancing loss's coefficient is saved as the one in effect (0 for dense models, whatever the key).
nlohmann::json result_config(const TrainConfig& c, int ranks, double moe_aux_coef) {
  nlohmann::json all = c.to_json(), out;
  for (const auto& k : TrainConfig::result_keys())
    if (k != "gradient_accumulation_steps") out[k] = all[k];
  out["global_micro_batches"] = c.gradient_accumulation_steps * ranks;
  out["lora_alpha"] = std::isnan(c.lora_alpha) ? 2.0 * double(c.lora_rank) : c.lora_alpha;  // the one in effect
  out["moe_aux_loss_coef"] = moe_aux_coef;
  return out;
}

// The adapter in `dir` to train on: its config makes the run's LoRA (rank, alpha, targets...); a key the config file
// gives with another value contradicts it.
std::shared_ptr<const Finetune> adapter_finetune(const TrainConfig& c, const ModelConfig& model, const std::string& dir) {
  const PeftAdapterConfig a = read_peft_config(dir);
  auto f = std::make_shared<const Finetune>(finetune_of_adapter(model, a, dir));
  auto given = [&](const char* k) { return std::find(c.given.begin(), c.given.end(), k) != c.given.end(); };
  auto clash = [&](const char* k, const std::string& mine, const std::string& theirs) {
    LT_CHECK(!given(k) || mine == theirs,
             "{}: {} but the adapter in {} has {}; training on an adapter keeps its settings (drop the key, or set "
             "create_new_adapter: true to merge it and train a new one)", k, mine, dir, theirs);
  };
  const Finetune mine = *finetune_of(c, model);
  clash("lora_rank", std::to_string(c.lora_rank), std::to_string(a.r));
  clash("lora_alpha", fmt::format("{:g}", mine.alpha), fmt::format("{:g}", a.lora_alpha));
  clash("lora_dropout", fmt::format("{:g}", c.lora_dropout), fmt::format("{:g}", a.lora_dropout));
  clash("use_rslora", c.use_rslora ? "true" : "false", a.use_rslora ? "true" : "false");
  clash("lora_target", fmt::format("{}", fmt::join(mine.targets, ",")), fmt::format("{}", fmt::join(f->targets, ",")));
  return f;
}

}  // namespace

ModelSource ModelSource::load(const TrainConfig& c, const Comm& comm, ComputeType compute) {
  ModelSource m;
  fs::path p(c.model_name_or_path);
  const bool from_scratch = is_file_path(p);  // a config.json alone: train from scratch
  const ModelConfig cfg = load_model_config(p.string());
  std::shared_ptr<const Finetune> ft = finetune_of(c, cfg);
  // Data parallel at bf16 compute: a rank loads the f32 masters of its own chunks (dist/data_parallel.h); a frozen run's
  // masters (the trained tensors) are whole on every rank.
  if (comm.size() > 1 && c.compute_dtype == "bf16" && !ft) m.owned_masters = sharded_master_ranges(comm, cfg);
  // LoRA: the adapter trained on, the others merged into the base first.
  const auto [merge, resume_adapter] = lora_adapters(c);
  if (!resume_adapter.empty()) ft = adapter_finetune(c, cfg, resume_adapter);
  m.dir = from_scratch ? p.parent_path().string() : p.string();
  m.from_scratch = from_scratch;
  m.config = cfg;
  const DType streamed = compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  if (ft) {
    // Frozen tensors live in the streamed weights alone (model/finetune.h): every tensor in the compute dtype there,
    // f32 masters of the trained ones (LoRA: the adapters, new or read).
    m.config.finetune = ft;
    m.params = ModelSlabs(m.config, DType::f32, Fill::zero, SlabSet::trained);
    m.weights.emplace(m.config, streamed, Fill::none);
  }
  if (ft && !from_scratch && merge.empty()) {
    // Read a slab at a time into both: the f32 model never exists whole (the load's peak is the streamed weights
    // and the masters, and one layer in f32).
    load_hf_model_by_slab(p.string(), [&](const ModelSlabs& pass, SlabKind kind, int64_t layer) {
      copy_slab_by_name(m.params, pass, kind, layer);
      copy_slab_by_name(*m.weights, pass, kind, layer);
    }, &m.extras);
  } else {
    ModelSlabs base;
    if (from_scratch) {
      base = ModelSlabs(cfg);
      init_random(base, uint64_t(c.seed), 0.02f);
    } else {
      LoadedModel lm = load_hf_model(p.string(), ft ? nullptr : m.only());
      base = std::move(lm.params);
      m.extras = std::move(lm.extras);
    }
    if (!ft) {
      m.params = std::move(base);
      return m;
    }
    for (const std::string& dir : merge) merge_adapter_dir(base, dir);
    copy_tensors_by_name(m.params, base);  // freeze's trained tensors, LoRA's additional targets
    copy_tensors_by_name(*m.weights, base);
  }
  if (ft->kind == FinetuneKind::lora) {
    if (resume_adapter.empty()) init_adapters(m.params, uint64_t(c.seed));
    else load_peft_adapter(resume_adapter, m.params);
  }
  copy_tensors_by_name(*m.weights, m.params);  // the adapters (and the trained tensors: the same values)
  return m;
}

void TrainingSession::Window::add(const StepStats& st) {
  time.compute_s += st.summary.compute_s;
  time.h2d_s += st.summary.h2d_s;
  time.d2h_s += st.summary.d2h_s;
  time.nvme_s += st.summary.nvme_s;
  time.host_s += st.summary.host_s;
  time.optimizer_s += st.summary.optimizer_s;
  time.exposed_s += st.summary.exposed_s;
}

TrainingSession::TrainingSession(const TrainSettings& s, const Comm& comm) : s_(s), comm_(comm) {
  model_ = ModelSource::load(s_.c, comm_, s_.compute);
  load_data();
  choose_plan();
  check_memory();
  open_device();
  make_optimizer();
  resume();
  loop_timer_.reset();
}

// --- set-up ------------------------------------------------------------------------------------------
void TrainingSession::load_data() {
  const TrainConfig& c = s_.c;
  const ModelConfig& mc = model_.config;
  tok_.emplace(Tokenizer::load(model_.dir));
  tpl_.emplace(train_template_kind(c, mc.type), *tok_);
  // Rank 0 tokenises (and writes the data cache) first; the others then read the cache it wrote.
  if (s_.lead()) loader_.emplace(load_train_data(c, *tok_, *tpl_));
  comm_.barrier();  // no timeout yet: tokenising a large data set takes what it takes
  if (!s_.lead()) loader_.emplace(load_train_data(c, *tok_, *tpl_));
  comm_.set_timeout(c.dist_timeout_s);  // from here a rank that stops answering ends the job
  // A step is `micro_per_step` micro-batches: rank r runs a·N + r of them (a = 0..A-1), as one process with N·A
  // accumulation steps would run them all, in that order.
  micro_per_step_ = c.gradient_accumulation_steps * s_.ranks;
  steps_per_epoch_ = std::max<int64_t>(1, loader_->steps_per_epoch() / micro_per_step_);
  total_steps_ = c.max_steps > 0 ? c.max_steps : int64_t(std::ceil(c.num_train_epochs * double(steps_per_epoch_)));
  const int64_t warmup =
      c.warmup_steps > 0 ? c.warmup_steps : int64_t(std::ceil(c.warmup_ratio * double(total_steps_)));
  schedule_.emplace(LrSchedule{c.lr_scheduler_type, c.learning_rate, warmup, total_steps_});
  log_ = std::make_unique<RunLog>(c.output_dir, total_steps_, !s_.resume_dir.empty(), /*silent=*/!s_.lead());
  net_gbps_ = c.net_gbps;
  if (s_.ranks > 1) {
    if (net_gbps_ <= 0) net_gbps_ = measure_exchange_gbps(comm_);
    log_->message(fmt::format("data parallel: {} ranks x {} micro-batches per step (global batch {} rows); exchange "
                              "{:.3g} GB/s per rank{}",
                              s_.ranks, c.gradient_accumulation_steps, micro_per_step_ * c.per_device_train_batch_size,
                              net_gbps_, c.net_gbps > 0 ? " (net_gbps)" : " (measured)"));
  }
  log_->message(fmt::format("model: {} ({}, {} layers, {:.1f}M parameters{})", c.model_name_or_path,
                            model_type_name(mc.type), mc.num_layers, double(mc.num_parameters()) / 1e6,
                            model_.from_scratch ? ", random init" : ""));
  if (mc.finetune) log_->message("fine-tuning: " + mc.finetune->summary(mc));
  if (mc.is_moe()) {
    const bool asked = !std::isnan(c.moe_aux_loss_coef);
    moe_aux_coef_ = asked ? c.moe_aux_loss_coef : mc.router_aux_loss_coef;
    log_->message(fmt::format("mixture of experts: {} of {} experts per token, {:.1f}M parameters active; "
                              "load-balancing loss x {:g} ({})",
                              mc.num_experts_per_tok, mc.num_experts, double(mc.num_active_parameters()) / 1e6,
                              moe_aux_coef_, asked ? "moe_aux_loss_coef" : "the model's router_aux_loss_coef"));
    if (mc.mxfp4_experts)
      log_->message(fmt::format("experts: MXFP4 in {}, dequantised on load; checkpoints save them in {} without "
                                "quantization_config (training does not requantise)",
                                c.model_name_or_path, c.save_dtype));
  } else if (!std::isnan(c.moe_aux_loss_coef) && c.moe_aux_loss_coef > 0) {
    log_->message("moe_aux_loss_coef: ignored, the model has no experts");
  }
  log_->message(loader_->data().summary());
  log_->message(fmt::format("compute: {} on {}{}; activations stored in {}", c.compute_dtype,
                            s_.backend.kind == DeviceKind::cpu ? std::string(isa_name(isa_level(cpu_features())))
                                                               : s_.backend.name(),
                            s_.compute_why, c.activation_dtype));
  if (!c.eval_dataset.empty()) eval_specs_ = resolve_datasets(c.eval_dataset, c.dataset_dir);
}

// `plan: auto`: the machine profiled at the run's shape, then the planner's solution for the budgets.
Plan TrainingSession::solve_plan() {
  const TrainConfig& c = s_.c;
  MeasureOptions mo;
  mo.backend = s_.backend;
  mo.gpu = s_.gpu;
  // The measurement device holds one layer's full working set at this shape; it is not the budget (the planner
  // gets that below), and the CPU device's arena only touches the pages it uses.
  mo.device_memory = std::max(s_.device_bytes, size_t(8) << 30);
  mo.link = s_.link;
  mo.compute = s_.compute;
  mo.activations = s_.activations;
  mo.nvme_dir = c.nvme_dir;
  mo.reps = 1;
  PlanRequest req;
  req.cfg = model_.config;
  req.model_name = c.model_name_or_path;
  req.B = s_.B;
  req.T = s_.T;
  req.profile = measure_profile(model_.config, s_.B, s_.T, mo);
  req.budget.device_bytes = s_.device_bytes;
  req.budget.host_act_bytes =
      c.host_act_memory == "auto" ? host_memory_budget(c) / 4 : parse_size(c.host_act_memory, "host_act_memory");
  req.budget.nvme_bytes = c.nvme_dir.empty() ? 0 : parse_size(c.nvme_size, "nvme_size");
  req.options.exec = s_.exec;
  req.options.allow_nvme = !c.nvme_dir.empty();
  req.options.ranks = s_.ranks;
  req.options.net_gbps = net_gbps_;
  req.options.optimizer_state_bits = int(c.optimizer_state_bits);
  PlanReport report = make_plan(req);
  LT_CHECK(report.found, "plan: auto found no plan that fits: {}", report.message);
  log_->message(report.table());
  return executable_plan(report.instance, report.best.plan, report.best.windows);
}

void TrainingSession::choose_plan() {
  plan_ = s_.c.plan == "auto" ? solve_plan() : Plan::parse(s_.c.plan, model_.config.num_layers);
  exec_ = s_.exec;
  exec_.mlp_chunk_tokens = plan_.mlp_chunk_tokens;  // the planner's (or the plan file's) MLP chunk
  ws_ = plan_working_set(model_.config, s_.B, s_.T, plan_, exec_);
}

// Before any work: the plan's device memory, the host memory (masters, gradients, bf16 copy, optimizer states,
// host activations) and the NVMe space against their budgets.
void TrainingSession::check_memory() const {
  const TrainConfig& c = s_.c;
  LT_CHECK(ws_.device_bytes() <= s_.device_bytes,
           "plan '{}' needs {} of device memory at batch {} x {} but device_memory is {}", plan_.name,
           format_bytes(double(ws_.device_bytes())), s_.B, s_.T, format_bytes(double(s_.device_bytes)));
  const double host_need = host_parameter_bytes(c, model_.config, s_.ranks, model_.from_scratch) +
                           double(ws_.host_activation_bytes) + double(ws_.host_staging_bytes);
  const size_t avail = host_memory_budget(c);
  LT_CHECK(avail == 0 || host_need < double(avail),
           "host memory: the run needs about {} (weights, gradients, optimizer states, host activations {}, the "
           "executor's staging {}) but {} is {}",
           format_bytes(host_need), format_bytes(double(ws_.host_activation_bytes)),
           format_bytes(double(ws_.host_staging_bytes)), host_memory_name(c),
           format_bytes(double(avail)));
  if (ws_.nvme_bytes > 0) {
    struct statvfs sv {};
    LT_CHECK(statvfs(c.nvme_dir.c_str(), &sv) == 0, "nvme_dir {}: {}", c.nvme_dir, std::strerror(errno));
    const double free_bytes = double(sv.f_bavail) * double(sv.f_frsize);
    LT_CHECK(double(ws_.nvme_bytes) < free_bytes, "nvme_dir {}: the plan writes {} of activations but {} is free",
             c.nvme_dir, format_bytes(double(ws_.nvme_bytes)), format_bytes(free_bytes));
  }
  log_->message(fmt::format("plan {}: device {} of {} (peak, packed), host activations {}, nvme {}; host needs ~{}",
                            plan_.name, format_bytes(double(ws_.device_bytes())), format_bytes(double(s_.device_bytes)),
                            format_bytes(double(ws_.host_activation_bytes)), format_bytes(double(ws_.nvme_bytes)),
                            format_bytes(host_need)));
}

// The device (exec/backend.h; data parallel: local rank r on GPU r), the NVMe store, the executor, the gradients and
// the compute copy, with the slabs the streams copy pinned for a GPU's DMA.
void TrainingSession::open_device() {
  const TrainConfig& c = s_.c;
  const ModelConfig& mc = model_.config;
  device_ = s_.backend.open(s_.device_bytes, s_.link, s_.gpu);
  if (ws_.nvme_bytes > 0) {
    LT_CHECK(!c.nvme_dir.empty(), "plan '{}' uses the nvme tier: set nvme_dir", plan_.name);
    NvmeOptions no;
    no.dir = c.nvme_dir;
    no.capacity_bytes = ws_.nvme_bytes;
    nvme_ = NvmeStore::open(no);
    log_->message("nvme: " + nvme_->describe());
  }
  executor_ = std::make_unique<StreamingExecutor>(mc, *device_, exec_, nvme_.get());
  // Data parallel: a rank only ever touches the gradient chunks it owns (the exchange stages the rest), so the other
  // chunks' pages are never faulted in (ZeRO-2's memory, without a second layout).
  grads_.emplace(mc, DType::f32, s_.ranks > 1 ? Fill::none : Fill::zero, SlabSet::trained);
  if (model_.weights) copy_ = std::move(model_.weights);  // frozen tensors: the streamed weights made at load
  else if (s_.compute == ComputeType::bf16) copy_.emplace(mc, DType::bf16);
  pins_ = std::make_unique<PinnedSlabs>(*device_);
  if (s_.backend.pins_host_memory()) {
    pins_->pin(copy_ ? *copy_ : model_.params, "weights");
    if (s_.ranks == 1) pins_->pin(*grads_, "gradients");  // data parallel: the executor's own staging is pinned
    log_->message(
        fmt::format("pinned {} of host slabs in {:.2f} s", format_bytes(double(pins_->bytes())), pins_->seconds()));
  }
}

// Data parallel: gradients reduce-scattered to their owners, the optimizer's states sharded the same way.
void TrainingSession::make_optimizer() {
  const ModelConfig& mc = model_.config;
  if (s_.ranks > 1) dp_ = std::make_unique<DataParallelGrads>(comm_, *grads_);
  opt_ = std::make_unique<HybridAdamW>(model_.params, *grads_, adamw_config(s_.c), dp_ ? &dp_->owned_ranges() : nullptr,
                                       copy_ ? copy_->matrix_dtype() : DType::bf16);
  if (dp_) dp_->attach(*opt_, model_.params, copy_ ? &*copy_ : nullptr);
  states_ = opt_->state_report();
  std::string sharded;
  if (dp_)
    sharded = fmt::format("; rank 0 keeps them for {:.1f}M of the {:.1f}M parameters ({}){}",
                          double(states_.parameters) / 1e6, double(mc.num_parameters()) / 1e6,
                          format_bytes(double(states_.state_bytes)),
                          dp_->masters_sharded() ? fmt::format(" and {} of the f32 masters",
                                                               format_bytes(double(dp_->master_bytes_kept(model_.params))))
                                                 : "");
  log_->message(fmt::format("optimizer: AdamW, {}-bit states, {:.2f} bytes/parameter{}", s_.c.optimizer_state_bits,
                            states_.bytes_per_parameter(), sharded));
  writer_.emplace(CheckpointWriter{s_.c.output_dir, s_.c.save_total_limit, s_.c.save_dtype, size_t(5) << 30, model_.dir,
                                   s_.c.model_name_or_path});
}

void TrainingSession::resume() {
  if (!s_.resume_dir.empty()) {
    const std::string& dir = s_.resume_dir;
    const ResumeState st =
        parse_resume_state(load_checkpoint(dir, model_.params, *opt_, model_.only()), dir + "/resume/state.json");
    nlohmann::json saved = st.config;
    const nlohmann::json now = result_config(s_.c, s_.ranks, moe_aux_coef_);
    if (!saved.contains("global_micro_batches") && saved.contains("gradient_accumulation_steps"))
      saved["global_micro_batches"] = saved["gradient_accumulation_steps"];  // saved before data parallelism
    if (!saved.contains("moe_aux_loss_coef")) saved["moe_aux_loss_coef"] = 0.0;  // saved before the loss was added
    if (!saved.contains("finetuning_type")) {  // saved before freeze and LoRA: full, the other keys' defaults
      nlohmann::json defaults = TrainConfig{}.to_json();
      defaults["lora_alpha"] = 2.0 * double(TrainConfig{}.lora_rank);
      for (const auto& [k, v] : now.items())
        if (!saved.contains(k) && (k.rfind("freeze_", 0) == 0 || k.rfind("lora_", 0) == 0 || k == "finetuning_type" ||
                                   k == "use_rslora" || k == "additional_target" || k == "adapter_name_or_path" ||
                                   k == "create_new_adapter"))
          saved[k] = defaults[k];
    }
    std::string diff;
    for (const auto& [k, v] : now.items())
      if (!saved.contains(k) || saved[k] != v)
        diff += fmt::format("{}{} ({} -> {})", diff.empty() ? "" : ", ", k, saved.value(k, nlohmann::json()).dump(),
                            v.dump());
    LT_CHECK(diff.empty(), "{}: the config differs from the checkpoint's in keys that change results: {}", dir, diff);
    step_ = st.step;
    loader_->seek(st.cursor);
    log_->message(fmt::format("resumed from {} at step {}", dir, step_));
  }
  // Data parallel in bf16 compute: a rank keeps (and loaded) the masters of its chunks; it makes their compute copy,
  // the owners the rest. The others' chunks are released first (from scratch they were drawn), so the conversion's
  // reads of them map no memory.
  if (dp_) dp_->release_unowned_masters(model_.params);
  if (copy_) make_compute_copy(*copy_, model_.params);
  if (dp_ && copy_) dp_->allgather_compute_copy(*copy_);
}

// --- the step ----------------------------------------------------------------------------------------
void TrainingSession::train_step() {
  Timer step_timer;
  const double lr = schedule_->at(step_);
  const int ranks = s_.ranks;
  // All micro-batches first: the loss is the mean over every counted token of the optimizer step. Every rank draws
  // every micro-batch of the step (the loader is deterministic), so each knows the step's token count and the cursor
  // moves the same everywhere; rank r runs a·N + r.
  std::vector<Batch> micro;
  int64_t counted = 0;
  for (int64_t m = 0; m < micro_per_step_; ++m) {
    micro.push_back(loader_->next());
    micro.back().dropout_key = lora_batch_key(uint64_t(s_.c.seed), step_, m);  // LoRA's dropout masks (model/lora.h)
    counted += StepTokens::make(micro.back()).count;
    win_.tokens += micro.back().N();
    tokens_total_ += micro.back().N();
  }
  LT_CHECK(counted > 0, "step {}: no trainable token in the batch (every label is -100)", step_);
  GradNormPartials partials(model_.config.num_layers);
  const ModelSlabs& weights = copy_ ? *copy_ : model_.params;
  std::vector<double> my_loss, my_aux;  // [A]: this rank's micro-batches' loss sums, load-balancing losses
  for (int64_t a = 0; a < s_.c.gradient_accumulation_steps; ++a) {
    const Batch& batch = micro[size_t(a * ranks + comm_.rank())];
    GradTarget target{dp_ ? nullptr : &partials, a == 0 ? GradMode::overwrite : GradMode::add, counted, dp_.get()};
    // The step's objective adds the coefficient times the mean of its micro-batches' load-balancing losses (one
    // micro-batch: transformers' loss; transformers with accumulation adds each micro-batch's undivided).
    target.moe_aux_weight = moe_aux_coef_ / double(micro_per_step_);
    // The weights change with the first micro-batch's pending update; the others start on the layers the previous
    // micro-batch's backward left on the device.
    if (a == 0 && pending_) ++weights_version_;
    StepStats st = executor_->step(*grads_, model_.params, weights, batch, plan_, nullptr,
                                   a == 0 && pending_ ? &*pending_ : nullptr, target, weights_version_);
    if (a == 0) pending_.reset();
    my_loss.push_back(st.loss_sum);
    my_aux.push_back(st.moe_aux_loss);
    win_.add(st);
  }
  my_loss.insert(my_loss.end(), my_aux.begin(), my_aux.end());
  const size_t A = my_aux.size();
  double loss_sum = 0, aux_sum = 0;  // in the global micro-batch order, as one process adds them
  if (dp_) {
    std::vector<double> all(my_loss.size() * size_t(ranks));  // [rank][loss sums A, aux A]
    comm_.allgather(my_loss.data(), my_loss.size() * sizeof(double), all.data());
    for (int64_t m = 0; m < micro_per_step_; ++m) {
      const size_t at = size_t(m % ranks) * 2 * A + size_t(m / ranks);
      loss_sum += all[at];
      aux_sum += all[at + A];
    }
    dp_->finish_step(partials);
  } else {
    for (size_t a = 0; a < A; ++a) loss_sum += my_loss[a], aux_sum += my_aux[a];
  }
  StepPlan sp = opt_->plan_step(partials.sum_of_squares());
  if (sp.skip) log_->message(fmt::format("step {}: non-finite gradient norm, step skipped", step_ + 1));
  else pending_ = PendingUpdate{opt_.get(), StepArgs{sp.step, lr, sp.clip}, copy_ ? &*copy_ : nullptr};
  win_.loss_sum += loss_sum;
  win_.moe_aux_sum += aux_sum;
  win_.micro_batches += micro_per_step_;
  win_.counted += counted;
  win_.grad_norm = sp.grad_norm;
  win_.seconds += step_timer.seconds();
  win_.steps += 1;
  last_loss_ = loss_sum / double(counted) + moe_aux_coef_ * aux_sum / double(micro_per_step_);
  ++step_;
  log_progress(lr);
}

void TrainingSession::log_progress(double lr) {
  if (step_ % s_.c.logging_steps != 0 && step_ != total_steps_) {
    log_->tick(step_, loop_timer_.seconds());
    return;
  }
  const double tps = double(win_.tokens) / win_.seconds;
  nlohmann::json line = {{"step", step_}, {"epoch", double(step_) / double(steps_per_epoch_)}};
  line.update(window_loss());
  line.update({{"lr", lr},
               {"grad_norm", win_.grad_norm},
               {"tokens_per_s", tps},
               // MoE: the FLOPs each token costs are the routed ones (the active parameters)
               {"tflops", 6.0 * double(model_.config.num_active_parameters()) * tps / 1e12},
               {"peak_device_bytes", device_->memory().peak},
               {"host_rss_bytes", rss_bytes()},  // this process's resident memory now (core/procfs.h)
               {"host_activation_bytes", ws_.host_activation_bytes},
               {"nvme_bytes", ws_.nvme_bytes},
               {"compute_s", win_.time.compute_s},
               {"h2d_s", win_.time.h2d_s},
               {"d2h_s", win_.time.d2h_s},
               {"nvme_s", win_.time.nvme_s},
               {"host_s", win_.time.host_s},
               {"optimizer_s", win_.time.optimizer_s},
               {"exposed_s", win_.time.exposed_s},
               {"step_s", win_.seconds / double(win_.steps)},
               {"elapsed_s", loop_timer_.seconds()}});
  log_->log_step(line);
  win_ = Window{};
}

nlohmann::json TrainingSession::window_loss() const {
  const double ce = win_.loss_sum / double(win_.counted);
  if (!model_.config.is_moe()) return {{"loss", ce}};
  const double aux = win_.moe_aux_sum / double(win_.micro_batches);
  return {{"loss", ce + moe_aux_coef_ * aux}, {"ce_loss", ce}, {"aux_loss", aux}};
}

void TrainingSession::flush_update() {
  if (!pending_) return;
  opt_->update_all(pending_->args, pending_->compute_copy);
  pending_.reset();
  ++weights_version_;
}

// --- checkpoints, evaluations, the end ---------------------------------------------------------------
std::string TrainingSession::save(int64_t at_step) {
  flush_update();  // on every rank: the weights stay the same everywhere
  // Data parallel: rank 0 writes for minutes at times; the others wait for it with kWaitForLead's patience.
  std::string path;
  if (dp_) dp_->gather_masters(model_.params);  // rank 0 writes them whole
  if (s_.lead()) {
    nlohmann::json st = {{"cursor", loader_->cursor().to_json()}, {"config", result_config(s_.c, s_.ranks, moe_aux_coef_)},
                         {"world_size", s_.ranks}};
    path = save_checkpoint(*writer_, at_step, model_.params, *opt_, st, model_.extras,
                           model_.config.trains_all() ? nullptr : &*copy_);
    log_->message("saved " + path);
  } else {
    dp_->send_optimizer_state(*opt_);  // rank 0's save_state gathers it
  }
  if (dp_) dp_->release_unowned_masters(model_.params);
  comm_.barrier(Comm::kWaitForLead);
  return path;
}

void TrainingSession::evaluate(int64_t at_step) {
  if (eval_specs_.empty()) return;
  flush_update();
  if (dp_) dp_->gather_masters(model_.params);  // rank 0 evaluates the f32 masters, as one process does
  if (!s_.lead()) {
    comm_.barrier(Comm::kWaitForLead);  // rank 0 evaluates
    return;
  }
  Timer t;
  // Frozen tensors: the model whole in f32 for the evaluation's forward (the frozen ones widened from the streamed
  // weights), for its duration.
  std::optional<ModelSlabs> whole;
  if (!model_.config.trains_all()) whole.emplace(merged_f32(model_.params, *copy_));
  EvalResult er = evaluate_exact_match(whole ? *whole : model_.params, *tok_, *tpl_, eval_specs_, EvalOptions{});
  last_eval_ = {{"exact_match", er.exact_match()}, {"total", er.total}, {"correct", er.correct}, {"seconds", t.seconds()}};
  log_->log_eval(at_step, last_eval_);
  write_json_file(fmt::format("{}/eval-{}.json", s_.c.output_dir, at_step), er.to_json(/*with_predictions=*/true));
  if (dp_) dp_->release_unowned_masters(model_.params);
  comm_.barrier(Comm::kWaitForLead);
}

bool TrainingSession::any_rank_stopping(bool here) const {
  if (!dp_) return here;
  const std::vector<int64_t> seen = comm_.allgather_int(here ? 1 : 0);
  return std::find(seen.begin(), seen.end(), 1) != seen.end();
}

TrainResult TrainingSession::result(int64_t steps, const std::string& stopped_by, const std::string& stop_checkpoint,
                                    double seconds) {
  TrainResult r;
  r.steps = steps;
  r.stopped_by = stopped_by;
  r.stop_checkpoint = stop_checkpoint;
  r.tokens = tokens_total_;
  r.seconds = seconds;
  r.final_loss = last_loss_;
  r.output_dir = s_.c.output_dir;
  r.summary = {{"steps", r.steps},          {"tokens", r.tokens},      {"seconds", r.seconds},
               {"final_loss", r.final_loss}, {"plan", plan_.to_json()}, {"model", s_.c.model_name_or_path}};
  if (!stopped_by.empty()) {
    r.summary["stopped_by"] = stopped_by;
    r.summary["stop_checkpoint"] = stop_checkpoint;
  }
  if (!last_eval_.is_null()) {
    r.summary["eval_exact_match"] = last_eval_["exact_match"];
    r.summary["eval"] = last_eval_;
  }
  // As ZeRO counts optimizer state: the AdamW states and the f32 masters, both 1/N per rank when sharded.
  const size_t masters_kept = dp_ ? dp_->master_bytes_kept(model_.params) : model_.params.total_bytes();
  r.summary["host_optimizer_state_bytes_per_rank"] = states_.state_bytes + masters_kept;
  r.summary["host_adam_state_bytes_per_rank"] = states_.state_bytes;
  r.summary["host_master_bytes_per_rank"] = masters_kept;
  r.summary["peak_host_rss_bytes"] = peak_rss_bytes();  // rank 0's
  // Every rank's resident memory now (data parallel: between gathers, the sharded steady state) and at its peak.
  r.summary["host_rss_bytes_per_rank"] = comm_.allgather_int(int64_t(rss_bytes()));
  r.summary["peak_host_rss_bytes_per_rank"] = comm_.allgather_int(int64_t(peak_rss_bytes()));
  if (dp_) {
    r.summary["world_size"] = s_.ranks;
    r.summary["exchange_bytes_per_rank"] = dp_->bytes_sent();  // rank 0's
  }
  return r;
}

}  // namespace lt
