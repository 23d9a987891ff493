#include "model/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "io/json_file.h"
#include "io/mxfp4.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/finetune.h"

namespace lt {


namespace {

// dst = src (same shape) in dst's dtype: bytes as they are, or through f32 (`wide`: scratch) — exact for f32 or a
// widening, one rounding otherwise.
void copy_converted(const TensorView& dst, const TensorView& src, std::vector<float>& wide) {
  const size_t n = size_t(src.numel());
  if (src.dtype == dst.dtype) {
    std::memcpy(dst.data, src.data, dst.bytes());
  } else if (src.dtype == DType::f32) {
    convert_from_f32(dst.data, dst.dtype, static_cast<const float*>(src.data), n);
  } else {
    wide.resize(n);
    convert_to_f32(wide.data(), src.data, src.dtype, n);
    convert_from_f32(dst.data, dst.dtype, wide.data(), n);
  }
}

}  // namespace

namespace {

SlabLayout slab_layout(const ModelConfig& cfg, SlabKind kind, int64_t layer, DType matrix_dtype, SlabSet set) {
  if (set == SlabSet::trained) {
    LT_CHECK(matrix_dtype == DType::f32, "the trained tensors' slabs are f32, not {}", dtype_name(matrix_dtype));
    return SlabLayout::trained(cfg, kind, layer);
  }
  return kind == SlabKind::layer ? SlabLayout::make_layer(cfg, layer, matrix_dtype) : SlabLayout::make(cfg, kind, matrix_dtype);
}

}  // namespace

ModelSlabs::ModelSlabs(const ModelConfig& cfg, DType matrix_dtype, Fill fill, SlabSet set)
    : cfg_(cfg),
      matrix_dtype_(matrix_dtype),
      set_(set),
      embed_layout_(slab_layout(cfg, SlabKind::embedding, 0, matrix_dtype, set)),
      head_layout_(slab_layout(cfg, SlabKind::head, 0, matrix_dtype, set)),
      embed_(embed_layout_.bytes(), kPageAlign, fill),
      head_(head_layout_.bytes(), kPageAlign, fill) {
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    SlabLayout& layout = const_cast<SlabLayout&>(layer_layout(l));
    if (layout.bytes() == 0 && layout.entries().empty()) layout = slab_layout(cfg, SlabKind::layer, l, matrix_dtype, set);
  }
  layers_.reserve(size_t(cfg.num_layers));
  for (int64_t i = 0; i < cfg.num_layers; ++i) layers_.emplace_back(layout(SlabKind::layer, i).bytes(), kPageAlign, fill);
}

const SlabLayout& ModelSlabs::layer_layout(int64_t layer) const {
  const bool trains = set_ == SlabSet::all || !cfg_.finetune || cfg_.finetune->trains_layer(layer);
  return layer_layouts_[size_t(cfg_.layer_kind(layer))][cfg_.sparse_layer(layer)][trains];
}

const SlabLayout& ModelSlabs::layout(SlabKind kind, int64_t layer) const {
  switch (kind) {
    case SlabKind::embedding: return embed_layout_;
    case SlabKind::layer: return layer_layout(layer);
    case SlabKind::head: return head_layout_;
  }
  LT_FAIL("unknown slab kind");
}

uint8_t* ModelSlabs::slab(SlabKind kind, int64_t layer) {
  return const_cast<uint8_t*>(static_cast<const ModelSlabs*>(this)->slab(kind, layer));
}

const uint8_t* ModelSlabs::slab(SlabKind kind, int64_t layer) const {
  switch (kind) {
    case SlabKind::embedding: return embed_.data();
    case SlabKind::head: return head_.data();
    case SlabKind::layer:
      LT_CHECK(layer >= 0 && layer < num_layers(), "layer {} out of range (model has {})", layer, num_layers());
      return layers_[size_t(layer)].data();
  }
  LT_FAIL("unknown slab kind");
}

TensorView ModelSlabs::tensor(SlabKind kind, int64_t layer, const std::string& name) const {
  const SlabEntry& e = layout(kind, layer).entry(name);
  return TensorView::contiguous(const_cast<uint8_t*>(slab(kind, layer)) + e.offset, e.dtype, e.shape);
}

TensorView ModelSlabs::lm_head() const {
  const SlabKind kind = cfg_.tie_word_embeddings ? SlabKind::embedding : SlabKind::head;
  const std::string name = cfg_.tie_word_embeddings ? "embed_tokens.weight" : "lm_head.weight";
  if (!has(kind, 0, name)) return TensorView{};
  return tensor(kind, 0, name);
}

