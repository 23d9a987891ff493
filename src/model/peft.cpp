#include "model/peft.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"
#include "io/json_file.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "ops/gemm.h"

namespace lt {
namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

// The whole trained modules of a LoRA Finetune as PEFT's modules_to_save names (the final norm as "model.norm", so it
// does not also match every layer's norms by suffix, as PEFT matches them).
std::vector<std::string> modules_to_save(const ModelConfig& cfg, const Finetune& f) {
  std::vector<std::string> m;
  if (f.embed_tokens) m.push_back("embed_tokens");
  if (f.lm_head) m.push_back("lm_head");
  if (f.norm) m.push_back(hf_prefix(cfg) + "norm");
  return m;
}

}  // namespace

std::string peft_name(const std::string& hf_name) { return "base_model.model." + hf_name; }

PeftAdapterConfig read_peft_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kConfigFile).string();
  LT_CHECK(path_exists(path), "{}: not a PEFT adapter directory (no {})", dir, kConfigFile);
  const nlohmann::json j = read_json_file(path);
  return with_json_errors(path, [&] {
    LT_CHECK(j.is_object(), "{}: expected a JSON object", path);
    const std::string type = j.value("peft_type", std::string());
    LT_CHECK(type == "LORA", "{}: peft_type is '{}'; LazyTrain reads LORA adapters", path, type);
    LT_CHECK(j.value("bias", std::string("none")) == "none", "{}: bias '{}': LazyTrain's adapters train no biases",
             path, j.value("bias", std::string()));
    LT_CHECK(!j.value("use_dora", false), "{}: use_dora: DoRA adapters are not LoRA's update", path);
    for (const char* k : {"rank_pattern", "alpha_pattern"})
      LT_CHECK(!j.contains(k) || j[k].is_null() || j[k].empty(), "{}: {}: per-module ranks are not supported", path, k);
    PeftAdapterConfig a;
    LT_CHECK(j.contains("r") && j["r"].is_number_integer() && j["r"].get<int64_t>() >= 1,
             "{}: \"r\" must be a positive integer", path);
    a.r = j["r"].get<int64_t>();
    a.lora_alpha = j.contains("lora_alpha") ? j["lora_alpha"].get<double>() : 8.0;  // PEFT's default
    a.lora_dropout = j.value("lora_dropout", 0.0);
    a.use_rslora = j.value("use_rslora", false);
    const nlohmann::json& t = j.value("target_modules", nlohmann::json());
    if (t.is_string()) {
      LT_FAIL("{}: target_modules is a regular expression ('{}'); LazyTrain reads a list of module names", path,
              t.get<std::string>());
    }
    LT_CHECK(t.is_array() && !t.empty(), "{}: target_modules must be a non-empty list of module names", path);
    for (const auto& x : t) a.target_modules.push_back(x.get<std::string>());
    if (j.contains("modules_to_save") && !j["modules_to_save"].is_null())
      for (const auto& x : j["modules_to_save"]) a.modules_to_save.push_back(x.get<std::string>());
    a.base_model_name_or_path = j.value("base_model_name_or_path", std::string());
    return a;
  });
}

Finetune finetune_of_adapter(const ModelConfig& cfg, const PeftAdapterConfig& a, const std::string& dir) {
  std::vector<std::string> extra;
  for (const std::string& m : a.modules_to_save) {
    if (m == "embed_tokens" || m == "lm_head") extra.push_back(m);
    else if (m == hf_prefix(cfg) + "norm" || m == "model.norm") extra.push_back("norm");
    else LT_FAIL("{}/{}: modules_to_save '{}': LazyTrain trains embed_tokens, lm_head or {}norm whole", dir,
                 kConfigFile, m, hf_prefix(cfg));
  }
  try {
    return make_lora(cfg, a.r, a.lora_alpha, a.lora_dropout, a.use_rslora, a.target_modules, extra);
  } catch (const Error& e) {
    LT_FAIL("{}/{}: {}", dir, kConfigFile, e.what());
  }
}

void save_peft_adapter(const ModelSlabs& trained, const std::string& dir, const std::string& base_model) {
  const ModelConfig& cfg = trained.config();
  LT_CHECK(cfg.finetune && cfg.finetune->kind == FinetuneKind::lora, "save_peft_adapter: not a LoRA run's tensors");
  const Finetune& f = *cfg.finetune;
  make_directories(dir, "saving the LoRA adapter");
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", f.rank},
                      {"lora_alpha", f.alpha},
                      {"lora_dropout", f.dropout},
                      {"target_modules", f.targets},
                      {"use_rslora", f.rslora},
                      {"use_dora", false},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"inference_mode", true},
                      {"init_lora_weights", true},
                      {"base_model_name_or_path", base_model},
                      {"rank_pattern", nlohmann::json::object()},
                      {"alpha_pattern", nlohmann::json::object()}};
  const std::vector<std::string> m = modules_to_save(cfg, f);
  j["modules_to_save"] = m.empty() ? nlohmann::json() : nlohmann::json(m);
  NamedTensors tensors;
  for (const auto& t : trained.named_tensors()) tensors[peft_name(t.hf_name)] = t.view;
  write_json_file((std::filesystem::path(dir) / kConfigFile).string(), j);
  write_safetensors((std::filesystem::path(dir) / kWeightsFile).string(), tensors);
}

