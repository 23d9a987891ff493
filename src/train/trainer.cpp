// train/trainer.cpp — the training loop. Reads top to bottom as the steps of a run.
#include "train/trainer.h"

#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <optional>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "core/units.h"
#include "device/device.h"
#include "dist/comm.h"
#include "dist/data_parallel.h"
#include "exec/backend.h"
#include "exec/executor.h"
#include "io/json_file.h"
#include "io/nvme.h"
#include "model/model.h"
#include "ops/gemm.h"
#include "optim/adamw.h"
#include "plan/measure.h"
#include "plan/plan_file.h"
#include "plan/planner.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/evaluate.h"
#include "train/run_log.h"
#include "train/schedule.h"
#include "train/stop_signal.h"

namespace fs = std::filesystem;

namespace lt {
namespace {

// This process's peak resident memory (getrusage: ru_maxrss is in KiB on Linux).
size_t peak_rss_bytes() {
  struct rusage u {};
  return getrusage(RUSAGE_SELF, &u) == 0 ? size_t(u.ru_maxrss) * 1024 : 0;
}

// This process's resident memory now (/proc/self/statm's second field, in pages).
size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  return f >> pages >> resident ? resident * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

size_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// The host memory the run may use: host_memory, or MemAvailable (0 when /proc/meminfo says nothing: unchecked).
size_t host_memory_budget(const TrainConfig& c) {
  return c.host_memory == "auto" ? mem_available_bytes() : parse_size(c.host_memory, "host_memory");
}

// What the budget is called in messages.
const char* host_memory_name(const TrainConfig& c) { return c.host_memory == "auto" ? "MemAvailable" : "host_memory"; }

// The optimizer's settings from the config.
AdamWConfig adamw_config(const TrainConfig& c) {
  AdamWConfig ac;
  ac.beta1 = c.adam_beta1;
  ac.beta2 = c.adam_beta2;
  ac.eps = c.adam_epsilon;
  ac.weight_decay = c.weight_decay;
  ac.max_grad_norm = c.max_grad_norm;
  ac.matrix_states = c.optimizer_state_bits == 8 ? StatePrecision::q8 : StatePrecision::f32;
  return ac;
}

// Host bytes a rank keeps for the parameters at its peak: while training (optim/adamw.h
// host_parameter_bytes_per_rank), or — data parallel with a compute copy, from scratch — before that, when every
// rank has drawn the whole model (one process's random stream): whole masters, the copy and its states.
double host_parameter_bytes(const TrainConfig& c, const ModelConfig& mc, int ranks, bool from_scratch) {
  const AdamWConfig ac = adamw_config(c);
  const bool copy = c.compute_dtype == "bf16";
  const double training = host_parameter_bytes_per_rank(mc, ac, copy, ranks);
  if (!from_scratch || !copy || ranks == 1) return training;
  const double drawn = double(mc.num_parameters()) * (4 + 2) + double(model_state_report(mc, ac).state_bytes) / ranks;
  return std::max(training, drawn);
}

// Before any weight is read: a model whose parameters alone (masters, gradients, compute copy, optimizer states)
// exceed the host budget is refused with the numbers, instead of failing part way through loading.
void check_host_memory_for_parameters(const TrainConfig& c, int ranks) {
  const size_t budget = host_memory_budget(c);
  if (budget == 0) return;
  fs::path p(c.model_name_or_path);
  if (fs::is_directory(p)) p /= "config.json";
  if (!fs::is_regular_file(p)) return;  // load_model_source names what is missing
  const ModelConfig mc = load_model_config(p.string());
  const bool from_scratch = fs::is_regular_file(c.model_name_or_path);  // a config.json alone
  const double need = host_parameter_bytes(c, mc, ranks, from_scratch);
  LT_CHECK(need < double(budget),
           "host memory: {} parameters need {} on the host (f32 weights and gradients{}, {}-bit optimizer states) "
           "before any activation, but {} is {}; lower the model size, or use a host with more memory",
           mc.num_parameters(), format_bytes(need), c.compute_dtype == "bf16" ? ", the bf16 compute copy" : "",
           c.optimizer_state_bits, host_memory_name(c), format_bytes(double(budget)));
}

// The model: an HF directory to fine-tune, or a config.json to train from scratch (seeded init).
struct ModelSource {
  ModelConfig config;
  ModelSlabs params;
  SavedExtras extras;  // written into every checkpoint: the untrained tensors, the F32-kept ones
  std::string dir;  // where config.json (and the tokenizer) live
  bool from_scratch = false;
  // Data parallel in bf16 compute: the masters' elements this rank keeps (dist/data_parallel.h), the only ones
  // loaded (from scratch: all are drawn, as one process draws them, and the rest released).
  std::optional<TensorRanges> owned_masters;
  const TensorRanges* only() const { return owned_masters ? &*owned_masters : nullptr; }
};

ModelSource load_model_source(const TrainConfig& c, const Comm& comm) {
  ModelSource m;
  if (comm.size() > 1 && c.compute_dtype == "bf16") {
    fs::path cfg(c.model_name_or_path);
    if (fs::is_directory(cfg)) cfg /= "config.json";
    m.owned_masters = sharded_master_ranges(comm, load_model_config(cfg.string()));
  }
  fs::path p(c.model_name_or_path);
  if (fs::is_regular_file(p)) {  // a config.json alone: train from scratch
    m.config = load_model_config(p.string());
    m.params = ModelSlabs(m.config);
    init_random(m.params, uint64_t(c.seed), 0.02f);
    m.dir = p.parent_path().string();
    m.from_scratch = true;
  } else {
    LoadedModel lm = load_hf_model(p.string(), m.only());
    m.config = lm.config;
    m.params = std::move(lm.params);
    m.extras = std::move(lm.extras);
    m.dir = p.string();
  }
  return m;
}

// The keys whose values change a run's results, as saved with its checkpoints. Data parallel: what changes
// results is the global number of micro-batches per step (ranks × gradient_accumulation_steps), not how they are
// dealt, so that is saved instead and a run resumes on any number of ranks that keeps it.
nlohmann::json result_config(const TrainConfig& c, int ranks) {
  nlohmann::json all = c.to_json(), out;
  for (const auto& k : TrainConfig::result_keys())
    if (k != "gradient_accumulation_steps") out[k] = all[k];
  out["global_micro_batches"] = c.gradient_accumulation_steps * ranks;
  return out;
}

// Sum of the per-step measurements between two logging steps.
struct Window {
  double loss_sum = 0;
  int64_t counted = 0, tokens = 0, steps = 0;
  double seconds = 0, grad_norm = 0;
  StepSummary time;
  void add(const StepStats& st) {
    time.compute_s += st.summary.compute_s;
    time.h2d_s += st.summary.h2d_s;
    time.d2h_s += st.summary.d2h_s;
    time.nvme_s += st.summary.nvme_s;
    time.host_s += st.summary.host_s;
    time.optimizer_s += st.summary.optimizer_s;
    time.exposed_s += st.summary.exposed_s;
  }
};

}  // namespace

ChatTemplateKind train_template_kind(const TrainConfig& c, ModelType type) {
  return c.template_name == "auto" ? default_chat_template(model_type_name(type))
                                   : parse_chat_template_kind(c.template_name);
}

DataLoader load_train_data(const TrainConfig& c, const Tokenizer& tok, const ChatTemplate& tpl) {
  TokenizeOptions topt;
  topt.cutoff_len = c.cutoff_len;
  topt.on_bad_example = parse_on_bad_example(c.on_bad_example);
  topt.cache_dir = c.output_dir + "/data_cache";
  TokenizedDataset data = load_datasets(resolve_datasets(c.dataset, c.dataset_dir), tok, tpl, topt);
  LoaderOptions lopt;
  lopt.batch_size = c.per_device_train_batch_size;
  lopt.seed = uint64_t(c.seed);
  lopt.packing = c.packing ? Packing::on : Packing::off;
  lopt.row_len = c.cutoff_len;
  lopt.pad_id = default_pad_id(tok);
  return DataLoader(std::move(data), lopt);
}

TrainResult run_training(const TrainConfig& asked) {
  Timer run_timer;
  // Data parallel (`mpirun -np N lazytrain train ...`): every rank runs this function; rank 0 alone writes.
  const Comm& comm = Comm::world();
  const bool lead = comm.rank() == 0;
  const int ranks = comm.size();
  TrainConfig c = asked;
  std::string compute_why;
  // The device kind, parsed once; under cuda-sim the host ops run on the CUDA kernels for the whole run.
  const Backend backend = Backend::parse(asked.device, "device");
  const KernelScope kernels = backend.kernels();
  // compute_dtype: auto picks what the device does fast. The resolved dtype is what the run records, so resuming on
  // a host that resolves differently is refused.
  if (asked.compute_dtype == "auto")
    c.compute_dtype = backend.auto_compute(&compute_why) == ComputeType::bf16 ? "bf16" : "f32";
  if (c.threads > 0) set_num_threads(int(c.threads));
  const ComputeType compute = c.compute_dtype == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  const DType activations = backend.activation_storage(asked.activation_dtype, compute, "activation_dtype");
  c.activation_dtype = dtype_name(activations);  // resolved, as recorded with checkpoints
  check_host_memory_for_parameters(c, ranks);  // before anything is written or loaded
  fs::create_directories(c.output_dir);
  if (!c.nvme_dir.empty()) ensure_nvme_dir(c.nvme_dir);

  // --- resume? ---
  std::string resume_dir;
  if (c.resume_from_checkpoint == "true" || c.resume_from_checkpoint == "latest") {
    resume_dir = latest_checkpoint(c.output_dir);
  } else if (!c.resume_from_checkpoint.empty() && c.resume_from_checkpoint != "false") {
    resume_dir = c.resume_from_checkpoint;
    LT_CHECK(fs::is_directory(resume_dir), "resume_from_checkpoint: {} is not a directory", resume_dir);
  }

  // --- model, tokenizer, template, data ---
  ModelSource model = load_model_source(c, comm);
  const ModelConfig& mc = model.config;
  Tokenizer tok = Tokenizer::load(model.dir);
  ChatTemplate tpl(train_template_kind(c, mc.type), tok);
  // Rank 0 tokenises (and writes the data cache) first; the others then read the cache it wrote.
  std::optional<DataLoader> loaded;
  if (lead) loaded.emplace(load_train_data(c, tok, tpl));
  comm.barrier();  // no timeout yet: tokenising a large data set takes what it takes
  if (!lead) loaded.emplace(load_train_data(c, tok, tpl));
  comm.set_timeout(c.dist_timeout_s);  // from here a rank that stops answering ends the job
  DataLoader& loader = *loaded;
  // A step is `micro_per_step` micro-batches: rank r runs a·N + r of them (a = 0..A-1), as one process with N·A
  // accumulation steps would run them all, in that order.
  const int64_t micro_per_step = c.gradient_accumulation_steps * ranks;
  const int64_t steps_per_epoch = std::max<int64_t>(1, loader.steps_per_epoch() / micro_per_step);
  const int64_t total_steps =
      c.max_steps > 0 ? c.max_steps : int64_t(std::ceil(c.num_train_epochs * double(steps_per_epoch)));
  const int64_t warmup = c.warmup_steps > 0 ? c.warmup_steps : int64_t(std::ceil(c.warmup_ratio * double(total_steps)));
  const LrSchedule schedule{c.lr_scheduler_type, c.learning_rate, warmup, total_steps};

  RunLog log(c.output_dir, total_steps, !resume_dir.empty(), /*silent=*/!lead);
  double net_gbps = c.net_gbps;
  if (ranks > 1) {
    if (net_gbps <= 0) net_gbps = measure_exchange_gbps(comm);
    log.message(fmt::format("data parallel: {} ranks x {} micro-batches per step (global batch {} rows); exchange "
                            "{:.3g} GB/s per rank{}",
                            ranks, c.gradient_accumulation_steps, micro_per_step * c.per_device_train_batch_size,
                            net_gbps, c.net_gbps > 0 ? " (net_gbps)" : " (measured)"));
  }
  log.message(fmt::format("model: {} ({}, {} layers, {:.1f}M parameters{})", c.model_name_or_path,
                          model_type_name(mc.type), mc.num_layers, double(mc.num_parameters()) / 1e6,
                          model.from_scratch ? ", random init" : ""));
  log.message(loader.data().summary());
  log.message(fmt::format("compute: {} on {}{}; activations stored in {}", c.compute_dtype,
                          backend.kind == DeviceKind::cpu ? std::string(isa_name(isa_level(cpu_features()))) : c.device,
                          compute_why,
                          c.activation_dtype));

  // --- the plan, and the memory check before any work ---
  const int64_t B = c.per_device_train_batch_size, T = c.cutoff_len;  // the largest batch shape
  const size_t device_bytes = parse_size(c.device_memory, "device_memory");
  ExecOptions eo;
  eo.compute = compute;
  eo.activations = activations;
  eo.kernels = backend.layer_kernels(activations);
  eo.weight_buffers = int(c.weight_buffers);
  eo.resident_head = c.resident_head;
  Plan plan;
  if (c.plan == "auto") {
    MeasureOptions mo;
    mo.backend = backend;
    mo.gpu = launcher_local_rank();
    // The measurement device holds one layer's full working set at this shape; it is not the budget
    // (the planner gets that below), and the CPU device's arena only touches the pages it uses.
    mo.device_memory = std::max(device_bytes, size_t(8) << 30);
    mo.link = LinkSpec{c.link_gbps, c.link_gbps, 0};
    mo.compute = compute;
    mo.activations = activations;
    mo.nvme_dir = c.nvme_dir;
    mo.reps = 1;
    PlanRequest req;
    req.cfg = mc;
    req.model_name = c.model_name_or_path;
    req.B = B;
    req.T = T;
    req.profile = measure_profile(mc, B, T, mo);
    req.budget.device_bytes = device_bytes;
    req.budget.host_act_bytes =
        c.host_act_memory == "auto" ? host_memory_budget(c) / 4 : parse_size(c.host_act_memory, "host_act_memory");
    req.budget.nvme_bytes = c.nvme_dir.empty() ? 0 : parse_size(c.nvme_size, "nvme_size");
    req.options.exec = eo;
    req.options.allow_nvme = !c.nvme_dir.empty();
    req.options.ranks = ranks;
    req.options.net_gbps = net_gbps;
    req.options.optimizer_state_bits = int(c.optimizer_state_bits);
    PlanReport report = make_plan(req);
    LT_CHECK(report.found, "plan: auto found no plan that fits: {}", report.message);
    plan = executable_plan(report.instance, report.best.plan, report.best.windows);
    log.message(report.table());
  } else {
    plan = Plan::parse(c.plan, mc.num_layers);
  }
  eo.mlp_chunk_tokens = plan.mlp_chunk_tokens;  // the planner's (or the plan file's) MLP chunk
  const WorkingSet ws = plan_working_set(mc, B, T, plan, eo);
  LT_CHECK(ws.device_bytes() <= device_bytes,
           "plan '{}' needs {} of device memory at batch {} x {} but device_memory is {}", plan.name,
           format_bytes(double(ws.device_bytes())), B, T, format_bytes(double(device_bytes)));
  {
    // Host memory: masters + grads + bf16 copy + optimizer states + host activations.
    const double host_need =
        host_parameter_bytes(c, mc, ranks, model.from_scratch) + double(ws.host_activation_bytes);
    const size_t avail = host_memory_budget(c);
    LT_CHECK(avail == 0 || host_need < double(avail),
             "host memory: the run needs about {} (weights, gradients, optimizer states, host activations {}) but "
             "{} is {}",
             format_bytes(host_need), format_bytes(double(ws.host_activation_bytes)),
             host_memory_name(c), format_bytes(double(avail)));
    if (ws.nvme_bytes > 0) {
      struct statvfs sv {};
      LT_CHECK(statvfs(c.nvme_dir.c_str(), &sv) == 0, "nvme_dir {}: {}", c.nvme_dir, std::strerror(errno));
      const double free_bytes = double(sv.f_bavail) * double(sv.f_frsize);
      LT_CHECK(double(ws.nvme_bytes) < free_bytes, "nvme_dir {}: the plan writes {} of activations but {} is free",
               c.nvme_dir, format_bytes(double(ws.nvme_bytes)), format_bytes(free_bytes));
    }
    log.message(fmt::format("plan {}: device {} of {} (peak, packed), host activations {}, nvme {}; host needs ~{}",
                            plan.name, format_bytes(double(ws.device_bytes())), format_bytes(double(device_bytes)),
                            format_bytes(double(ws.host_activation_bytes)), format_bytes(double(ws.nvme_bytes)),
                            format_bytes(host_need)));
  }

  // --- device, executor, optimizer ---
  // What the device kind runs: exec/backend.h. Data parallel: each rank its own GPU, local rank r on GPU r.
  std::unique_ptr<Device> device = backend.open(device_bytes, LinkSpec{c.link_gbps, c.link_gbps, 0}, launcher_local_rank());
  std::unique_ptr<NvmeStore> nvme;
  if (ws.nvme_bytes > 0) {
    LT_CHECK(!c.nvme_dir.empty(), "plan '{}' uses the nvme tier: set nvme_dir", plan.name);
    NvmeOptions no;
    no.dir = c.nvme_dir;
    no.capacity_bytes = ws.nvme_bytes;
    nvme = NvmeStore::open(no);
    log.message("nvme: " + nvme->describe());
  }
  StreamingExecutor executor(mc, *device, eo, nvme.get());
  // Data parallel: a rank only ever touches the gradient chunks it owns (the exchange stages the rest), so the
  // other chunks' pages are never faulted in (ZeRO-2's memory, without a second layout).
  ModelSlabs grads(mc, DType::f32, ranks > 1 ? Fill::none : Fill::zero);
  std::optional<ModelSlabs> copy;
  if (compute == ComputeType::bf16) copy.emplace(mc, DType::bf16);
  // The slabs the streams copy, pinned for a GPU's DMA (the CPU device has nothing to pin).
  PinnedSlabs pins(*device);
  if (backend.pins_host_memory()) {
    pins.pin(copy ? *copy : model.params, "weights");
    if (ranks == 1) pins.pin(grads, "gradients");  // data parallel: the executor's own staging is pinned
    log.message(fmt::format("pinned {} of host slabs in {:.2f} s", format_bytes(double(pins.bytes())), pins.seconds()));
  }
  const AdamWConfig ac = adamw_config(c);
  // Data parallel: gradients reduce-scattered to their owners, the optimizer's states sharded the same way.
  std::unique_ptr<DataParallelGrads> dp;
  if (ranks > 1) dp = std::make_unique<DataParallelGrads>(comm, grads);
  HybridAdamW opt(model.params, grads, ac, dp ? &dp->owned_ranges() : nullptr);
  if (dp) dp->attach(opt, model.params, copy ? &*copy : nullptr);
  const StateReport states = opt.state_report();
  log.message(fmt::format("optimizer: AdamW, {}-bit states, {:.2f} bytes/parameter{}", c.optimizer_state_bits,
                          states.bytes_per_parameter(),
                          dp ? fmt::format("; rank 0 keeps them for {:.1f}M of the {:.1f}M parameters ({}){}",
                                           double(states.parameters) / 1e6, double(mc.num_parameters()) / 1e6,
                                           format_bytes(double(states.state_bytes)),
                                           dp->masters_sharded()
                                               ? fmt::format(" and {} of the f32 masters",
                                                             format_bytes(double(dp->master_bytes_kept(model.params))))
                                               : "")
                             : ""));

  // --- resume ---
  int64_t step = 0;
  if (!resume_dir.empty()) {
    const ResumeState st = parse_resume_state(load_checkpoint(resume_dir, model.params, opt, model.only()),
                                              resume_dir + "/resume/state.json");
    nlohmann::json saved = st.config;
    const nlohmann::json now = result_config(c, ranks);
    if (!saved.contains("global_micro_batches") && saved.contains("gradient_accumulation_steps"))
      saved["global_micro_batches"] = saved["gradient_accumulation_steps"];  // saved before data parallelism
    std::string diff;
    for (const auto& [k, v] : now.items())
      if (!saved.contains(k) || saved[k] != v)
        diff += fmt::format("{}{} ({} -> {})", diff.empty() ? "" : ", ", k, saved.value(k, nlohmann::json()).dump(), v.dump());
    LT_CHECK(diff.empty(), "{}: the config differs from the checkpoint's in keys that change results: {}", resume_dir,
             diff);
    step = st.step;
    loader.seek(st.cursor);
    log.message(fmt::format("resumed from {} at step {}", resume_dir, step));
  }
  // Data parallel in bf16 compute: a rank keeps (and loaded) the masters of its chunks; it makes their compute
  // copy, the owners the rest. The others' chunks are released first (from scratch they were drawn), so the
  // conversion's reads of them map no memory.
  if (dp) dp->release_unowned_masters(model.params);
  if (copy) make_compute_copy(*copy, model.params);
  if (dp && copy) dp->allgather_compute_copy(*copy);
  const ModelSlabs& weights = copy ? *copy : model.params;

  CheckpointWriter writer{c.output_dir, c.save_total_limit, c.save_dtype, size_t(5) << 30, model.dir};
  std::optional<PendingUpdate> pending;
  uint64_t weights_version = 1;  // names the streamed weights' contents (StreamingExecutor::step): bumped on every change
  auto flush_update = [&]() {  // apply the pending update now (before a save, an evaluation, the end)
    if (!pending) return;
    opt.update_all(pending->args, pending->compute_copy);
    pending.reset();
    ++weights_version;
  };
  auto save = [&](int64_t at_step) -> std::string {
    flush_update();  // on every rank: the weights stay the same everywhere
    // Data parallel: rank 0 writes for minutes at times; the others wait for it with kWaitForLead's patience.
    std::string path;
    if (dp) dp->gather_masters(model.params);  // rank 0 writes them whole
    if (lead) {
      nlohmann::json st = {{"cursor", loader.cursor().to_json()}, {"config", result_config(c, ranks)},
                           {"world_size", ranks}};
      path = save_checkpoint(writer, at_step, model.params, opt, st, model.extras);
      log.message("saved " + path);
    } else {
      dp->send_optimizer_state(opt);  // rank 0's save_state gathers it
    }
    if (dp) dp->release_unowned_masters(model.params);
    comm.barrier(Comm::kWaitForLead);
    return path;
  };

  std::vector<DatasetSpec> eval_specs;
  if (!c.eval_dataset.empty()) eval_specs = resolve_datasets(c.eval_dataset, c.dataset_dir);
  nlohmann::json last_eval;
  auto evaluate = [&](int64_t at_step) {
    if (eval_specs.empty()) return;
    flush_update();
    if (dp) dp->gather_masters(model.params);  // rank 0 evaluates the f32 masters, as one process does
    if (!lead) {
      comm.barrier(Comm::kWaitForLead);  // rank 0 evaluates
      return;
    }
    Timer t;
    EvalResult er = evaluate_exact_match(model.params, tok, tpl, eval_specs, EvalOptions{});
    last_eval = {{"exact_match", er.exact_match()}, {"total", er.total}, {"correct", er.correct},
                 {"seconds", t.seconds()}};
    log.log_eval(at_step, last_eval);
    write_json_file(fmt::format("{}/eval-{}.json", c.output_dir, at_step), er.to_json(/*with_predictions=*/true));
    if (dp) dp->release_unowned_masters(model.params);
    comm.barrier(Comm::kWaitForLead);
  };

  // --- the loop ---
  StopSignals stop;  // SIGTERM / SIGINT: stop after the step in progress (and save there)
  std::string stopped_by, stop_checkpoint;
  const double params_count = double(mc.num_parameters());
  Window win;
  double last_loss = 0;
  int64_t tokens_total = 0;
  Timer loop_timer;
  for (; step < total_steps; ++step) {
    Timer step_timer;
    const double lr = schedule.at(step);
    // All micro-batches first: the loss is the mean over every counted token of the optimizer step.
    // Every rank draws every micro-batch of the step (the loader is deterministic), so each knows the step's
    // token count and the cursor moves the same everywhere; rank r runs a·N + r.
    std::vector<Batch> micro;
    int64_t counted = 0;
    for (int64_t m = 0; m < micro_per_step; ++m) {
      micro.push_back(loader.next());
      counted += StepTokens::make(micro.back()).count;
      win.tokens += micro.back().N();
      tokens_total += micro.back().N();
    }
    LT_CHECK(counted > 0, "step {}: no trainable token in the batch (every label is -100)", step);
    GradNormPartials partials(mc.num_layers);
    std::vector<double> my_loss;  // [A]: this rank's micro-batches' loss sums
    for (int64_t a = 0; a < c.gradient_accumulation_steps; ++a) {
      const Batch& batch = micro[size_t(a * ranks + comm.rank())];
      GradTarget target{dp ? nullptr : &partials, a == 0 ? GradMode::overwrite : GradMode::add, counted, dp.get()};
      // The weights change with the first micro-batch's pending update; the others start on the layers
      // the previous micro-batch's backward left on the device.
      if (a == 0 && pending) ++weights_version;
      StepStats st = executor.step(grads, model.params, weights, batch, plan, nullptr,
                                   a == 0 && pending ? &*pending : nullptr, target, weights_version);
      if (a == 0) pending.reset();
      my_loss.push_back(st.loss_sum);
      win.add(st);
    }
    double loss_sum = 0;  // in the global micro-batch order, as one process adds them
    if (dp) {
      std::vector<double> losses(my_loss.size() * size_t(ranks));
      comm.allgather(my_loss.data(), my_loss.size() * sizeof(double), losses.data());
      for (int64_t m = 0; m < micro_per_step; ++m)
        loss_sum += losses[size_t(m % ranks) * my_loss.size() + size_t(m / ranks)];
      dp->finish_step(partials);
    } else {
      for (double l : my_loss) loss_sum += l;
    }
    StepPlan sp = opt.plan_step(partials.sum_of_squares());
    if (sp.skip) log.message(fmt::format("step {}: non-finite gradient norm, step skipped", step + 1));
    else pending = PendingUpdate{&opt, StepArgs{sp.step, lr, sp.clip}, copy ? &*copy : nullptr};
    win.loss_sum += loss_sum;
    win.counted += counted;
    win.grad_norm = sp.grad_norm;
    win.seconds += step_timer.seconds();
    win.steps += 1;
    last_loss = loss_sum / double(counted);

    const int64_t done = step + 1;
    if (done % c.logging_steps == 0 || done == total_steps) {
      const double tps = double(win.tokens) / win.seconds;
      log.log_step({{"step", done},
                    {"epoch", double(done) / double(steps_per_epoch)},
                    {"loss", win.loss_sum / double(win.counted)},
                    {"lr", lr},
                    {"grad_norm", win.grad_norm},
                    {"tokens_per_s", tps},
                    {"tflops", 6.0 * params_count * tps / 1e12},
                    {"peak_device_bytes", device->memory().peak},
                    {"host_activation_bytes", ws.host_activation_bytes},
                    {"nvme_bytes", ws.nvme_bytes},
                    {"compute_s", win.time.compute_s},
                    {"h2d_s", win.time.h2d_s},
                    {"d2h_s", win.time.d2h_s},
                    {"nvme_s", win.time.nvme_s},
                    {"host_s", win.time.host_s},
                    {"optimizer_s", win.time.optimizer_s},
                    {"exposed_s", win.time.exposed_s},
                    {"step_s", win.seconds / double(win.steps)},
                    {"elapsed_s", loop_timer.seconds()}});
      win = Window{};
    } else {
      log.tick(done, loop_timer.seconds());
    }
    const bool saved = c.save_steps > 0 && done % c.save_steps == 0 && done < total_steps;
    if (saved) stop_checkpoint = save(done);
    if (c.eval_steps > 0 && done % c.eval_steps == 0 && done < total_steps) evaluate(done);
    // A signal reaches the ranks at different moments: they stop together, at the first step any rank saw it.
    const bool stop_now = dp ? [&] {
      const std::vector<int64_t> seen = comm.allgather_int(stop.requested() ? 1 : 0);
      return std::find(seen.begin(), seen.end(), 1) != seen.end();
    }() : stop.requested();
    if (stop_now && done < total_steps) {
      stopped_by = stop.requested() ? stop.name() : "SIGTERM";  // seen by another rank
      if (!c.save_on_signal) stop_checkpoint.clear();
      else if (!saved) stop_checkpoint = save(done);
      log.message(fmt::format("{} at step {}: stopped{}", stopped_by, done,
                              stop_checkpoint.empty() ? " without a checkpoint (save_on_signal: false)"
                                                      : "; resume with resume_from_checkpoint=true (" + stop_checkpoint + ")"));
      step = done;
      break;
    }
  }
  if (stopped_by.empty()) {
    stop_checkpoint.clear();
    save(total_steps);
    evaluate(total_steps);
  }
  log.finish();

  TrainResult r;
  r.steps = stopped_by.empty() ? total_steps : step;
  r.stopped_by = stopped_by;
  r.stop_checkpoint = stop_checkpoint;
  r.tokens = tokens_total;
  r.seconds = run_timer.seconds();
  r.final_loss = last_loss;
  r.output_dir = c.output_dir;
  r.summary = {{"steps", r.steps},          {"tokens", r.tokens},     {"seconds", r.seconds},
               {"final_loss", r.final_loss}, {"plan", plan.to_json()}, {"model", c.model_name_or_path}};
  if (!stopped_by.empty()) {
    r.summary["stopped_by"] = stopped_by;
    r.summary["stop_checkpoint"] = stop_checkpoint;
  }
  if (!last_eval.is_null()) {
    r.summary["eval_exact_match"] = last_eval["exact_match"];
    r.summary["eval"] = last_eval;
  }
  // As ZeRO counts optimizer state: the AdamW states and the f32 masters, both 1/N per rank when sharded.
  const size_t masters_kept = dp ? dp->master_bytes_kept(model.params) : model.params.total_bytes();
  r.summary["host_optimizer_state_bytes_per_rank"] = states.state_bytes + masters_kept;
  r.summary["host_adam_state_bytes_per_rank"] = states.state_bytes;
  r.summary["host_master_bytes_per_rank"] = masters_kept;
  r.summary["peak_host_rss_bytes"] = peak_rss_bytes();  // rank 0's
  // Every rank's resident memory now (data parallel: between gathers, the sharded steady state) and at its peak.
  r.summary["host_rss_bytes_per_rank"] = comm.allgather_int(int64_t(rss_bytes()));
  r.summary["peak_host_rss_bytes_per_rank"] = comm.allgather_int(int64_t(peak_rss_bytes()));
  if (dp) {
    r.summary["world_size"] = ranks;
    r.summary["exchange_bytes_per_rank"] = dp->bytes_sent();  // rank 0's
  }
  if (lead) write_json_file(c.output_dir + "/summary.json", r.summary);
  // The other ranks leave only once rank 0 has written everything: a launcher ends the job when one rank exits
  // with an error status (a signal's 143), which could otherwise cut rank 0 short.
  comm.barrier(Comm::kWaitForLead);
  return r;
}

}  // namespace lt