std::vector<ModelSlabs::Named> ModelSlabs::named_tensors() const {
  std::vector<Named> out;
  const std::string prefix = hf_prefix(cfg_);
  auto add_slab = [&](SlabKind kind, int64_t layer) {
    for (const SlabEntry& e : layout(kind, layer).entries())
      out.push_back({SlabLayout::hf_name(kind, layer, e.name, prefix), tensor(kind, layer, e.name)});
  };
  add_slab(SlabKind::embedding, 0);
  for (int64_t i = 0; i < num_layers(); ++i) add_slab(SlabKind::layer, i);
  add_slab(SlabKind::head, 0);
  return out;
}

void ModelSlabs::zero() {
  std::memset(embed_.data(), 0, embed_.bytes());
  std::memset(head_.data(), 0, head_.bytes());
  for (auto& l : layers_) std::memset(l.data(), 0, l.bytes());
}

size_t ModelSlabs::total_bytes() const {
  size_t n = embed_.bytes() + head_.bytes();
  for (const auto& l : layers_) n += l.bytes();
  return n;
}

bool is_untrained_tensor(const ModelConfig& cfg, const std::string& hf_name) {
  return cfg.type == ModelType::qwen3_5 && (hf_name.starts_with("model.visual.") || hf_name.starts_with("mtp."));
}

ElementRange range_of(const TensorRanges* only, const std::string& name) {
  if (!only) return {};
  const auto it = only->find(name);
  return it == only->end() ? ElementRange{} : it->second;
}

std::pair<std::string, std::string> fused_expert_names(const ModelConfig& cfg, int64_t layer) {
  const std::string p = fmt::format("{}layers.{}.mlp.experts.", hf_prefix(cfg), layer);
  return {p + "gate_up_proj", p + "down_proj"};
}

namespace {

// The first sparse layer's experts decide the checkpoint's layout: fused when its gate_up_proj is there.
bool checkpoint_has_fused_experts(const ModelConfig& cfg, const SafetensorsModel& files) {
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    if (cfg.sparse_layer(l)) return files.contains(fused_expert_names(cfg, l).first);
  return false;
}

// Reads a fused checkpoint's experts into the per-expert slab entries: expert e's gate rows, up rows and down
// matrix are each one contiguous run of the fused tensors. `expected` gets the fused names.
void read_fused_experts(ModelSlabs& params, const SafetensorsModel& files, const TensorRanges* only,
                        std::set<std::string>& expected, std::vector<std::string>& missing) {
  const ModelConfig& cfg = params.config();
  const int64_t E = cfg.num_experts, Ie = cfg.moe_intermediate_size, C = cfg.hidden_size;
  const std::string prefix = hf_prefix(cfg);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.sparse_layer(l)) continue;
    const auto [gate_up, down] = fused_expert_names(cfg, l);
    const std::pair<const std::string*, Shape> fused[] = {{&gate_up, {E, 2 * Ie, C}}, {&down, {E, C, Ie}}};
    for (const auto& [name, shape] : fused) {
      expected.insert(*name);
      if (!files.contains(*name)) {
        missing.push_back(*name);
        continue;
      }
      const TensorView v = files.view(*name);
      LT_CHECK(v.shape == shape, "{}: tensor '{}' has shape {}, expected {}", files.file_of(*name).path(), *name,
               shape_str(v.shape), shape_str(shape));
      const size_t es = dtype_size(v.dtype);
      const int64_t part = Ie * C;  // elements of one expert's gate, up or down
      for (int64_t e = 0; e < E; ++e) {
        const char* parts[2] = {"gate_proj", "up_proj"};
        for (int i = 0; i < (name == &gate_up ? 2 : 1); ++i) {
          const std::string entry = fmt::format("mlp.experts.{}.{}.weight", e, name == &gate_up ? parts[i] : "down_proj");
          const TensorView dst = params.tensor(SlabKind::layer, l, entry);
          const int64_t first = name == &gate_up ? (2 * e + i) * part : e * part;
          const TensorView src =
              TensorView::contiguous(static_cast<uint8_t*>(const_cast<void*>(v.data)) + size_t(first) * es, v.dtype,
                                     dst.shape);
          copy_tensor_to_f32(dst.ptr<float>(), src, dst.shape, *name, files.file_of(*name).path(),
                             range_of(only, SlabLayout::hf_name(SlabKind::layer, l, entry, prefix)));
        }
      }
    }
  }
}

