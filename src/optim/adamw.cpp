#include "optim/adamw.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <system_error>
#include <tuple>

#include "core/error.h"
#include "core/parallel.h"

namespace lt {
namespace {

constexpr int64_t kTaskElems = 32768;  // elements per task of one slab update (8-bit: whole blocks)
// A thread takes this many consecutive tasks at a time (1M elements): handing tasks out one by one made
// each call start on memory its thread had not been streaming, and 2 threads lost 7-8% to cold
// prefetch (measured with bench/bench_adamw8_kernel's driver; 32 measured a little above 8). Which thread
// runs a task changes no bit.
constexpr int64_t kTasksPerGrab = 32;

// Sets the pool size for the calling thread's parallel loops (an OpenMP per-thread setting) and restores it.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(num_threads()), active_(n > 0) {
    if (active_) set_num_threads(n);
  }
  ~ScopedThreads() {
    if (active_) set_num_threads(saved_);
  }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
  bool active_;
};

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

}  // namespace

std::string_view state_precision_name(StatePrecision p) { return p == StatePrecision::q8 ? "q8" : "f32"; }

bool glob_match(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

StatePrecision choose_state_precision(const AdamWConfig& cfg, const std::string& hf_name, const Shape& shape) {
  for (const PrecisionRule& r : cfg.rules)
    if (glob_match(r.pattern, hf_name)) return r.precision;
  if (shape.size() == 2 && shape_numel(shape) >= cfg.min_q8_numel) return cfg.matrix_states;
  return StatePrecision::f32;
}

StateReport& StateReport::operator+=(const StateReport& o) {
  parameters += o.parameters;
  q8_parameters += o.q8_parameters;
  state_bytes += o.state_bytes;
  return *this;
}

// ---------------------------------------------------------------------------------------------------------
// AdamWSlab
// ---------------------------------------------------------------------------------------------------------

AdamWSlab::AdamWSlab(std::vector<OptimTensor> tensors, const AdamWConfig& cfg)
    : tensors_(std::move(tensors)), cfg_(cfg), block_(cfg.block_size) {
  LT_CHECK(block_ >= 16 && block_ <= kMaxBlock && block_ % 16 == 0,
           "optimizer block_size must be a multiple of 16 in [16, {}], got {}", kMaxBlock, block_);
  size_t offset = 0;
  for (const OptimTensor& t : tensors_) {
    LT_CHECK(t.param_offset % 4 == 0, "tensor '{}': parameter offset {} is not f32-aligned", t.name, t.param_offset);
    LT_CHECK(0 <= t.own_begin && t.own_begin <= t.owned_end() && t.owned_end() <= t.numel(),
             "tensor '{}': owned elements [{}, {}) outside its {}", t.name, t.own_begin, t.owned_end(), t.numel());
    LT_CHECK(t.precision == StatePrecision::f32 ||
                 (t.own_begin % block_ == 0 && (t.owned_end() == t.numel() || t.owned_end() % block_ == 0)),
             "tensor '{}': owned elements [{}, {}) cut an 8-bit block of {}", t.name, t.own_begin, t.owned_end(),
             block_);
    offset = align_up(offset, 64);
    state_offset_.push_back(int64_t(offset));
    const size_t n = size_t(t.owned());
    if (t.precision == StatePrecision::f32) offset += 2 * n * sizeof(float);
    else offset += 2 * align_up(n, 64) + 2 * size_t(blocks_of(t.owned(), block_)) * sizeof(float);
  }
  state_ = AlignedBuffer<uint8_t>(align_up(offset, kPageAlign));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const OptimTensor& t = tensors_[i];
    if (t.precision == StatePrecision::q8) {  // m = v = 0: the maps' zero codes (absmax 0 already)
      TensorState s = state(i);
      std::memset(s.qm, quant_zero_code(QuantMapKind::signed_dynamic), size_t(t.owned()));
      std::memset(s.qv, quant_zero_code(QuantMapKind::unsigned_dynamic), size_t(t.owned()));
    }
    const int64_t chunk = t.precision == StatePrecision::q8 ? block_ * std::max<int64_t>(1, kTaskElems / block_)
                                                            : kTaskElems;
    for (int64_t b = t.own_begin; b < t.owned_end(); b += chunk)
      tasks_.push_back({i, b, std::min(t.owned_end(), b + chunk)});
  }
}

