// optim/adamw.h — the Hybrid 8-bit AdamW: per-slab optimizer state (f32 or blockwise 8-bit per tensor) and
// one fused pass per tensor that dequantises, clips, updates and requantises (math in optim/kernels.h).
//
// Which tensors get 8-bit states: the rules in order (glob over HF names, first match wins), else 2-D
// weights with at least min_q8_numel elements get `matrix_states` (8-bit by default) and everything else
// (norms, biases, small matrices) f32. The default rules keep the embedding at f32, as bitsandbytes does.
//
// Threading. AdamWSlab::update spreads one slab over the thread pool with a fixed partition (chunks of a
// tensor; 8-bit chunks are whole blocks), so its bits never depend on the thread count or vector path.
// update() of DIFFERENT slabs may run at the same time from different threads (each touches only its own
// slab's parameters, gradients, compute copy and state); two updates of the same slab must not overlap,
// and plan_step / save_state / load_state must not overlap any update.
//
// Legend: n elements of a tensor, B the 8-bit block size, L layers.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "core/aligned.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "optim/clip.h"
#include "optim/kernels.h"

namespace lt {

enum class StatePrecision : uint8_t {
  f32,  // m, v as f32: 8 bytes per parameter
  q8,   // m, v as 8-bit codes + one f32 absmax per block each: 2 + 8/B bytes per parameter
};
std::string_view state_precision_name(StatePrecision p);  // "f32", "q8"

struct PrecisionRule {
  std::string pattern;  // glob over HF names: '*' any run of characters (dots included), '?' one character
  StatePrecision precision;
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;                          // decoupled: p *= 1 - lr·wd
  double max_grad_norm = 1.0;                          // global-norm clipping; <= 0 turns it off
  int max_consecutive_skips = 3;                       // this many non-finite steps in a row is an error
  StatePrecision matrix_states = StatePrecision::q8;   // for 2-D weights of >= min_q8_numel elements
  int64_t min_q8_numel = 4096;
  int64_t block_size = 256;                            // B: a multiple of 16, at most kMaxBlock
  // Assigning `rules` replaces this default; push_back keeps the embedding at f32.
  std::vector<PrecisionRule> rules = {{"model.embed_tokens.weight", StatePrecision::f32}};
  std::vector<std::string> no_decay;                   // globs of tensors without weight decay
  int threads = 0;                                     // threads per slab update; 0: the process pool
};

bool glob_match(std::string_view pattern, std::string_view name);
StatePrecision choose_state_precision(const AdamWConfig& cfg, const std::string& hf_name, const Shape& shape);

// One tensor of a slab as the optimizer sees it.
struct OptimTensor {
  std::string name;                // HF name: rules, errors, checkpoint keys
  Shape shape;
  int64_t param_offset = 0;        // bytes from the slab start, in the f32 parameter and gradient slabs
  int64_t copy_offset = -1;        // bytes from the compute-copy slab start; -1: not written
  DType copy_dtype = DType::bf16;  // bf16 (matrices) or f32 (vectors) in the compute copy
  StatePrecision precision = StatePrecision::f32;
  bool decay = true;
  // Data parallel (ZeRO-1): the elements [own_begin, own_end) this rank updates and keeps states for; the whole
  // tensor by default (own_end -1). With 8-bit states own_begin is a multiple of the block size.
  int64_t own_begin = 0, own_end = -1;
  int64_t numel() const { return shape_numel(shape); }
  int64_t owned_end() const { return own_end < 0 ? numel() : own_end; }
  int64_t owned() const { return owned_end() - own_begin; }
};

// This rank's part of one optimizer state tensor: `bytes` bytes at byte `offset` of the whole tensor (`dtype`,
// `shape`). Without data parallelism every piece is the whole tensor.
struct StatePiece {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint8_t* data = nullptr;
  size_t bytes = 0, offset = 0;
};

// Data parallel: the whole state tensors from every rank's pieces, for the checkpoint (dist/data_parallel.h).
// Called by save_state on the rank that writes; returns views into `storage`.
using StateGather = std::function<NamedTensors(const std::vector<StatePiece>& mine,
                                               std::vector<AlignedBuffer<uint8_t>>& storage)>;
// Data parallel: after a slab's update (the owned elements), every rank's updated part to every rank: the f32
// masters and, when given, the compute copy.
using AfterUpdate = std::function<void(SlabKind kind, int64_t layer, uint8_t* compute_copy)>;

// One step's arguments for an update.
struct StepArgs {
  int64_t step = 1;   // AdamW's t, counted from 1 (bias correction)
  double lr = 0.0;    // this step's learning rate (schedules change it per step)
  float clip = 1.0f;  // clip coefficient from the global norm; 1: no clipping
};

// Optimizer state memory, padding excluded.
struct StateReport {
  int64_t parameters = 0;
  int64_t q8_parameters = 0;  // parameters whose states are 8-bit
  size_t state_bytes = 0;
  double bytes_per_parameter() const { return parameters ? double(state_bytes) / double(parameters) : 0.0; }
  StateReport& operator+=(const StateReport& o);
};

// The state of one slab's tensors in one 4 KiB-aligned buffer, and the fused update over them.
class AdamWSlab {
 public:
  AdamWSlab() = default;
  AdamWSlab(std::vector<OptimTensor> tensors, const AdamWConfig& cfg);