// A checkpoint tensor that must be there with this shape and dtype (nullptr, named in `missing`, when absent).
const TensorView* expect_tensor(const SafetensorsModel& files, const std::string& name, const Shape& shape,
                                std::optional<DType> dtype, std::set<std::string>& expected,
                                std::vector<std::string>& missing, TensorView& view) {
  expected.insert(name);
  if (!files.contains(name)) {
    missing.push_back(name);
    return nullptr;
  }
  view = files.view(name);
  LT_CHECK(view.shape == shape, "{}: tensor '{}' has shape {}, expected {}", files.file_of(name).path(), name,
           shape_str(view.shape), shape_str(shape));
  LT_CHECK(!dtype || view.dtype == *dtype, "{}: tensor '{}' is {}, expected {}", files.file_of(name).path(), name,
           dtype_name(view.dtype), dtype_name(*dtype));
  return &view;
}

// gpt_oss's experts (GptOssExperts): fused and input-major — gate_up_proj [E, C, 2·Ie] with gate the even columns and
// up the odd ones, gate_up_proj_bias [E, 2·Ie], down_proj [E, Ie, C], down_proj_bias [E, C] — or, in released
// checkpoints, MXFP4 (io/mxfp4.h): *_blocks / *_scales whose rows are output features ([E, 2·Ie, ...] and
// [E, C, ...]). Expert by expert into an f32 scratch, then onto the per-expert [out, in] slab entries — only the
// elements `only` gives each entry (a data-parallel rank's masters: the rest of the entry's pages untouched).
void read_gpt_oss_experts(ModelSlabs& params, const SafetensorsModel& files, const TensorRanges* only,
                          std::set<std::string>& expected, std::vector<std::string>& missing) {
  const ModelConfig& cfg = params.config();
  const int64_t E = cfg.num_experts, Ie = cfg.moe_intermediate_size, C = cfg.hidden_size;
  const std::string prefix = hf_prefix(cfg);
  std::vector<float> tmp(size_t(2 * Ie * C));
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.mlp.experts.", prefix, l);
    // Entry `name` of expert e gets element i = at(i) for the i its range holds.
    auto put = [&](int64_t e, const char* name, auto&& at) {
      const std::string entry = fmt::format("mlp.experts.{}.{}", e, name);
      const TensorView dst = params.tensor(SlabKind::layer, l, entry);
      const ElementRange r = range_of(only, SlabLayout::hf_name(SlabKind::layer, l, entry, prefix));
      float* d = dst.ptr<float>();
      for (int64_t i = r.begin, end = r.end < 0 ? dst.numel() : r.end; i < end; ++i) d[i] = at(i);
    };
    TensorView v;
    if (expect_tensor(files, p + "gate_up_proj_bias", {E, 2 * Ie}, std::nullopt, expected, missing, v)) {
      std::vector<float> b(size_t(E * 2 * Ie));
      files.read_f32(p + "gate_up_proj_bias", b.data(), v.shape);
      for (int64_t e = 0; e < E; ++e) {
        put(e, "gate_proj.bias", [&](int64_t i) { return b[size_t(e * 2 * Ie + 2 * i)]; });
        put(e, "up_proj.bias", [&](int64_t i) { return b[size_t(e * 2 * Ie + 2 * i + 1)]; });
      }
    }
    if (expect_tensor(files, p + "down_proj_bias", {E, C}, std::nullopt, expected, missing, v)) {
      std::vector<float> b(size_t(E * C));
      files.read_f32(p + "down_proj_bias", b.data(), v.shape);
      for (int64_t e = 0; e < E; ++e) put(e, "down_proj.bias", [&](int64_t i) { return b[size_t(e * C + i)]; });
    }
    if (cfg.mxfp4_experts) {
      TensorView blocks, scales;
      for (const auto& [name, rows, cols] : {std::tuple{std::string("gate_up_proj"), 2 * Ie, C},
                                             std::tuple{std::string("down_proj"), C, Ie}}) {
        LT_CHECK(cols % 32 == 0, "gpt_oss MXFP4: {} inputs is not a multiple of 32", cols);
        if (!expect_tensor(files, p + name + "_blocks", {E, rows, cols / 32, 16}, DType::u8, expected, missing,
                           blocks) ||
            !expect_tensor(files, p + name + "_scales", {E, rows, cols / 32}, DType::u8, expected, missing, scales))
          continue;
        for (int64_t e = 0; e < E; ++e) {
          const auto* q = static_cast<const uint8_t*>(blocks.data) + e * rows * cols / 2;
          const auto* sc = static_cast<const uint8_t*>(scales.data) + e * rows * cols / 32;
          mxfp4_dequantize(tmp.data(), q, sc, rows, cols, p + name + "_blocks");
          if (name == "down_proj") {  // rows are down's output features: [C, Ie] as it is
            put(e, "down_proj.weight", [&](int64_t i) { return tmp[size_t(i)]; });
            continue;
          }
          // gate_up's rows interleave gate and up: entry element i·C + c is row 2i (gate) or 2i + 1 (up)
          put(e, "gate_proj.weight", [&](int64_t i) { return tmp[size_t((2 * (i / C)) * C + i % C)]; });
          put(e, "up_proj.weight", [&](int64_t i) { return tmp[size_t((2 * (i / C) + 1) * C + i % C)]; });
        }
      }
      continue;
    }
    for (const auto& [name, shape] : {std::pair{std::string("gate_up_proj"), Shape{E, C, 2 * Ie}},
                                      std::pair{std::string("down_proj"), Shape{E, Ie, C}}}) {
      if (!expect_tensor(files, p + name, shape, std::nullopt, expected, missing, v)) continue;
      const Shape one{shape[1], shape[2]};  // one expert's [in, out]: input-major
      const size_t es = dtype_size(v.dtype);
      for (int64_t e = 0; e < E; ++e) {
        const TensorView src = TensorView::contiguous(
            static_cast<uint8_t*>(const_cast<void*>(v.data)) + size_t(e * shape[1] * shape[2]) * es, v.dtype, one);
        copy_tensor_to_f32(tmp.data(), src, one, p + name, files.file_of(p + name).path());
        if (name == "down_proj") {  // [Ie, C] → down [C, Ie]: element c·Ie + i is tmp[i·C + c]
          put(e, "down_proj.weight", [&](int64_t j) { return tmp[size_t((j % Ie) * C + j / Ie)]; });
          continue;
        }
        // [C, 2·Ie] → gate, up [Ie, C]: element i·C + c is tmp[c·2Ie + 2i] (gate) or + 1 (up)
        put(e, "gate_proj.weight", [&](int64_t j) { return tmp[size_t((j % C) * 2 * Ie + 2 * (j / C))]; });
        put(e, "up_proj.weight", [&](int64_t j) { return tmp[size_t((j % C) * 2 * Ie + 2 * (j / C) + 1)]; });
      }
    }
  }
}