AdamWSlab::TensorState AdamWSlab::state(size_t i) const {
  LT_CHECK(i < tensors_.size(), "optimizer state: tensor index {} out of range", i);
  const OptimTensor& t = tensors_[i];
  uint8_t* base = const_cast<uint8_t*>(state_.data()) + state_offset_[i];
  const size_t n = size_t(t.owned());
  TensorState s;
  if (t.precision == StatePrecision::f32) {
    s.m = reinterpret_cast<float*>(base);
    s.v = s.m + n;
  } else {
    s.blocks = blocks_of(t.owned(), block_);
    s.qm = base;
    s.qv = base + align_up(n, 64);
    s.absmax_m = reinterpret_cast<float*>(base + 2 * align_up(n, 64));
    s.absmax_v = s.absmax_m + s.blocks;
  }
  return s;
}

void AdamWSlab::update(uint8_t* param, const uint8_t* grad, const StepArgs& args, uint8_t* copy, VectorPath path) {
  run(tasks_, param, grad, args, copy, path);
}

void AdamWSlab::update_rows(uint8_t* param, const uint8_t* grad, const StepArgs& args, uint8_t* copy,
                            const int32_t* rows, int64_t n, int64_t width, bool rest, VectorPath path) {
  if (tensors_.empty()) return;
  const OptimTensor& t = tensors_[0];
  LT_CHECK(t.own_begin == 0 && t.owned() == t.numel() && width > 0 && t.numel() % width == 0,
           "optimizer update of '{}' by rows of {}: the tensor must be whole on this rank and of whole rows", t.name,
           width);
  // The listed rows' elements as runs, widened to whole 8-bit blocks and merged: [begin, end) ascending.
  const int64_t unit = t.precision == StatePrecision::q8 ? block_ : 1;
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t i = 0; i < n; ++i) {
    LT_CHECK(rows[i] >= 0 && rows[i] < t.numel() / width && (i == 0 || rows[i] > rows[i - 1]),
             "optimizer update of '{}': row {} out of order or outside its {} rows", t.name, rows[i], t.numel() / width);
    const int64_t b = int64_t(rows[i]) * width / unit * unit;
    const int64_t e = std::min(t.numel(), ((int64_t(rows[i]) + 1) * width + unit - 1) / unit * unit);
    if (!runs.empty() && b <= runs.back().second) runs.back().second = std::max(runs.back().second, e);
    else runs.push_back({b, e});
  }
  // The part's tasks: the runs (or the gaps between them, and the slab's other tensors), cut as update()'s are.
  const int64_t chunk = unit * std::max<int64_t>(1, kTaskElems / unit);
  std::vector<Task> tasks;
  auto cut = [&](size_t tensor, int64_t b, int64_t e) {
    for (; b < e; b += chunk) tasks.push_back({tensor, b, std::min(e, b + chunk)});
  };
  if (!rest) {
    for (const auto& [b, e] : runs) cut(0, b, e);
  } else {
    int64_t at = 0;
    for (const auto& [b, e] : runs) {
      cut(0, at, b);
      at = e;
    }
    cut(0, at, t.numel());
    for (const Task& task : tasks_)
      if (task.tensor != 0) tasks.push_back(task);
  }
  run(tasks, param, grad, args, copy, path);
}

