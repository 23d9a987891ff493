#include "model/finetune.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "model/layout.h"

namespace lt {

int64_t lowest_backward_layer(const ModelConfig& cfg) {
  if (cfg.trains_all() || SlabLayout::trained(cfg, SlabKind::embedding).bytes() > 0) return 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    if (SlabLayout::trained(cfg, SlabKind::layer, l).bytes() > 0) return l;
  return cfg.num_layers;
}

std::string layer_module(const std::string& entry) { return entry.substr(0, entry.find('.')); }

bool is_adapter_entry(const std::string& entry) {
  return entry.find(".lora_A.") != std::string::npos || entry.find(".lora_B.") != std::string::npos;
}

std::vector<std::pair<std::string, std::string>> adaptable_linears(const ModelConfig& cfg, int64_t layer) {
  std::vector<std::pair<std::string, std::string>> out;
  if (cfg.layer_kind(layer) == LayerKind::linear_attention) {
    for (const char* n : {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"})
      out.emplace_back(std::string("linear_attn.") + n, n);
  } else {
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) out.emplace_back(std::string("self_attn.") + n, n);
  }
  if (!cfg.sparse_layer(layer)) {
    for (const char* n : {"gate_proj", "up_proj", "down_proj"}) out.emplace_back(std::string("mlp.") + n, n);
    return out;
  }
  if (cfg.gpt_oss()) return out;  // fused 3-D experts and a router that is not a Linear: nothing PEFT adapts
  out.emplace_back("mlp.gate", "gate");  // the router
  for (int64_t e = 0; e < cfg.num_experts; ++e)
    for (const char* n : {"gate_proj", "up_proj", "down_proj"})
      out.emplace_back(fmt::format("mlp.experts.{}.{}", e, n), n);
  if (cfg.shared_expert_intermediate_size > 0) {
    for (const char* n : {"gate_proj", "up_proj", "down_proj"}) out.emplace_back(std::string("mlp.shared_expert.") + n, n);
    out.emplace_back("mlp.shared_expert_gate", "shared_expert_gate");
  }
  return out;
}

float Finetune::scale() const {
  return float(rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank));
}

bool Finetune::adapts(const std::string& entry_prefix) const {
  if (kind != FinetuneKind::lora) return false;
  const std::string name = entry_prefix.substr(entry_prefix.rfind('.') + 1);
  // PEFT's matching: a target names the linear's last component ("gate" the router alone, "gate_proj" every
  // expert's, the shared expert's and a dense MLP's).
  return (entry_prefix.rfind("self_attn.", 0) == 0 || entry_prefix.rfind("linear_attn.", 0) == 0 ||
          entry_prefix.rfind("mlp.", 0) == 0) &&
         std::find(targets.begin(), targets.end(), name) != targets.end();
}

bool Finetune::trains(SlabKind slab, int64_t layer, const std::string& entry) const {
  if (kind == FinetuneKind::full) return true;
  switch (slab) {
    case SlabKind::embedding: return embed_tokens;
    case SlabKind::head: return entry == "norm.weight" ? norm : lm_head;
    case SlabKind::layer:
      if (kind == FinetuneKind::lora) return is_adapter_entry(entry);
      if (!trains_layer(layer)) return false;
      return modules.empty() || std::find(modules.begin(), modules.end(), layer_module(entry)) != modules.end();
  }
  return false;
}

namespace {

// The parameters `cfg` trains (the adapters' included).
int64_t trained_parameters(const ModelConfig& cfg) {
  int64_t n = SlabLayout::trained(cfg, SlabKind::embedding).num_parameters() +
              SlabLayout::trained(cfg, SlabKind::head).num_parameters();
  for (int64_t l = 0; l < cfg.num_layers; ++l) n += SlabLayout::trained(cfg, SlabKind::layer, l).num_parameters();
  return n;
}

}  // namespace

std::string Finetune::summary(const ModelConfig& cfg) const {
  if (kind == FinetuneKind::full) return "full: every parameter trains";
  std::vector<std::string> extra;
  if (embed_tokens) extra.push_back("embed_tokens");
  if (norm) extra.push_back("norm");
  if (lm_head) extra.push_back("lm_head");
  if (kind == FinetuneKind::lora) {
    ModelConfig with = cfg;
    with.finetune = std::make_shared<const Finetune>(*this);
    const int64_t trained = trained_parameters(with);
    return fmt::format("lora: rank {}, alpha {:g} ({}scale {:g}), dropout {:g}, on {}{}{}; {:.3f}M adapter and "
                       "trained parameters beside {:.2f}M frozen ({:.2f}%)",
                       rank, alpha, rslora ? "rsLoRA " : "", scale(), dropout, fmt::join(targets, ", "),
                       extra.empty() ? "" : "; training whole: ", fmt::join(extra, ", "), double(trained) / 1e6,
                       double(cfg.num_parameters()) / 1e6, 100.0 * double(trained) / double(cfg.num_parameters()));
  }
  std::string ranges;
  for (int64_t l = 0; l < cfg.num_layers;) {
    if (!trains_layer(l)) {
      ++l;
      continue;
    }
    int64_t end = l;
    while (end + 1 < cfg.num_layers && trains_layer(end + 1)) ++end;
    ranges += fmt::format("{}{}", ranges.empty() ? "" : ", ", l == end ? fmt::format("{}", l) : fmt::format("{}-{}", l, end));
    l = end + 1;
  }
  std::string mods = modules.empty() ? "all modules" : fmt::format("{}", fmt::join(modules, ", "));
  ModelConfig with = cfg;
  with.finetune = std::make_shared<const Finetune>(*this);
  const int64_t trained = trained_parameters(with);
  return fmt::format("freeze: layers {} ({}){}{}; {:.2f}M of {:.2f}M parameters train ({:.1f}%)",
                     ranges.empty() ? "none" : ranges, mods, extra.empty() ? "" : ", ", fmt::join(extra, ", "),
                     double(trained) / 1e6, double(cfg.num_parameters()) / 1e6,
                     100.0 * double(trained) / double(cfg.num_parameters()));
}

namespace {

// freeze_extra_modules / additional_target: the modules outside the layers that train whole.
void set_extra(Finetune& f, const ModelConfig& cfg, const std::vector<std::string>& extra, const std::string& key) {
  std::vector<std::string> extras = {"embed_tokens", "norm"};
  if (!cfg.tie_word_embeddings) extras.push_back("lm_head");
  for (const std::string& m : extra) {
    LT_CHECK(std::find(extras.begin(), extras.end(), m) != extras.end(),
             "{}: '{}' is not a module outside the layers of this model; choose from {}{}", key, m,
             fmt::join(extras, ", "), cfg.tie_word_embeddings ? " (lm_head is the tied embedding: embed_tokens)" : "");
    if (m == "embed_tokens") f.embed_tokens = true;
    if (m == "norm") f.norm = true;
    if (m == "lm_head") f.lm_head = true;
  }
}

}  // namespace

Finetune make_freeze(const ModelConfig& cfg, int64_t trainable_layers, const std::vector<std::string>& modules,
                     const std::vector<std::string>& extra, const std::string& what) {
  const int64_t L = cfg.num_layers;
  Finetune f;
  f.kind = FinetuneKind::freeze;
  LT_CHECK(trainable_layers != 0, "{}_trainable_layers: 0 trains no layer (the last N layers train for N > 0, the "
           "first -N for N < 0)", what);
  f.layers.assign(size_t(L), 0);
  const int64_t first = trainable_layers > 0 ? std::max<int64_t>(0, L - trainable_layers) : 0;
  const int64_t end = trainable_layers > 0 ? L : std::min(L, -trainable_layers);
  for (int64_t l = first; l < end; ++l) f.layers[size_t(l)] = 1;

  std::set<std::string> have;  // the layer modules this model has, in any of its layers
  for (int64_t l = 0; l < L; ++l)
    for (const SlabLayout layout = SlabLayout::make_layer(cfg, l); const SlabEntry& e : layout.entries())
      have.insert(layer_module(e.name));
  const bool all = std::find(modules.begin(), modules.end(), "all") != modules.end();
  LT_CHECK(!modules.empty(), "{}_trainable_modules: empty (\"all\", or some of {})", what, fmt::join(have, ", "));
  LT_CHECK(!all || modules.size() == 1, "{}_trainable_modules: \"all\" with other names ({})", what,
           fmt::join(modules, ", "));
  if (!all) {
    for (const std::string& m : modules)
      LT_CHECK(have.count(m), "{}_trainable_modules: module '{}' is not in {}'s layers; choose from all, {}", what, m,
               model_type_name(cfg.type), fmt::join(have, ", "));
    f.modules = modules;
  }
  set_extra(f, cfg, extra, what + "_extra_modules");
  return f;
}


Finetune make_lora(const ModelConfig& cfg, int64_t rank, double alpha, double dropout, bool rslora,
                   const std::vector<std::string>& targets, const std::vector<std::string>& additional) {
  Finetune f;
  f.kind = FinetuneKind::lora;
  LT_CHECK(rank >= 1, "lora_rank: must be at least 1, got {}", rank);
  LT_CHECK(alpha > 0, "lora_alpha: must be above 0, got {}", alpha);
  LT_CHECK(dropout >= 0 && dropout < 1, "lora_dropout: must be in [0, 1), got {}", dropout);
  f.rank = rank, f.alpha = alpha, f.dropout = dropout, f.rslora = rslora;
  std::vector<std::string> have, sparse_only;  // the adaptable linears' names, in the model's order
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (const auto& [prefix, name] : adaptable_linears(cfg, l))
      if (std::find(have.begin(), have.end(), name) == have.end()) have.push_back(name);
  LT_CHECK(!targets.empty(), "lora_target: empty (all, or some of {})", fmt::join(have, ", "));
  const bool all = std::find(targets.begin(), targets.end(), "all") != targets.end();
  LT_CHECK(!all || targets.size() == 1, "lora_target: \"all\" with other names ({})", fmt::join(targets, ", "));
  for (const std::string& t : all ? have : targets) {
    if (std::find(have.begin(), have.end(), t) == have.end()) {
      const bool expert = cfg.gpt_oss() && (t == "gate_proj" || t == "up_proj" || t == "down_proj" || t == "router");
      LT_CHECK(!expert, "lora_target: '{}' is in gpt_oss's sparse layers, whose experts are fused 3-D tensors and "
               "whose router is not a Linear module: PEFT's LoRA adapts neither; choose from all, {}", t,
               fmt::join(have, ", "));
      LT_FAIL("lora_target: '{}' is not a linear of {}'s layers; choose from all, {}", t, model_type_name(cfg.type),
              fmt::join(have, ", "));
    }
    if (std::find(f.targets.begin(), f.targets.end(), t) == f.targets.end()) f.targets.push_back(t);
  }
  set_extra(f, cfg, additional, "additional_target");
  return f;
}

bool ModelConfig::trains(SlabKind kind, int64_t layer, const std::string& entry) const {
  return !finetune || finetune->trains(kind, layer, entry);
}

bool ModelConfig::trains_all() const { return !finetune || finetune->kind == FinetuneKind::full; }

}  // namespace lt