bool is_expert_entry(const std::string& hf_name) { return hf_name.find(".mlp.experts.") != std::string::npos; }

}  // namespace

void load_hf_model_by_slab(const std::string& dir, const SlabTaker& take, SavedExtras* extras) {
  const ModelConfig cfg = load_model_config(dir);
  const ModelSlabs names(cfg, DType::f32, Fill::none);  // the tensors' names and shapes; its pages never touched
  // One pass per slab (the embedding with the head first): `only` gives every other tensor an empty range.
  auto pass = [&](const std::vector<std::pair<SlabKind, int64_t>>& slabs) {
    TensorRanges only;
    const std::string prefix = hf_prefix(cfg);
    auto skip = [&](SlabKind kind, int64_t layer) {
      for (const SlabEntry& e : names.layout(kind, layer).entries())
        only[SlabLayout::hf_name(kind, layer, e.name, prefix)] = ElementRange{0, 0};
    };
    auto wanted = [&](SlabKind kind, int64_t layer) {
      return std::find(slabs.begin(), slabs.end(), std::pair{kind, layer}) != slabs.end();
    };
    if (!wanted(SlabKind::embedding, 0)) skip(SlabKind::embedding, 0);
    if (!wanted(SlabKind::head, 0)) skip(SlabKind::head, 0);
    for (int64_t l = 0; l < cfg.num_layers; ++l)
      if (!wanted(SlabKind::layer, l)) skip(SlabKind::layer, l);
    LoadedModel m = load_hf_model(dir, &only);
    for (const auto& [kind, layer] : slabs) take(m.params, kind, layer);
    return m.extras;
  };
  SavedExtras first = pass({{SlabKind::embedding, 0}, {SlabKind::head, 0}});
  if (first.fused_experts) {  // fused experts are decoded per layer for every pass: read them in one pass instead
    std::vector<std::pair<SlabKind, int64_t>> layers;
    for (int64_t l = 0; l < cfg.num_layers; ++l) layers.emplace_back(SlabKind::layer, l);
    pass(layers);
  } else {
    for (int64_t l = 0; l < cfg.num_layers; ++l) pass({{SlabKind::layer, l}});
  }
  if (extras) *extras = std::move(first);
}