void AdamWSlab::run(const std::vector<Task>& tasks, uint8_t* param, const uint8_t* grad, const StepArgs& args,
                    uint8_t* copy, VectorPath path) {
  if (tensors_.empty()) return;  // a frozen slab (model/finetune.h)
  LT_CHECK(param != nullptr && grad != nullptr, "optimizer update: parameter or gradient slab missing");
  const ScopedThreads threads(cfg_.threads);
  const AdamWScalars decayed =
      adamw_scalars(args.lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, args.step, args.clip);
  const AdamWScalars undecayed = adamw_scalars(args.lr, cfg_.beta1, cfg_.beta2, cfg_.eps, 0.0, args.step, args.clip);
  parallel_for(int64_t(tasks.size()), [&](int64_t k) {
    const Task& task = tasks[size_t(k)];
    const OptimTensor& t = tensors_[task.tensor];
    const TensorState s = state(task.tensor);
    const int64_t b = task.begin, n = task.end - task.begin, j = b - t.own_begin;  // j: index into the owned state
    float* p = reinterpret_cast<float*>(param + t.param_offset) + b;
    const float* g = reinterpret_cast<const float*>(grad + t.param_offset) + b;
    uint8_t* c = copy && t.copy_offset >= 0 ? copy + t.copy_offset : nullptr;
    bf16_t* c16 = c && t.copy_dtype == DType::bf16 ? reinterpret_cast<bf16_t*>(c) + b : nullptr;
    const AdamWScalars& sc = t.decay ? decayed : undecayed;
    if (t.precision == StatePrecision::f32) {
      adamw32(path, {p, g, s.m + j, s.v + j, c16, n}, sc);
    } else {
      adamw8(path, {p, g, s.qm + j, s.absmax_m + j / block_, s.qv + j, s.absmax_v + j / block_, c16, n, block_}, sc);
    }
    if (c && t.copy_dtype == DType::f32) std::memcpy(reinterpret_cast<float*>(c) + b, p, size_t(n) * sizeof(float));
  }, kTasksPerGrab);
}

namespace {

// The state of n elements: two f32 moments, or two 8-bit codes plus two f32 absmax per block.
void add_state(StateReport& r, StatePrecision precision, int64_t n, int64_t block) {
  r.parameters += n;
  if (precision == StatePrecision::q8) {
    r.q8_parameters += n;
    r.state_bytes += 2 * size_t(n) + 2 * size_t(blocks_of(n, block)) * sizeof(float);
  } else {
    r.state_bytes += 2 * size_t(n) * sizeof(float);
  }
}

}  // namespace

StateReport AdamWSlab::report() const {
  StateReport r;
  for (const OptimTensor& t : tensors_) add_state(r, t.precision, t.owned(), block_);  // the owned elements
  return r;
}

void AdamWSlab::collect_state(NamedTensors& out) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const OptimTensor& t = tensors_[i];
    LT_CHECK(t.owned() == t.numel(), "optimizer state of '{}': this rank holds part of it (state_pieces)", t.name);
    const TensorState s = state(i);
    if (t.precision == StatePrecision::f32) {
      out[t.name + ".exp_avg"] = TensorView::contiguous(s.m, DType::f32, t.shape);
      out[t.name + ".exp_avg_sq"] = TensorView::contiguous(s.v, DType::f32, t.shape);
    } else {
      out[t.name + ".exp_avg.q8"] = TensorView::contiguous(s.qm, DType::u8, t.shape);
      out[t.name + ".exp_avg.absmax"] = TensorView::contiguous(s.absmax_m, DType::f32, {s.blocks});
      out[t.name + ".exp_avg_sq.q8"] = TensorView::contiguous(s.qv, DType::u8, t.shape);
      out[t.name + ".exp_avg_sq.absmax"] = TensorView::contiguous(s.absmax_v, DType::f32, {s.blocks});
    }
  }
}

std::vector<StatePiece> AdamWSlab::state_pieces() const {
  std::vector<StatePiece> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const OptimTensor& t = tensors_[i];
    const TensorState s = state(i);
    const size_t n = size_t(t.owned()), at = size_t(t.own_begin);
    auto piece = [&](std::string suffix, DType dt, Shape shape, void* data, size_t elems, size_t first) {
      out.push_back({t.name + suffix, dt, std::move(shape), static_cast<uint8_t*>(data), elems * dtype_size(dt),
                     first * dtype_size(dt)});
    };
    if (t.precision == StatePrecision::f32) {
      piece(".exp_avg", DType::f32, t.shape, s.m, n, at);
      piece(".exp_avg_sq", DType::f32, t.shape, s.v, n, at);
    } else {  // own_begin is a block multiple: the owned blocks are [own_begin / B, ...)
      const Shape blocks = {blocks_of(t.numel(), block_)};
      piece(".exp_avg.q8", DType::u8, t.shape, s.qm, n, at);
      piece(".exp_avg.absmax", DType::f32, blocks, s.absmax_m, size_t(s.blocks), at / size_t(block_));
      piece(".exp_avg_sq.q8", DType::u8, t.shape, s.qv, n, at);
      piece(".exp_avg_sq.absmax", DType::f32, blocks, s.absmax_v, size_t(s.blocks), at / size_t(block_));
    }
  }
  return out;
}