  // param: f32 master slab (updated); grad: f32 gradient slab at the same offsets (read); copy: the compute
  // copy slab (written for tensors with copy_offset >= 0) or nullptr.
  void update(uint8_t* param, const uint8_t* grad, const StepArgs& args, uint8_t* copy = nullptr,
              VectorPath path = best_vector_path());
  // The same update in two parts, for a table whose rows a lookup needs first: the elements of tensor 0's rows
  // `rows` [n] (ascending, distinct; rows of `width` elements) and, with `rest`, every other element of the slab.
  // With 8-bit states each part takes whole blocks (a block that holds an element of a listed row goes with the
  // rows). The two parts together update every element exactly as update() does. Tensor 0 must be whole (owned).
  void update_rows(uint8_t* param, const uint8_t* grad, const StepArgs& args, uint8_t* copy, const int32_t* rows,
                   int64_t n, int64_t width, bool rest, VectorPath path = best_vector_path());

  // Views of tensor i's state for its owned elements (element own_begin + j at index j): f32 states fill m, v;
  // 8-bit ones qm, qv, absmax_m, absmax_v ([blocks] of the owned elements).
  struct TensorState {
    float* m = nullptr;
    float* v = nullptr;
    uint8_t* qm = nullptr;
    uint8_t* qv = nullptr;
    float* absmax_m = nullptr;
    float* absmax_v = nullptr;
    int64_t blocks = 0;
  };
  TensorState state(size_t i) const;
  const std::vector<OptimTensor>& tensors() const { return tensors_; }
  int64_t block_size() const { return block_; }
  StateReport report() const;

  // Checkpoint tensors: "<name>.exp_avg", "<name>.exp_avg_sq" (f32) or "<name>.exp_avg.q8" (u8 codes,
  // the parameter's shape) and "<name>.exp_avg.absmax" ([blocks] f32), the same for exp_avg_sq.
  // collect_state: views of the whole tensors (a slab that owns every element); state_pieces: this rank's parts.
  void collect_state(NamedTensors& out) const;
  std::vector<StatePiece> state_pieces() const;
  // Reads this rank's part of every state tensor from a checkpoint of the whole tensors.
  void restore_state(const SafetensorsFile& file);

 private:
  struct Task {
    size_t tensor;
    int64_t begin, end;  // elements
  };
  void run(const std::vector<Task>& tasks, uint8_t* param, const uint8_t* grad, const StepArgs& args, uint8_t* copy,
           VectorPath path);
  std::vector<OptimTensor> tensors_;
  std::vector<int64_t> state_offset_;  // bytes into state_, per tensor
  std::vector<Task> tasks_;            // the fixed partition of one update
  AdamWConfig cfg_;
  int64_t block_ = 256;
  AlignedBuffer<uint8_t> state_;
};

// What to do with this step, from the gradient norm.
struct StepPlan {
  bool skip = false;     // non-finite norm: leave parameters and states as they are
  int64_t step = 0;      // AdamW's t for this step (unchanged when skipped)
  double grad_norm = 0;  // before clipping
  float clip = 1.0f;
};

// The optimizer of a whole model: one AdamWSlab per slab of the master weights, bound to the parameter
// and gradient slabs given at construction (both f32, same config; they must outlive the optimizer).
class HybridAdamW {
 public:
  // `owned` (data parallel): per slab (embedding, layers 0..L-1, head), per tensor, the elements [begin, end) this
  // rank updates and keeps states for; null: every element.
  using OwnedRanges = std::vector<std::vector<std::pair<int64_t, int64_t>>>;
  // `params` and `grads` hold the trained tensors (SlabSet::trained; every tensor under full fine-tuning).
  // copy_matrices: the matrices' dtype in the compute copy an update writes (bf16; f32 under freeze fine-tuning in
  // f32 compute, where the copy is what streams: model/finetune.h).
  HybridAdamW(ModelSlabs& params, const ModelSlabs& grads, AdamWConfig cfg, const OwnedRanges* owned = nullptr,
              DType copy_matrices = DType::bf16);
  void set_state_gather(StateGather gather) { gather_ = std::move(gather); }
  void set_after_update(AfterUpdate after) { after_update_ = std::move(after); }