size_t copy_slab_by_name(ModelSlabs& dst, const ModelSlabs& src, SlabKind kind, int64_t layer) {
  const std::string prefix = hf_prefix(src.config());
  std::map<std::string, TensorView> to;
  for (const SlabEntry& e : dst.layout(kind, layer).entries())
    to.emplace(e.name, dst.tensor(kind, layer, e.name));
  size_t copied = 0;
  std::vector<float> wide;
  for (const SlabEntry& e : src.layout(kind, layer).entries()) {
    const auto it = to.find(e.name);
    if (it == to.end()) continue;
    const TensorView v = src.tensor(kind, layer, e.name), &t = it->second;
    LT_CHECK(v.shape == t.shape, "{}: {} in one model, {} in the other", SlabLayout::hf_name(kind, layer, e.name, prefix),
             shape_str(v.shape), shape_str(t.shape));
    copy_converted(t, v, wide);
    ++copied;
  }
  return copied;
}

LoadedModel load_hf_model(const std::string& dir, const TensorRanges* only) {
  LoadedModel m{load_model_config(dir), {}, {}};
  // The files first: a directory without weights (or with a bad header) fails before the slabs, which for a
  // 27B config would be 108 GB, are allocated.
  SafetensorsModel files = SafetensorsModel::open_dir(dir);
  m.params = ModelSlabs(m.config, DType::f32, only ? Fill::none : Fill::zero);
  const bool half_checkpoint = m.config.torch_dtype == DType::bf16 || m.config.torch_dtype == DType::f16;

  std::set<std::string> expected;
  std::vector<std::string> missing;
  m.extras.fused_experts = m.config.gpt_oss() || checkpoint_has_fused_experts(m.config, files);
  if (m.config.gpt_oss()) read_gpt_oss_experts(m.params, files, only, expected, missing);
  else if (m.extras.fused_experts) read_fused_experts(m.params, files, only, expected, missing);
  for (const auto& t : m.params.named_tensors()) {
    if (m.extras.fused_experts && is_expert_entry(t.hf_name)) continue;
    expected.insert(t.hf_name);
    if (!files.contains(t.hf_name)) {
      missing.push_back(t.hf_name);
      continue;
    }
    files.read_f32(t.hf_name, t.view.ptr<float>(), t.view.shape, range_of(only, t.hf_name));
    if (half_checkpoint && files.info(t.hf_name).dtype == DType::f32) m.extras.keep_f32.insert(t.hf_name);
  }
  LT_CHECK(missing.empty(), "{}: missing tensor{} {} (model_type {}, {} layers)", dir, missing.size() > 1 ? "s" : "",
           fmt::join(missing, ", "), model_type_name(m.config.type), m.config.num_layers);

  std::vector<std::string> unexpected;
  for (const auto& name : files.names()) {  // sorted, so extras.carried is too
    if (expected.count(name)) continue;
    if (is_untrained_tensor(m.config, name)) {
      const TensorView v = files.view(name);
      const auto* p = static_cast<const uint8_t*>(v.data);
      m.extras.carried.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(p, p + v.bytes())});
      continue;
    }
    // Some tied checkpoints still carry lm_head.weight; accept it only if it is the embedding.
    // (Compared when this load reads the embedding whole: not on a pass of load_hf_model_by_slab that skips it.)
    if (name == "lm_head.weight" && m.config.tie_word_embeddings) {
      const ElementRange r = range_of(only, hf_prefix(m.config) + "embed_tokens.weight");
      if (r.begin != 0 || r.end >= 0) continue;
      TensorView emb = m.params.lm_head();
      std::vector<float> head(size_t(emb.numel()));
      files.read_f32(name, head.data(), emb.shape);
      LT_CHECK(std::memcmp(head.data(), emb.data, emb.bytes()) == 0,
               "{}: lm_head.weight differs from model.embed_tokens.weight but config.json says "
               "tie_word_embeddings: true",
               dir);
      continue;
    }
    unexpected.push_back(name);
  }
  LT_CHECK(unexpected.empty(), "{}: unexpected tensor{} {} (not part of a {} model with this config.json)", dir,
           unexpected.size() > 1 ? "s" : "", fmt::join(unexpected, ", "), model_type_name(m.config.type));
  return m;
}

