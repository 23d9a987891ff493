#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/units.h"
#include "exec/backend.h"
#include "model/finetune.h"

namespace lt {
namespace {

// One key of the config: how to read it from a YAML node, and how to show it.
struct Key {
  std::function<void(TrainConfig&, const YAML::Node&, const std::string& where)> read;
  std::function<nlohmann::json(const TrainConfig&)> show;
};

std::string node_text(const YAML::Node& n) {
  YAML::Emitter e;
  e << n;
  return e.c_str();
}

template <typename T>
T scalar_as(const YAML::Node& n, const std::string& where, const char* expected) {
  LT_CHECK(n.IsScalar(), "{}: expected {}, got {}", where, expected, node_text(n));
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    LT_FAIL("{}: expected {}, got '{}'", where, expected, n.Scalar());
  }
}

template <typename T>
Key number(T TrainConfig::*field, T min_value) {
  return Key{[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
               T v = scalar_as<T>(n, where, std::is_integral_v<T> ? "an integer" : "a number");
               LT_CHECK(v >= min_value, "{}: must be at least {}, got {}", where, min_value, v);
               c.*field = v;
             },
             [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

Key text(std::string TrainConfig::*field, std::vector<std::string> allowed = {}) {
  return Key{[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
               std::string v = scalar_as<std::string>(n, where, "a string");
               if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
                 std::string list;
                 for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
                 LT_FAIL("{}: '{}' is not one of {}", where, v, list);
               }
               c.*field = v;
             },
             [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

Key size_text(std::string TrainConfig::*field, bool allow_auto) {
  return Key{[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
               std::string v = scalar_as<std::string>(n, where, "a size (bytes, or with a unit such as 8GiB)");
               if (!(allow_auto && v == "auto")) parse_size(v, where);  // validates, message names the key
               c.*field = v;
             },
             [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

Key boolean(bool TrainConfig::*field) {
  return Key{[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
               c.*field = scalar_as<bool>(n, where, "true or false");
             },
             [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

// A list of names: a YAML sequence, or one comma-separated string (LLaMA-Factory's `dataset: a,b`).
Key names(std::vector<std::string> TrainConfig::*field) {
  return Key{[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
               std::vector<std::string> out;
               auto split = [&](const std::string& s) {
                 size_t start = 0;
                 while (start <= s.size()) {
                   size_t comma = s.find(',', start);
                   std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                   part.erase(0, part.find_first_not_of(" \t"));
                   part.erase(part.find_last_not_of(" \t") + 1);
                   if (!part.empty()) out.push_back(part);
                   if (comma == std::string::npos) break;
                   start = comma + 1;
                 }
               };
               if (n.IsSequence()) {
                 for (const auto& item : n) split(scalar_as<std::string>(item, where, "a list of names"));
               } else {
                 split(scalar_as<std::string>(n, where, "a name or a list of names"));
               }
               c.*field = out;
             },
             [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

const std::map<std::string, Key>& keys() {
  static const std::map<std::string, Key> k = {
      {"model_name_or_path", text(&TrainConfig::model_name_or_path)},
      {"dataset", names(&TrainConfig::dataset)},
      {"dataset_dir", text(&TrainConfig::dataset_dir)},
      {"eval_dataset", names(&TrainConfig::eval_dataset)},
      {"template", text(&TrainConfig::template_name, {"auto", "qwen2_5", "qwen3", "qwen3_5", "plain"})},
      {"cutoff_len", number(&TrainConfig::cutoff_len, int64_t(2))},
      {"packing", boolean(&TrainConfig::packing)},
      {"on_bad_example", text(&TrainConfig::on_bad_example, {"stop", "skip"})},
      {"per_device_train_batch_size", number(&TrainConfig::per_device_train_batch_size, int64_t(1))},
      {"per_device_eval_batch_size", number(&TrainConfig::per_device_eval_batch_size, int64_t(1))},
      {"gradient_accumulation_steps", number(&TrainConfig::gradient_accumulation_steps, int64_t(1))},
      {"learning_rate", number(&TrainConfig::learning_rate, 0.0)},
      {"lr_scheduler_type", text(&TrainConfig::lr_scheduler_type, {"cosine", "linear", "constant"})},
      {"warmup_ratio", number(&TrainConfig::warmup_ratio, 0.0)},
      {"warmup_steps", number(&TrainConfig::warmup_steps, int64_t(0))},
      {"max_steps", number(&TrainConfig::max_steps, int64_t(-1))},
      {"num_train_epochs", number(&TrainConfig::num_train_epochs, 0.0)},
      {"max_grad_norm", number(&TrainConfig::max_grad_norm, 0.0)},
      {"weight_decay", number(&TrainConfig::weight_decay, 0.0)},
      {"adam_beta1", number(&TrainConfig::adam_beta1, 0.0)},
      {"adam_beta2", number(&TrainConfig::adam_beta2, 0.0)},
      {"adam_epsilon", number(&TrainConfig::adam_epsilon, 0.0)},
      {"seed", number(&TrainConfig::seed, int64_t(0))},
      {"moe_aux_loss_coef", number(&TrainConfig::moe_aux_loss_coef, 0.0)},
      {"finetuning_type", text(&TrainConfig::finetuning_type, {"full", "freeze", "lora"})},
      {"lora_rank", number(&TrainConfig::lora_rank, int64_t(1))},
      {"lora_alpha", number(&TrainConfig::lora_alpha, 0.0)},
      {"lora_dropout", number(&TrainConfig::lora_dropout, 0.0)},
      {"lora_target", names(&TrainConfig::lora_target)},
      {"use_rslora", boolean(&TrainConfig::use_rslora)},
      {"additional_target", names(&TrainConfig::additional_target)},
      {"adapter_name_or_path", names(&TrainConfig::adapter_name_or_path)},
      {"create_new_adapter", boolean(&TrainConfig::create_new_adapter)},
      {"freeze_trainable_layers", number(&TrainConfig::freeze_trainable_layers, std::numeric_limits<int64_t>::min())},
      {"freeze_trainable_modules", names(&TrainConfig::freeze_trainable_modules)},
      {"freeze_extra_modules", names(&TrainConfig::freeze_extra_modules)},
      {"output_dir", text(&TrainConfig::output_dir)},
      {"logging_steps", number(&TrainConfig::logging_steps, int64_t(1))},
      {"save_steps", number(&TrainConfig::save_steps, int64_t(0))},
      {"save_total_limit", number(&TrainConfig::save_total_limit, int64_t(-1))},
      {"eval_steps", number(&TrainConfig::eval_steps, int64_t(0))},
      {"resume_from_checkpoint", text(&TrainConfig::resume_from_checkpoint)},
      {"save_dtype", text(&TrainConfig::save_dtype, {"bf16", "f32"})},
      {"device", text(&TrainConfig::device, Backend::names())},
      {"device_memory", size_text(&TrainConfig::device_memory, false)},
      {"host_memory", size_text(&TrainConfig::host_memory, true)},
      {"host_act_memory", size_text(&TrainConfig::host_act_memory, true)},
      {"nvme_dir", text(&TrainConfig::nvme_dir)},
      {"nvme_size", size_text(&TrainConfig::nvme_size, false)},
      {"link_gbps", number(&TrainConfig::link_gbps, 0.0)},
      {"weight_buffers", number(&TrainConfig::weight_buffers, int64_t(1))},
      {"resident_head", boolean(&TrainConfig::resident_head)},
      {"save_on_signal", boolean(&TrainConfig::save_on_signal)},
      {"plan", text(&TrainConfig::plan)},
      {"optimizer_state_bits", number(&TrainConfig::optimizer_state_bits, int64_t(8))},
      {"compute_dtype", text(&TrainConfig::compute_dtype, {"bf16", "f32", "auto"})},
      {"activation_dtype", text(&TrainConfig::activation_dtype, {"bf16", "f32", "auto"})},
      {"threads", number(&TrainConfig::threads, int64_t(0))},
      {"net_gbps", number(&TrainConfig::net_gbps, 0.0)},
      {"dist_timeout_s", number(&TrainConfig::dist_timeout_s, 0.0)},
  };
  return k;
}

std::vector<std::string> key_names() {
  std::vector<std::string> out;
  for (const auto& [name, key] : keys()) out.push_back(name);
  return out;
}

// Other spellings accepted for a key: `policy` for `plan` (the CLI's older --policy).
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> a = {{"policy", "plan"}};
  return a;
}

void apply(TrainConfig& c, const std::string& key_in, const YAML::Node& value, const std::string& where) {
  const auto alias = aliases().find(key_in);
  const std::string& key = alias == aliases().end() ? key_in : alias->second;
  auto it = keys().find(key);
  if (it == keys().end()) {
    std::string near = closest_key(key, key_names());
    LT_FAIL("{}: unknown key '{}'{}", where, key, near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  it->second.read(c, value, where + ": " + key);
  if (std::find(c.given.begin(), c.given.end(), key) == c.given.end()) c.given.push_back(key);
}

}  // namespace

std::string closest_key(const std::string& key, const std::vector<std::string>& known) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : known) {
    size_t d = distance(key, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  // Close enough to be a typo: at most a third of the key's length.
  return best_d <= std::max<size_t>(2, key.size() / 3) ? best : "";
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j;
  for (const auto& [name, key] : keys()) j[name] = key.show(*this);
  return j;
}

const std::vector<std::string>& TrainConfig::result_keys() {
  static const std::vector<std::string> k = {
      "model_name_or_path", "dataset", "dataset_dir", "template", "cutoff_len", "packing", "on_bad_example",
      "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "lr_scheduler_type",
      "warmup_ratio", "warmup_steps", "max_steps", "num_train_epochs", "max_grad_norm", "weight_decay",
      "adam_beta1", "adam_beta2", "adam_epsilon", "seed", "optimizer_state_bits", "compute_dtype",
      "activation_dtype", "finetuning_type", "freeze_trainable_layers", "freeze_trainable_modules",
      "freeze_extra_modules", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_rslora",
      "additional_target", "adapter_name_or_path", "create_new_adapter"};
  return k;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    LT_FAIL("{}: cannot open the config file", path);
  } catch (const YAML::ParserException& e) {
    LT_FAIL("{}:{}:{}: invalid YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  LT_CHECK(root.IsMap(), "{}: a config is a mapping of keys to values", path);
  TrainConfig c;
  c.source = path;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    apply(c, key, kv.second, fmt::format("{}:{}", path, kv.first.Mark().line + 1));
  }
  for (const auto& o : overrides) {
    size_t eq = o.find('=');
    LT_CHECK(eq != std::string::npos && eq > 0, "override '{}': expected key=value", o);
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      LT_FAIL("override '{}': invalid value: {}", o, e.what());
    }
    if (value.IsNull()) value = YAML::Node(std::string());
    apply(c, o.substr(0, eq), value, "override");
  }
  LT_CHECK(!c.model_name_or_path.empty(), "{}: model_name_or_path is required", path);
  LT_CHECK(!c.dataset.empty(), "{}: dataset is required", path);
  LT_CHECK(!c.output_dir.empty(), "{}: output_dir is required", path);
  LT_CHECK(c.optimizer_state_bits == 8 || c.optimizer_state_bits == 32,
           "{}: optimizer_state_bits must be 8 or 32, got {}", path, c.optimizer_state_bits);
  LT_CHECK(c.adam_beta1 < 1 && c.adam_beta2 < 1, "{}: adam betas must be below 1", path);
  LT_CHECK(c.warmup_ratio <= 1, "{}: warmup_ratio must be at most 1, got {}", path, c.warmup_ratio);
  LT_CHECK(c.max_steps > 0 || c.num_train_epochs > 0, "{}: set max_steps or num_train_epochs above 0", path);
  // A key of another fine-tuning method contradicts finetuning_type (LLaMA-Factory ignores it silently).
  for (const std::string& k : c.given) {
    LT_CHECK(!(k.rfind("freeze_", 0) == 0 && c.finetuning_type != "freeze"),
             "{}: {} is a key of finetuning_type: freeze, but finetuning_type is {}", path, k, c.finetuning_type);
    const bool lora_key = k.rfind("lora_", 0) == 0 || k == "use_rslora" || k == "additional_target" ||
                          k == "adapter_name_or_path" || k == "create_new_adapter";
    LT_CHECK(!(lora_key && c.finetuning_type != "lora"),
             "{}: {} is a key of finetuning_type: lora, but finetuning_type is {}", path, k, c.finetuning_type);
  }
  LT_CHECK(c.lora_dropout < 1, "{}: lora_dropout must be below 1, got {}", path, c.lora_dropout);
  LT_CHECK(c.freeze_trainable_layers != 0,
           "{}: freeze_trainable_layers: 0 trains no layer (N > 0: the last N layers, N < 0: the first -N)", path);
  return c;
}

LoraAdapters lora_adapters(const TrainConfig& c) {
  LoraAdapters a;
  if (c.finetuning_type != "lora" || c.adapter_name_or_path.empty()) return a;
  a.merge = c.adapter_name_or_path;
  if (!c.create_new_adapter) {
    a.resume = a.merge.back();
    a.merge.pop_back();
  }
  return a;
}

std::shared_ptr<const Finetune> finetune_of(const TrainConfig& c, const ModelConfig& model) {
  if (c.finetuning_type == "full") return nullptr;
  if (c.finetuning_type == "freeze")
    return std::make_shared<const Finetune>(make_freeze(model, c.freeze_trainable_layers, c.freeze_trainable_modules,
                                                        c.freeze_extra_modules, "freeze"));
  const double alpha = std::isnan(c.lora_alpha) ? 2.0 * double(c.lora_rank) : c.lora_alpha;
  return std::make_shared<const Finetune>(
      make_lora(model, c.lora_rank, alpha, c.lora_dropout, c.use_rslora, c.lora_target, c.additional_target));
}

}  // namespace lt
