// train/config.h — `lazytrain train CONFIG.yaml [key=value ...]`: the run's configuration.
//
// Keys follow LLaMA-Factory where it has one, so configs users already have mostly work; LazyTrain's own
// keys configure the device, memory tiers, the plan and the optimizer. Unknown keys are errors that name
// the key and suggest the closest known one; wrong types and bad values name the key and what was
// expected. Overrides on the command line (key=value) are parsed as YAML scalars and win over the file.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace lt {

struct TrainConfig {
  // --- model and data (LLaMA-Factory names) ---
  std::string model_name_or_path;       // an HF model directory (fine-tune) or a config.json (from scratch)
  std::vector<std::string> dataset;     // names in dataset_dir/dataset_info.json, or file paths
  std::string dataset_dir = "data";
  std::vector<std::string> eval_dataset;
  std::string template_name = "auto";   // `template`: qwen2_5 | qwen3 | qwen3_5 | plain | auto (from the model)
  int64_t cutoff_len = 1024;
  bool packing = false;
  std::string on_bad_example = "stop";  // stop | skip
  // --- optimisation ---
  int64_t per_device_train_batch_size = 1;
  int64_t per_device_eval_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5;
  std::string lr_scheduler_type = "linear";  // cosine | linear | constant
  double warmup_ratio = 0;
  int64_t warmup_steps = 0;                  // wins over warmup_ratio when > 0
  int64_t max_steps = -1;                    // > 0 wins over num_train_epochs
  double num_train_epochs = 3.0;
  double max_grad_norm = 1.0;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  int64_t seed = 42;
  // Mixture-of-Experts models: the load-balancing loss's coefficient (LLaMA-Factory's moe_aux_loss_coef, which
  // trains with output_router_logits on). Unset (NaN, written null): the model's router_aux_loss_coef; 0: none.
  double moe_aux_loss_coef = std::numeric_limits<double>::quiet_NaN();
  // --- fine-tuning method (LLaMA-Factory's keys; model/finetune.h) ---
  std::string finetuning_type = "full";   // full | freeze | lora (LLaMA-Factory's default is lora; LazyTrain's full)
  int64_t freeze_trainable_layers = 2;    // the last N layers train; negative: the first -N
  std::vector<std::string> freeze_trainable_modules = {"all"};  // within them: all, or self_attn, mlp, ...
  std::vector<std::string> freeze_extra_modules;                // and: embed_tokens, norm, lm_head
  int64_t lora_rank = 8;
  double lora_alpha = std::numeric_limits<double>::quiet_NaN();  // unset (null): 2 × lora_rank
  double lora_dropout = 0;
  std::vector<std::string> lora_target = {"all"};  // all, or linear names: q_proj, v_proj, in_proj_qkv, ...
  bool use_rslora = false;                         // scale α / √r
  std::vector<std::string> additional_target;      // whole modules trained beside the adapters: embed_tokens, ...
  std::vector<std::string> adapter_name_or_path;   // PEFT adapters: the last one trained on, the others merged first
  bool create_new_adapter = false;                 // merge every adapter given and train a new one
  // --- output ---
  std::string output_dir;
  int64_t logging_steps = 10;
  int64_t save_steps = 500;                  // 0: only at the end
  int64_t save_total_limit = 3;              // checkpoints kept (oldest removed); <= 0 keeps all
  int64_t eval_steps = 0;                    // 0: no evaluation during training (still at the end if eval data)
  std::string resume_from_checkpoint;        // "" | "true" (latest in output_dir) | a checkpoint path
  std::string save_dtype = "bf16";           // model files: bf16 | f32
  // --- LazyTrain ---
  std::string device = "cpu";                // cpu, cuda (GPU 0), or cuda-sim (the CUDA kernels emulated on the CPU)
  std::string device_memory = "8GiB";
  std::string host_memory = "auto";          // host memory the run may use (weights, gradients, optimizer states,
                                             // host activations); auto: MemAvailable. Checked before loading.
  std::string host_act_memory = "auto";      // host memory for activations; auto: a quarter of host_memory
  std::string nvme_dir;                      // empty: no NVMe tier
  std::string nvme_size = "0";
  double link_gbps = 0;                      // emulated link of the cpu device; 0 = unlimited
  int64_t weight_buffers = 2;                // layer weight buffers on the device (more: deeper prefetch,
                                             // and micro-batches start on more carried layers)
  bool save_on_signal = true;                // SIGTERM / SIGINT: stop after the step in progress and save a
                                             // checkpoint there (false: stop without saving)
  bool resident_head = false;                // the head's weights on the device all step (gradient accumulation:
                                             // micro-batches after the first do not upload them again)
  std::string plan = "auto";                 // auto | keep-all | every:K | host:K | nvme:K | a plan file
  int64_t optimizer_state_bits = 8;          // 8 (Hybrid 8-bit AdamW) | 32
  std::string compute_dtype = "bf16";        // bf16 | f32 | auto: bf16 where the host's GEMM runs bf16
  std::string activation_dtype = "auto";     // bf16 | f32 | auto: storage of kept activations (auto: as compute)
                                             // natively, f32 where bf16 would be widened (AVX2-only CPUs)
  int64_t threads = 0;                       // 0: all cores
  // Data parallel (mpirun -np N): the network per rank, GB/s each way, for the planner (0: measured at start),
  // and how long a rank waits for the others in one exchange before the job ends (0: forever).
  double net_gbps = 0;
  double dist_timeout_s = 900;

  std::string source;                        // the file it came from (messages)
  std::vector<std::string> given;            // the keys the file and the overrides set
  nlohmann::json to_json() const;            // every key, as it would be written in YAML
  // Keys whose change makes a resumed run differ from an uninterrupted one (resume refuses them).
  static const std::vector<std::string>& result_keys();
};

// The tensors a run of `c` trains on `model` (model/finetune.h): null for full fine-tuning. Errors name the key.
std::shared_ptr<const Finetune> finetune_of(const TrainConfig& c, const ModelConfig& model);
// A LoRA run's adapter_name_or_path as LLaMA-Factory reads it: the adapters merged into the base first, and the one
// training continues (empty: a new adapter — none given, or create_new_adapter). Both empty for other methods.
struct LoraAdapters {
  std::vector<std::string> merge;
  std::string resume;
};
LoraAdapters lora_adapters(const TrainConfig& c);

// Reads CONFIG.yaml and applies `overrides` ("key=value"); validates everything.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The known key closest to `key` by edit distance ("" when nothing is close): for "did you mean".
std::string closest_key(const std::string& key, const std::vector<std::string>& known);

}  // namespace lt