namespace {

enum class InitRule { normal, zero, one, log_uniform_a };

// How init_random fills a tensor. The other model types: norm weights 1, biases 0, the rest N(0, std).
InitRule init_rule(const ModelConfig& cfg, const std::string& hf_name) {
  const bool is_norm = hf_name.find("norm") != std::string::npos;
  if (hf_name.ends_with("linear_attn.A_log")) return InitRule::log_uniform_a;
  if (hf_name.ends_with("linear_attn.dt_bias")) return InitRule::one;
  if (hf_name.ends_with("linear_attn.norm.weight")) return InitRule::one;  // the gated norm is plain: x·rstd·w
  if (is_norm) return cfg.zero_centred_norms ? InitRule::zero : InitRule::one;  // zero-centred: x·rstd·(1 + w)
  if (hf_name.ends_with(".bias")) return InitRule::zero;
  return InitRule::normal;
}

// One value of `rule` from rng: normal takes two draws (Box-Muller), log-uniform one, zero and one none.
float init_value(InitRule rule, Rng& rng, float std) {
  switch (rule) {
    case InitRule::normal: return float(rng.normal() * std);
    case InitRule::zero: return 0.f;
    case InitRule::one: return 1.f;
    // transformers draws A in [0.01, 16): the lower bound keeps log(A) finite.
    case InitRule::log_uniform_a: return std::log(rng.uniform(0.01f, 16.f));
  }
  LT_FAIL("init: unknown rule");
}
uint64_t init_draws(InitRule rule) {
  return rule == InitRule::normal ? 2 : rule == InitRule::log_uniform_a ? 1 : 0;
}

}  // namespace

void init_random_reference(ModelSlabs& params, uint64_t seed, float std) {
  Rng rng(seed);
  for (auto& t : params.named_tensors()) {
    float* p = t.view.ptr<float>();
    const InitRule rule = init_rule(params.config(), t.hf_name);
    for (int64_t i = 0; i < t.view.numel(); ++i) p[i] = init_value(rule, rng, std);
  }
}

void init_random(ModelSlabs& params, uint64_t seed, float std) {
  // The reference's sequence cut into chunks of kChunk values, each drawn on its own thread by a generator
  // moved to the chunk's first draw (Rng::discard): a 7B model in seconds instead of minutes, the same bits.
  constexpr int64_t kChunk = int64_t(1) << 16;
  struct Chunk {
    float* p;
    int64_t n;
    InitRule rule;
    uint64_t first_draw;
  };
  std::vector<Chunk> chunks;
  uint64_t draws = 0;
  for (auto& t : params.named_tensors()) {
    float* p = t.view.ptr<float>();
    const int64_t n = t.view.numel();
    const InitRule rule = init_rule(params.config(), t.hf_name);
    for (int64_t i0 = 0; i0 < n; i0 += kChunk)
      chunks.push_back({p + i0, std::min(kChunk, n - i0), rule, draws + uint64_t(i0) * init_draws(rule)});
    draws += uint64_t(n) * init_draws(rule);
  }
  const Rng start(seed);
  parallel_for(int64_t(chunks.size()), [&](int64_t c) {
    const Chunk& ch = chunks[size_t(c)];
    Rng rng = start;
    rng.discard(ch.first_draw);
    for (int64_t i = 0; i < ch.n; ++i) ch.p[i] = init_value(ch.rule, rng, std);
  });
}

void make_compute_copy(ModelSlabs& dst, const ModelSlabs& master) {
  auto src = master.named_tensors();
  auto out = dst.named_tensors();
  if (master.set() == SlabSet::trained && dst.set() == SlabSet::all) {  // the trained tensors' entries only
    std::map<std::string, TensorView> to;
    for (const auto& t : out) to.emplace(t.hf_name, t.view);
    for (const auto& t : src) {
      const TensorView& v = to.at(t.hf_name);
      convert_from_f32(v.data, v.dtype, t.view.ptr<float>(), size_t(t.view.numel()));
    }
    return;
  }
  LT_CHECK_EQ(src.size(), out.size(), "compute copy must have the master's tensors");
  for (size_t i = 0; i < src.size(); ++i)
    convert_from_f32(out[i].view.data, out[i].view.dtype, src[i].view.ptr<float>(), size_t(src[i].view.numel()));
}

size_t copy_tensors_by_name(ModelSlabs& dst, const ModelSlabs& src) {
  std::map<std::string, TensorView> from;
  for (const auto& t : src.named_tensors()) from.emplace(t.hf_name, t.view);
  size_t copied = 0;
  std::vector<float> wide;
  for (const auto& t : dst.named_tensors()) {
    const auto it = from.find(t.hf_name);
    if (it == from.end()) continue;
    const TensorView& v = it->second;
    LT_CHECK(v.shape == t.view.shape, "{}: {} in one model, {} in the other", t.hf_name, shape_str(v.shape),
             shape_str(t.view.shape));
    copy_converted(t.view, v, wide);
    ++copied;
  }
  return copied;
}