void load_peft_adapter(const std::string& dir, ModelSlabs& trained) {
  const std::string path = (std::filesystem::path(dir) / kWeightsFile).string();
  LT_CHECK(path_exists(path), "{}: no {} (a PEFT adapter directory has its tensors there)", dir,
           kWeightsFile);
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<std::string> missing;
  std::map<std::string, bool> seen;
  for (const auto& t : trained.named_tensors()) {
    const std::string name = peft_name(t.hf_name);
    seen[name] = true;
    if (!file.contains(name)) {
      missing.push_back(name);
      continue;
    }
    file.read_f32(name, t.view.ptr<float>(), t.view.shape);
  }
  LT_CHECK(missing.empty(), "{}: missing tensor{} {} (its adapter_config.json says they are there)", path,
           missing.size() > 1 ? "s" : "", fmt::join(missing.begin(), missing.begin() + std::min<size_t>(missing.size(), 5), ", "));
  for (const std::string& n : file.names())
    LT_CHECK(seen.count(n), "{}: unexpected tensor {} (not an adapter of its config's target_modules)", path, n);
}

void init_adapters(ModelSlabs& trained, uint64_t seed) {
  Rng rng(seed);
  for (const auto& t : trained.named_tensors()) {
    float* p = t.view.ptr<float>();
    if (t.hf_name.ends_with(".lora_B.weight")) {
      std::fill_n(p, t.view.numel(), 0.0f);
    } else if (t.hf_name.ends_with(".lora_A.weight")) {
      const float bound = float(1.0 / std::sqrt(double(t.view.shape[1])));
      for (int64_t i = 0; i < t.view.numel(); ++i) p[i] = rng.uniform(-bound, bound);
    }
  }
}

void merge_adapters(ModelSlabs& base, const ModelSlabs& trained) {
  const ModelConfig& cfg = trained.config();
  LT_CHECK(cfg.finetune && cfg.finetune->kind == FinetuneKind::lora, "merge_adapters: not a LoRA run's tensors");
  LT_CHECK(base.set() == SlabSet::all && base.matrix_dtype() == DType::f32, "merge_adapters: into f32 slabs of every tensor");
  const float s = cfg.finetune->scale();
  const int64_t r = cfg.finetune->rank;
  std::map<std::string, TensorView> into;
  for (const auto& t : base.named_tensors()) into.emplace(t.hf_name, t.view);
  std::map<std::string, TensorView> adapters;
  for (const auto& t : trained.named_tensors()) adapters.emplace(t.hf_name, t.view);
  std::vector<float> delta;
  for (const auto& t : trained.named_tensors()) {
    const std::string& n = t.hf_name;
    if (n.ends_with(".lora_B.weight")) continue;
    if (!n.ends_with(".lora_A.weight")) {  // a whole trained module replaces the base's
      const TensorView& dst = into.at(n);
      std::copy_n(t.view.ptr<float>(), t.view.numel(), dst.ptr<float>());
      continue;
    }
    const std::string linear = n.substr(0, n.size() - std::string(".lora_A.weight").size());
    const TensorView& W = into.at(linear + ".weight");  // [out, in]
    const TensorView& A = t.view;                        // [r, in]
    const auto b = adapters.find(linear + ".lora_B.weight");
    LT_CHECK(b != adapters.end(), "merge_adapters: {} has lora_A but no lora_B", linear);
    const TensorView& B = b->second;  // [out, r]
    const int64_t out = W.shape[0], in = W.shape[1];
    delta.assign(size_t(out * in), 0.0f);
    gemm_f32(Trans::no, Trans::no, out, in, r, B.ptr<float>(), r, A.ptr<float>(), in, delta.data(), in, Accumulate::no);
    float* w = W.ptr<float>();
    for (int64_t i = 0; i < out * in; ++i) w[i] += s * delta[size_t(i)];
  }
}

void merge_adapter_dir(ModelSlabs& base, const std::string& dir) {
  ModelConfig cfg = base.config();
  cfg.finetune = std::make_shared<const Finetune>(finetune_of_adapter(cfg, read_peft_config(dir), dir));
  ModelSlabs adapter(cfg, DType::f32, Fill::zero, SlabSet::trained);
  load_peft_adapter(dir, adapter);
  merge_adapters(base, adapter);
}

LoadedModel load_hf_model_with_adapter(const std::string& base_dir, const std::string& adapter_dir) {
  LoadedModel base = load_hf_model(base_dir);
  ModelConfig cfg = base.config;
  cfg.finetune = std::make_shared<const Finetune>(finetune_of_adapter(cfg, read_peft_config(adapter_dir), adapter_dir));
  ModelSlabs adapter(cfg, DType::f32, Fill::zero, SlabSet::trained);
  load_peft_adapter(adapter_dir, adapter);
  LoadedModel m{cfg, ModelSlabs(cfg, DType::f32, Fill::none), std::move(base.extras)};
  copy_tensors_by_name(m.params, base.params);
  copy_tensors_by_name(m.params, adapter);
  return m;
}

bool is_adapter_dir(const std::string& dir) {
  return path_exists(std::filesystem::path(dir) / kConfigFile);
}

}  // namespace lt
