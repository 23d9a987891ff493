#include "model/finetune.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "model/layout.h"

namespace lt {

std::string layer_module(const std::string& entry) { return entry.substr(0, entry.find('.')); }

bool Finetune::trains(SlabKind slab, int64_t layer, const std::string& entry) const {
  if (kind == FinetuneKind::full) return true;
  switch (slab) {
    case SlabKind::embedding: return embed_tokens;
    case SlabKind::head: return entry == "norm.weight" ? norm : lm_head;
    case SlabKind::layer:
      if (!trains_layer(layer)) return false;
      return modules.empty() || std::find(modules.begin(), modules.end(), layer_module(entry)) != modules.end();
  }
  return false;
}

std::string Finetune::summary(const ModelConfig& cfg) const {
  if (kind == FinetuneKind::full) return "full: every parameter trains";
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
  std::vector<std::string> extra;
  if (embed_tokens) extra.push_back("embed_tokens");
  if (norm) extra.push_back("norm");
  if (lm_head) extra.push_back("lm_head");
  int64_t trained = 0;
  auto count = [&](const SlabLayout& layout, SlabKind slab, int64_t layer) {
    for (const SlabEntry& e : layout.entries())
      if (trains(slab, layer, e.name)) trained += e.numel();
  };
  count(SlabLayout::make(cfg, SlabKind::embedding), SlabKind::embedding, 0);
  for (int64_t l = 0; l < cfg.num_layers; ++l) count(SlabLayout::make_layer(cfg, l), SlabKind::layer, l);
  count(SlabLayout::make(cfg, SlabKind::head), SlabKind::head, 0);
  return fmt::format("freeze: layers {} ({}){}{}; {:.2f}M of {:.2f}M parameters train ({:.1f}%)",
                     ranges.empty() ? "none" : ranges, mods, extra.empty() ? "" : ", ", fmt::join(extra, ", "),
                     double(trained) / 1e6, double(cfg.num_parameters()) / 1e6,
                     100.0 * double(trained) / double(cfg.num_parameters()));
}

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
  std::vector<std::string> extras = {"embed_tokens", "norm"};
  if (!cfg.tie_word_embeddings) extras.push_back("lm_head");
  for (const std::string& m : extra) {
    LT_CHECK(std::find(extras.begin(), extras.end(), m) != extras.end(),
             "{}_extra_modules: '{}' is not a module outside the layers of this model; choose from {}{}", what, m,
             fmt::join(extras, ", "), cfg.tie_word_embeddings ? " (lm_head is the tied embedding: embed_tokens)" : "");
    if (m == "embed_tokens") f.embed_tokens = true;
    if (m == "norm") f.norm = true;
    if (m == "lm_head") f.lm_head = true;
  }
  return f;
}

bool ModelConfig::trains(SlabKind kind, int64_t layer, const std::string& entry) const {
  return !finetune || finetune->trains(kind, layer, entry);
}

bool ModelConfig::trains_all() const { return !finetune || finetune->kind == FinetuneKind::full; }

}  // namespace lt