ModelSlabs merged_f32(const ModelSlabs& trained, const ModelSlabs& weights) {
  ModelSlabs out(weights.config(), DType::f32, Fill::none);
  copy_tensors_by_name(out, weights);
  copy_tensors_by_name(out, trained);  // the trained ones' f32 values over their streamed copies
  return out;
}

ModelSlabs trained_tensors(const ModelConfig& cfg, const ModelSlabs& all) {
  LT_CHECK(all.set() == SlabSet::all && all.matrix_dtype() == DType::f32, "trained_tensors: from f32 slabs of every tensor");
  ModelSlabs out(cfg, DType::f32, Fill::zero, SlabSet::trained);
  copy_tensors_by_name(out, all);
  return out;
}

namespace {

// Converts slabs to `dtype` buffers owned by `storage`, keyed by HF name; `keep_f32` ones to f32 instead. `frozen`
// (a trained set in `slabs`): the streamed weights, every tensor `slabs` does not hold is exported from there, from
// its dtype (a bf16 tensor saved bf16 keeps its bytes).
NamedTensors export_tensors(const ModelSlabs& slabs, DType dtype, std::vector<std::vector<uint8_t>>& storage,
                            const std::set<std::string>& keep_f32 = {}, const ModelSlabs* frozen = nullptr) {
  LT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
           "model files are written as f32, bf16 or f16, not {}", dtype_name(dtype));
  NamedTensors out;
  std::vector<ModelSlabs::Named> all = slabs.named_tensors();
  if (frozen) {  // every tensor, in the streamed weights' order: the trained ones from `slabs`
    std::map<std::string, TensorView> trained;
    for (const auto& t : all) trained.emplace(t.hf_name, t.view);
    all = frozen->named_tensors();
    for (auto& t : all)
      if (const auto it = trained.find(t.hf_name); it != trained.end()) t.view = it->second;
  }
  std::vector<float> wide;
  for (const auto& t : all) {
    const DType d = keep_f32.count(t.hf_name) ? DType::f32 : dtype;
    storage.emplace_back(size_t(t.view.numel()) * dtype_size(d));
    out[t.hf_name] = TensorView::contiguous(storage.back().data(), d, t.view.shape);
    copy_converted(out[t.hf_name], t.view, wide);
  }
  for (const auto& name : keep_f32)
    LT_CHECK(out.count(name), "{} is to be kept F32 but is not a tensor of this {} model", name,
             model_type_name(slabs.config().type));
  return out;
}

// gpt_oss: each layer's per-expert tensors (already in the saved dtype) back into GptOssExperts' four, input-major
// with gate and up interleaved (read_gpt_oss_experts' inverse); MXFP4 checkpoints are written dequantised.
void fuse_gpt_oss_experts(const ModelConfig& cfg, NamedTensors& tensors, std::vector<std::vector<uint8_t>>& storage) {
  const int64_t E = cfg.num_experts, Ie = cfg.moe_intermediate_size, C = cfg.hidden_size;
  const std::string prefix = hf_prefix(cfg);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    auto take = [&](int64_t e, const char* name) {
      const std::string n = SlabLayout::hf_name(SlabKind::layer, l, fmt::format("mlp.experts.{}.{}", e, name), prefix);
      const TensorView v = tensors.at(n);
      tensors.erase(n);
      return v;
    };
    const DType dt = tensors.at(SlabLayout::hf_name(SlabKind::layer, l, "mlp.experts.0.gate_proj.weight", prefix)).dtype;
    const size_t es = dtype_size(dt);
    std::vector<uint8_t> gate_up(size_t(E * C * 2 * Ie) * es), gub(size_t(E * 2 * Ie) * es), down(size_t(E * Ie * C) * es),
        db(size_t(E * C) * es);
    auto put = [&](std::vector<uint8_t>& dst, int64_t at, const TensorView& src, int64_t from) {
      std::memcpy(dst.data() + size_t(at) * es, static_cast<const uint8_t*>(src.data) + size_t(from) * es, es);
    };
    for (int64_t e = 0; e < E; ++e) {
      const TensorView g = take(e, "gate_proj.weight"), u = take(e, "up_proj.weight"), d = take(e, "down_proj.weight");
      const TensorView gb = take(e, "gate_proj.bias"), ub = take(e, "up_proj.bias"), dbe = take(e, "down_proj.bias");
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < Ie; ++i) {
          put(gate_up, (e * C + c) * 2 * Ie + 2 * i, g, i * C + c);
          put(gate_up, (e * C + c) * 2 * Ie + 2 * i + 1, u, i * C + c);
          put(down, (e * Ie + i) * C + c, d, c * Ie + i);
        }
      for (int64_t i = 0; i < Ie; ++i) {
        put(gub, e * 2 * Ie + 2 * i, gb, i);
        put(gub, e * 2 * Ie + 2 * i + 1, ub, i);
      }
      for (int64_t c = 0; c < C; ++c) put(db, e * C + c, dbe, c);
    }
    const std::string p = fmt::format("{}layers.{}.mlp.experts.", prefix, l);
    for (auto& [name, bytes, shape] : {std::tuple{p + "gate_up_proj", &gate_up, Shape{E, C, 2 * Ie}},
                                       std::tuple{p + "gate_up_proj_bias", &gub, Shape{E, 2 * Ie}},
                                       std::tuple{p + "down_proj", &down, Shape{E, Ie, C}},
                                       std::tuple{p + "down_proj_bias", &db, Shape{E, C}}}) {
      storage.push_back(std::move(*bytes));
      tensors[name] = TensorView::contiguous(storage.back().data(), dt, shape);
    }
  }
}

