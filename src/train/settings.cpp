#include "train/settings.h"

#include <filesystem>
#include <fmt/format.h>

#include "core/error.h"
#include "core/parallel.h"
#include "core/procfs.h"
#include "core/units.h"
#include "dist/comm.h"
#include "io/nvme.h"
#include "io/paths.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace lt {

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

size_t host_memory_budget(const TrainConfig& c) {
  return c.host_memory == "auto" ? mem_available_bytes() : parse_size(c.host_memory, "host_memory");
}

const char* host_memory_name(const TrainConfig& c) { return c.host_memory == "auto" ? "MemAvailable" : "host_memory"; }

// While training (optim/adamw.h host_parameter_bytes_per_rank), or — data parallel with a compute copy, from
// scratch — before that, when every rank has drawn the whole model (one process's random stream): whole masters,
// the copy and its states.
double host_parameter_bytes(const TrainConfig& c, const ModelConfig& mc, int ranks, bool from_scratch) {
  const AdamWConfig ac = adamw_config(c);
  const bool copy = c.compute_dtype == "bf16";
  const double training = host_parameter_bytes_per_rank(mc, ac, copy, ranks);
  // Frozen tensors (freeze, LoRA; model/finetune.h): a checkpoint is read a slab at a time into the streamed weights
  // and the masters (one slab in f32 beside them); merging adapters first, or drawing a model from scratch, holds the
  // f32 model whole once.
  if (!mc.trains_all()) {
    const bool whole = from_scratch || !lora_adapters(c).merge.empty();
    size_t slab = std::max(SlabLayout::make(mc, SlabKind::embedding).bytes(), SlabLayout::make(mc, SlabKind::head).bytes());
    for (int64_t l = 0; l < mc.num_layers; ++l) slab = std::max(slab, SlabLayout::make_layer(mc, l).bytes());
    return whole ? std::max(training, double(mc.num_parameters()) * (4 + (copy ? 2 : 4))) : training + double(slab);
  }
  if (!from_scratch || !copy || ranks == 1) return training;
  const double drawn = double(mc.num_parameters()) * (4 + 2) + double(model_state_report(mc, ac).state_bytes) / ranks;
  return std::max(training, drawn);
}

namespace {

// Before any weight is read: a model whose parameters alone (masters, gradients, compute copy, optimizer states)
// exceed the host budget is refused with the numbers, instead of failing part way through loading.
void check_host_memory_for_parameters(const TrainConfig& c, int ranks) {
  const size_t budget = host_memory_budget(c);
  if (budget == 0) return;
  fs::path p(c.model_name_or_path);
  if (is_directory_path(p)) p /= "config.json";
  if (!is_file_path(p)) return;  // loading the model names what is missing
  ModelConfig mc = load_model_config(p.string());
  mc.finetune = finetune_of(c, mc);
  const bool from_scratch = is_file_path(c.model_name_or_path);  // a config.json alone
  const double need = host_parameter_bytes(c, mc, ranks, from_scratch);
  LT_CHECK(need < double(budget),
           "host memory: {} parameters need {} on the host (f32 weights and gradients{}, {}-bit optimizer states) "
           "before any activation, but {} is {}; lower the model size, or use a host with more memory",
           mc.num_parameters(), format_bytes(need), c.compute_dtype == "bf16" ? ", the bf16 compute copy" : "",
           c.optimizer_state_bits, host_memory_name(c), format_bytes(double(budget)));
}

std::string resume_dir_of(const TrainConfig& c) {
  if (c.resume_from_checkpoint == "true" || c.resume_from_checkpoint == "latest") return latest_checkpoint(c.output_dir);
  if (c.resume_from_checkpoint.empty() || c.resume_from_checkpoint == "false") return "";
  LT_CHECK(is_directory_path(c.resume_from_checkpoint), "resume_from_checkpoint: {} is not a directory",
           c.resume_from_checkpoint);
  return c.resume_from_checkpoint;
}

}  // namespace

TrainSettings resolve_train_settings(const TrainConfig& asked, const Comm& comm) {
  TrainSettings s;
  s.c = asked;
  s.rank = comm.rank();
  s.ranks = comm.size();
  s.gpu = launcher_local_rank();
  s.backend = Backend::parse(asked.device, "device");
  // compute_dtype: auto picks what the device does fast. The resolved dtype is what the run records, so resuming on
  // a host that resolves differently is refused.
  if (asked.compute_dtype == "auto")
    s.c.compute_dtype = s.backend.auto_compute(&s.compute_why) == ComputeType::bf16 ? "bf16" : "f32";
  if (s.c.threads > 0) set_num_threads(int(s.c.threads));
  s.compute = s.c.compute_dtype == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  s.activations = s.backend.activation_storage(asked.activation_dtype, s.compute, "activation_dtype");
  s.c.activation_dtype = dtype_name(s.activations);  // resolved, as recorded with checkpoints
  s.B = s.c.per_device_train_batch_size;
  s.T = s.c.cutoff_len;
  s.device_bytes = parse_size(s.c.device_memory, "device_memory");
  s.link = LinkSpec{s.c.link_gbps, s.c.link_gbps, 0};
  s.exec.compute = s.compute;
  s.exec.activations = s.activations;
  s.exec.kernels = s.backend.layer_kernels(s.activations);
  s.exec.weight_buffers = int(s.c.weight_buffers);
  s.exec.resident_head = s.c.resident_head;
  check_host_memory_for_parameters(s.c, s.ranks);  // before anything is written or loaded
  make_directories(s.c.output_dir, "output_dir");
  if (!s.c.nvme_dir.empty()) ensure_nvme_dir(s.c.nvme_dir);
  s.resume_dir = resume_dir_of(s.c);
  return s;
}

}  // namespace lt