void AdamWSlab::restore_state(const SafetensorsFile& file) {
  for (const StatePiece& p : state_pieces()) {
    const std::string& name = p.name;
    if (!file.contains(name)) {
      const bool q8 = name.size() > 3 && (name.ends_with(".q8") || name.ends_with(".absmax"));
      LT_FAIL("optimizer state {} has no tensor '{}': the checkpoint was saved with {} states for this tensor "
              "or for another model; the current configuration keeps {} states",
              file.path(), name, q8 ? "f32 (or no)" : "8-bit (or no)", q8 ? "8-bit" : "f32");
    }
    const SafetensorsTensorInfo& info = file.info(name);
    LT_CHECK(info.dtype == p.dtype && info.shape == p.shape,
             "optimizer state {}: '{}' is {} {} in the file but {} {} here (different block size or model?)",
             file.path(), name, dtype_name(info.dtype), shape_str(info.shape), dtype_name(p.dtype),
             shape_str(p.shape));
    if (p.bytes) std::memcpy(p.data, static_cast<const uint8_t*>(file.view(name).data) + p.offset, p.bytes);
  }
}

// ---------------------------------------------------------------------------------------------------------
// HybridAdamW
// ---------------------------------------------------------------------------------------------------------

std::vector<OptimTensor> optim_tensors(const ModelConfig& model, SlabKind kind, int64_t layer, const AdamWConfig& cfg,
                                       DType copy_matrices) {
  const SlabLayout master = SlabLayout::trained(model, kind, layer);  // the trained tensors (model/finetune.h)
  const SlabLayout copy = kind == SlabKind::layer ? SlabLayout::make_layer(model, layer, copy_matrices)
                                                  : SlabLayout::make(model, kind, copy_matrices);
  const std::string prefix = hf_prefix(model);
  std::vector<OptimTensor> out;
  for (size_t i = 0; i < master.entries().size(); ++i) {
    const SlabEntry& e = master.entries()[i];
    const SlabEntry& c = copy.entry(e.name);
    OptimTensor t;
    t.name = SlabLayout::hf_name(kind, layer, e.name, prefix);
    t.shape = e.shape;
    t.param_offset = e.offset;
    t.copy_offset = c.offset;
    t.copy_dtype = c.dtype;
    t.precision = choose_state_precision(cfg, t.name, e.shape);
    t.decay = std::none_of(cfg.no_decay.begin(), cfg.no_decay.end(),
                           [&](const std::string& pattern) { return glob_match(pattern, t.name); });
    out.push_back(std::move(t));
  }
  return out;
}

StateReport model_state_report(const ModelConfig& model, const AdamWConfig& cfg) {
  StateReport r;
  auto slab = [&](SlabKind kind, int64_t layer) {
    for (const OptimTensor& t : optim_tensors(model, kind, layer, cfg)) add_state(r, t.precision, t.numel(), cfg.block_size);
  };
  slab(SlabKind::embedding, 0);
  for (int64_t l = 0; l < model.num_layers; ++l) slab(SlabKind::layer, l);
  slab(SlabKind::head, 0);
  return r;
}

double host_parameter_bytes_per_rank(const ModelConfig& model, const AdamWConfig& cfg, bool compute_copy, int ranks) {
  const double n = ranks, params = double(model.num_parameters());
  const double states = double(model_state_report(model, cfg).state_bytes) / n;
  if (!model.trains_all()) {  // frozen tensors: the streamed copy of every tensor, masters (whole on every rank) and
    // gradients (a rank touches its chunks' pages only) of the trained ones (dist/data_parallel.h)
    int64_t trained = 0;
    trained += SlabLayout::trained(model, SlabKind::embedding).num_parameters();
    for (int64_t l = 0; l < model.num_layers; ++l) trained += SlabLayout::trained(model, SlabKind::layer, l).num_parameters();
    trained += SlabLayout::trained(model, SlabKind::head).num_parameters();
    return params * (compute_copy ? 2 : 4) + double(trained) * (4 + 4 / n) + states;
  }
  if (!compute_copy) return params * (4 + 4 / n) + states;
  const double embed = double(model.vocab_size) * double(model.hidden_size);
  return params * (2 + 8 / n) + embed * 4 * (1 - 1 / n) + states;
}