// Replaces each sparse layer's per-expert tensors in `tensors` by the fused pair (SavedExtras::fused_experts),
// its bytes in `storage`.
void fuse_experts(const ModelConfig& cfg, NamedTensors& tensors, std::vector<std::vector<uint8_t>>& storage) {
  if (cfg.gpt_oss()) return fuse_gpt_oss_experts(cfg, tensors, storage);
  const int64_t E = cfg.num_experts, Ie = cfg.moe_intermediate_size, C = cfg.hidden_size;
  const std::string prefix = hf_prefix(cfg);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.sparse_layer(l)) continue;
    const auto [gate_up, down] = fused_expert_names(cfg, l);
    const std::pair<std::string, std::vector<const char*>> fused[] = {{gate_up, {"gate_proj", "up_proj"}},
                                                                      {down, {"down_proj"}}};
    for (const auto& [name, parts] : fused) {
      std::vector<uint8_t> bytes;
      DType dtype = DType::f32;
      for (int64_t e = 0; e < E; ++e)
        for (const char* part : parts) {
          const std::string n = SlabLayout::hf_name(SlabKind::layer, l, fmt::format("mlp.experts.{}.{}.weight", e, part), prefix);
          const TensorView v = tensors.at(n);
          dtype = v.dtype;
          const auto* p = static_cast<const uint8_t*>(v.data);
          bytes.insert(bytes.end(), p, p + v.bytes());
          tensors.erase(n);
        }
      storage.push_back(std::move(bytes));
      const Shape shape = parts.size() == 2 ? Shape{E, 2 * Ie, C} : Shape{E, C, Ie};
      tensors[name] = TensorView::contiguous(storage.back().data(), dtype, shape);
    }
  }
}

}  // namespace

void save_safetensors(const ModelSlabs& slabs, const std::string& path, DType dtype) {
  std::vector<std::vector<uint8_t>> storage;
  write_safetensors(path, export_tensors(slabs, dtype, storage));
}

void save_hf_model(const ModelSlabs& params, const std::string& dir, DType dtype, size_t max_shard_bytes,
                   const SavedExtras& extras, const ModelSlabs* frozen) {
  LT_CHECK(params.set() == SlabSet::all || frozen, "saving a model of its trained tensors alone needs the frozen ones");
  make_directories(dir, "saving the model");
  std::vector<std::vector<uint8_t>> storage;
  NamedTensors tensors = export_tensors(params, dtype, storage, extras.keep_f32, frozen);
  for (const RawTensor& r : extras.carried) {
    LT_CHECK(!tensors.count(r.name), "carried tensor {} has the name of a trained tensor", r.name);
    LT_CHECK_EQ(r.bytes.size(), size_t(shape_numel(r.shape)) * dtype_size(r.dtype),
                "carried tensor {}: its bytes do not match its dtype and shape", r.name);
    tensors[r.name] = TensorView::contiguous(const_cast<uint8_t*>(r.bytes.data()), r.dtype, r.shape);
  }
  // GPT-OSS's experts exist only fused on the Hub (GptOssExperts): always written so.
  if (extras.fused_experts || params.config().gpt_oss()) fuse_experts(params.config(), tensors, storage);
  write_safetensors_model(dir, tensors, max_shard_bytes);
  ModelConfig cfg = params.config();
  cfg.torch_dtype = dtype;
  write_file_atomic(dir + "/config.json", model_config_to_json(cfg).dump(2) + "\n");
}

}  // namespace lt