  const AdamWConfig& config() const { return cfg_; }

  // Turns the step's gradient Σ g² (GradNormPartials::sum_of_squares) into a plan: skip when the norm is
  // not finite, else the next step number and the clip coefficient. The max_consecutive_skips-th
  // non-finite step in a row throws lt::Error.
  StepPlan plan_step(double grad_sum_of_squares);

  // Updates one slab: the unit the executor pipelines (update layer i while the next forward streams).
  // compute_copy: that slab in the compute-copy layout (SlabLayout::make(cfg, kind, DType::bf16)), or null.
  void update(SlabKind kind, int64_t layer, const StepArgs& args, uint8_t* compute_copy = nullptr);
  // The embedding's update in two parts (AdamWSlab::update_rows): the table rows `ids` [n] (ascending, distinct:
  // the next batch's ids present, which its lookup reads), then with `rest` the others — so the lookup waits for
  // n rows' update, not the table's. Not with a data-parallel after-update (the owners' parts are exchanged whole).
  void update_embedding_rows(const StepArgs& args, uint8_t* compute_copy, const int32_t* ids, int64_t n, bool rest);

  // Every slab's update in order (embedding, layers, head): a whole step's update at once.
  void update_all(const StepArgs& args, ModelSlabs* compute_copy = nullptr);

  // plan_step and, unless skipped, every slab's update in order. compute_copy: bf16 compute-copy slabs or null.
  StepPlan step(const GradNormPartials& partials, double lr, ModelSlabs* compute_copy = nullptr);

  int64_t steps_done() const { return step_; }
  int consecutive_skips() const { return consecutive_skips_; }
  StateReport state_report() const;
  AdamWSlab& slab_state(SlabKind kind, int64_t layer = 0);

  // Every slab's state, the step count and the skip count, as one safetensors file (atomic); load checks
  // that the file matches this model and configuration (tensor names, precision, block size). A sharded
  // optimizer saves through its StateGather (collective) and loads its own part.
  void save_state(const std::string& path) const;
  std::vector<StatePiece> state_pieces() const;  // every slab's, in order
  SafetensorsMetadata state_metadata() const;
  void load_state(const std::string& path);

 private:
  ModelSlabs& params_;
  const ModelSlabs& grads_;
  AdamWConfig cfg_;
  DType copy_matrices_ = DType::bf16;
  AdamWSlab embedding_, head_;
  std::vector<AdamWSlab> layers_;
  int64_t step_ = 0;
  int consecutive_skips_ = 0;
  StateGather gather_;
  AfterUpdate after_update_;
};

// The optimizer state a whole model needs under `cfg` (every element, nothing allocated): the planner's host
// memory (1/N of it per data-parallel rank).
StateReport model_state_report(const ModelConfig& model, const AdamWConfig& cfg);

// Host bytes one of `ranks` data-parallel ranks keeps for the parameters while training (dist/data_parallel.h;
// ranks 1: one process): 1/ranks of the f32 gradients and of the optimizer states; with a bf16 compute copy, the
// copy whole and 1/ranks of the f32 masters but the embedding's whole; without one, the masters whole (they are
// the streamed weights). Frozen tensors (model/finetune.h): the streamed weights of every tensor, the trained
// ones' f32 masters whole and 1/ranks of their gradients. The planner's host-memory line and the trainer's check
// before loading.
double host_parameter_bytes_per_rank(const ModelConfig& model, const AdamWConfig& cfg, bool compute_copy, int ranks);

// The trained tensors of one slab for the optimizer: HF names, offsets in the f32 trained layout and in the
// compute-copy layout (matrices `copy_matrices`), precision and weight decay per cfg.
std::vector<OptimTensor> optim_tensors(const ModelConfig& model, SlabKind kind, int64_t layer, const AdamWConfig& cfg,
                                       DType copy_matrices = DType::bf16);

}  // namespace lt