HybridAdamW::HybridAdamW(ModelSlabs& params, const ModelSlabs& grads, AdamWConfig cfg, const OwnedRanges* owned,
                         DType copy_matrices)
    : params_(params), grads_(grads), cfg_(std::move(cfg)), copy_matrices_(copy_matrices) {
  LT_CHECK(params.config() == grads.config(), "optimizer: parameters and gradients are of different models");
  LT_CHECK(params.matrix_dtype() == DType::f32 && grads.matrix_dtype() == DType::f32,
           "optimizer: master weights and gradients must be f32 slabs");
  LT_CHECK(cfg_.max_consecutive_skips >= 1, "max_consecutive_skips must be at least 1, got {}",
           cfg_.max_consecutive_skips);
  const ModelConfig& m = params.config();
  LT_CHECK(!owned || int64_t(owned->size()) == params.num_layers() + 2, "optimizer: owned ranges for {} slabs, the model has {}",
           owned ? owned->size() : 0, params.num_layers() + 2);
  auto tensors = [&](SlabKind kind, int64_t layer, size_t slot) {
    std::vector<OptimTensor> ts = optim_tensors(m, kind, layer, cfg_, copy_matrices_);
    if (owned) {
      const auto& ranges = (*owned)[slot];
      LT_CHECK_EQ(ranges.size(), ts.size(), "optimizer: owned ranges per tensor of a slab");
      for (size_t i = 0; i < ts.size(); ++i) std::tie(ts[i].own_begin, ts[i].own_end) = ranges[i];
    }
    return ts;
  };
  embedding_ = AdamWSlab(tensors(SlabKind::embedding, 0, 0), cfg_);
  for (int64_t i = 0; i < params.num_layers(); ++i) layers_.emplace_back(tensors(SlabKind::layer, i, size_t(1 + i)), cfg_);
  head_ = AdamWSlab(tensors(SlabKind::head, 0, size_t(params.num_layers() + 1)), cfg_);
}

AdamWSlab& HybridAdamW::slab_state(SlabKind kind, int64_t layer) {
  switch (kind) {
    case SlabKind::embedding: return embedding_;
    case SlabKind::head: return head_;
    case SlabKind::layer:
      LT_CHECK(layer >= 0 && layer < int64_t(layers_.size()), "optimizer: layer {} out of range (model has {})",
               layer, layers_.size());
      return layers_[size_t(layer)];
  }
  LT_FAIL("unknown slab kind");
}

StepPlan HybridAdamW::plan_step(double grad_sum_of_squares) {
  StepPlan plan;
  plan.grad_norm = std::sqrt(grad_sum_of_squares);
  if (!std::isfinite(plan.grad_norm)) {
    ++consecutive_skips_;
    LT_CHECK(consecutive_skips_ < cfg_.max_consecutive_skips,
             "the gradient norm was not finite ({}) for {} steps in a row; parameters and optimizer state are "
             "those of step {}. Lower the learning rate, check the data, or resume from a checkpoint",
             plan.grad_norm, consecutive_skips_, step_);
    plan.skip = true;
    plan.step = step_;
    return plan;
  }
  consecutive_skips_ = 0;
  plan.step = ++step_;
  plan.clip = clip_coefficient(plan.grad_norm, cfg_.max_grad_norm);
  return plan;
}

void HybridAdamW::update(SlabKind kind, int64_t layer, const StepArgs& args, uint8_t* compute_copy) {
  slab_state(kind, layer).update(params_.slab(kind, layer), grads_.slab(kind, layer), args, compute_copy);
  if (after_update_) after_update_(kind, layer, compute_copy);
}

void HybridAdamW::update_embedding_rows(const StepArgs& args, uint8_t* compute_copy, const int32_t* ids, int64_t n,
                                        bool rest) {
  LT_CHECK(!after_update_, "optimizer: the embedding's update in parts is not for a data-parallel optimizer");
  embedding_.update_rows(params_.slab(SlabKind::embedding), grads_.slab(SlabKind::embedding), args, compute_copy, ids,
                         n, params_.config().hidden_size, rest);
}

void HybridAdamW::update_all(const StepArgs& args, ModelSlabs* compute_copy) {
  LT_CHECK(!compute_copy || compute_copy->matrix_dtype() == copy_matrices_,
           "optimizer: the compute copy written during the update must have {} matrices",
           dtype_name(copy_matrices_));
  auto copy_of = [&](SlabKind kind, int64_t layer) { return compute_copy ? compute_copy->slab(kind, layer) : nullptr; };
  update(SlabKind::embedding, 0, args, copy_of(SlabKind::embedding, 0));
  for (int64_t i = 0; i < int64_t(layers_.size()); ++i) update(SlabKind::layer, i, args, copy_of(SlabKind::layer, i));
  update(SlabKind::head, 0, args, copy_of(SlabKind::head, 0));
}

StepPlan HybridAdamW::step(const GradNormPartials& partials, double lr, ModelSlabs* compute_copy) {
  const StepPlan plan = plan_step(partials.sum_of_squares());
  if (!plan.skip) update_all(StepArgs{plan.step, lr, plan.clip}, compute_copy);
  return plan;
}

StateReport HybridAdamW::state_report() const {
  StateReport r = embedding_.report();
  for (const AdamWSlab& l : layers_) r += l.report();
  r += head_.report();
  return r;
}

std::vector<StatePiece> HybridAdamW::state_pieces() const {
  std::vector<StatePiece> out = embedding_.state_pieces();
  for (const AdamWSlab& l : layers_) {
    std::vector<StatePiece> p = l.state_pieces();
    out.insert(out.end(), std::make_move_iterator(p.begin()), std::make_move_iterator(p.end()));
  }
  std::vector<StatePiece> h = head_.state_pieces();
  out.insert(out.end(), std::make_move_iterator(h.begin()), std::make_move_iterator(h.end()));
  return out;
}

SafetensorsMetadata HybridAdamW::state_metadata() const {
  return {{"lazytrain", "optimizer_state"},      {"optimizer", "adamw"},
          {"step", std::to_string(step_)},       {"consecutive_skips", std::to_string(consecutive_skips_)},
          {"block_size", std::to_string(cfg_.block_size)}, {"beta1", fmt::format("{}", cfg_.beta1)},
          {"beta2", fmt::format("{}", cfg_.beta2)}, {"eps", fmt::format("{}", cfg_.eps)},
          {"weight_decay", fmt::format("{}", cfg_.weight_decay)}};
}

void HybridAdamW::save_state(const std::string& path) const {
  NamedTensors tensors;
  std::vector<AlignedBuffer<uint8_t>> storage;
  if (gather_) {
    tensors = gather_(state_pieces(), storage);
  } else {
    embedding_.collect_state(tensors);
    for (const AdamWSlab& l : layers_) l.collect_state(tensors);
    head_.collect_state(tensors);
  }
  write_safetensors(path, tensors, state_metadata());
}

void HybridAdamW::load_state(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const SafetensorsMetadata& meta = file.metadata();
  auto field = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    LT_CHECK(it != meta.end() && meta.count("lazytrain") && meta.at("lazytrain") == "optimizer_state",
             "{} is not a LazyTrain optimizer state file (metadata '{}' missing)", path, key);
    return it->second;
  };
  LT_CHECK(field("block_size") == std::to_string(cfg_.block_size),
           "optimizer state {} uses 8-bit blocks of {}, the configuration {}", path, field("block_size"),
           cfg_.block_size);
  // A counter as save_state wrote it: decimal digits, nothing else (a damaged file must not end in std::stoll's
  // exception).
  auto counter = [&](const char* key) {
    const std::string& text = field(key);
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    LT_CHECK(ec == std::errc() && end == text.data() + text.size() && v >= 0 && v <= std::numeric_limits<int32_t>::max(),
             "{}: metadata '{}' is '{}', expected a count (a non-negative integer)", path, key, text);
    return v;
  };
  const int64_t step = counter("step");
  const int skips = int(counter("consecutive_skips"));
  embedding_.restore_state(file);
  for (AdamWSlab& l : layers_) l.restore_state(file);
  head_.restore_state(file);
  step_ = step;
  consecutive_skips_ = skips;
}

}  // namespace lt
