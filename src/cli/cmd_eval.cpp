// cli/cmd_eval.cpp — `lazytrain eval CONFIG` (exact match on the config's eval_dataset, with the newest
// checkpoint in output_dir, or --model) and `lazytrain generate --model DIR --prompt TEXT`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "model/generate.h"
#include "model/peft.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/evaluate.h"

namespace lt::cli {
namespace {

ChatTemplate template_for(const std::string& name, const ModelConfig& cfg, const Tokenizer& tok) {
  ChatTemplateKind kind = name == "auto" ? default_chat_template(model_type_name(cfg.type)) : parse_chat_template_kind(name);
  return ChatTemplate(kind, tok);
}

}  // namespace

void register_eval(CLI::App& app) {
  struct Options {
    std::string config, model;
    std::vector<std::string> overrides;
    int64_t limit = 0, max_new_tokens = 64;
    bool predictions = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("eval", "exact-match accuracy on the config's eval_dataset by greedy decoding");
  cmd->add_option("config", o->config, "the training YAML config")->required();
  cmd->add_option("overrides", o->overrides, "key=value overrides of the config");
  cmd->add_option("--model", o->model, "model directory (default: the newest checkpoint in output_dir)");
  cmd->add_option("--limit", o->limit, "evaluate at most this many records");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "generation length limit");
  cmd->add_flag("--predictions", o->predictions, "include every record's generation and answer in the JSON");
  cmd->callback([o]() {
    TrainConfig c = load_train_config(o->config, o->overrides);
    LT_CHECK(!c.eval_dataset.empty(), "{}: eval_dataset is not set", o->config);
    std::string dir = o->model.empty() ? latest_checkpoint(c.output_dir) : o->model;
    LT_CHECK(!dir.empty(), "no checkpoint in {} and no --model given", c.output_dir);
    // A LoRA run's checkpoints are adapters (model/peft.h): on the config's base model.
    LoadedModel m = is_adapter_dir(dir) ? load_hf_model_with_adapter(c.model_name_or_path, dir) : load_hf_model(dir);
    Tokenizer tok = Tokenizer::load(dir);
    ChatTemplate tpl = template_for(c.template_name, m.config, tok);
    EvalResult r = evaluate_exact_match(m.params, tok, tpl, resolve_datasets(c.eval_dataset, c.dataset_dir),
                                        EvalOptions{o->max_new_tokens, o->limit});
    nlohmann::json j = r.to_json(o->predictions);
    j["model"] = dir;
    std::printf("%s\n", j.dump().c_str());
  });
}

void register_generate(CLI::App& app) {
  struct Options {
    std::string model, prompt, template_name = "auto", adapter;
    int64_t max_new_tokens = 128;
    bool raw = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("generate", "greedy generation with a KV cache for one prompt");
  cmd->add_option("--model", o->model, "model directory (config.json, weights, tokenizer)")->required();
  cmd->add_option("--prompt", o->prompt, "the user's message")->required();
  cmd->add_option("--template", o->template_name, "chat template: auto, qwen2_5, qwen3, qwen3_5, plain");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "generation length limit");
  cmd->add_flag("--raw", o->raw, "feed the prompt as is, without the chat template");
  cmd->add_option("--adapter", o->adapter, "a PEFT LoRA adapter directory applied on the model (unmerged)");
  cmd->callback([o]() {
    LoadedModel m = o->adapter.empty() ? load_hf_model(o->model) : load_hf_model_with_adapter(o->model, o->adapter);
    Tokenizer tok = Tokenizer::load(o->model);
    std::string text = o->prompt;
    if (!o->raw) {
      ChatTemplate tpl = template_for(o->template_name, m.config, tok);
      std::vector<ChatMessage> msgs = {{"user", o->prompt}};
      text = tpl.render(msgs, GenerationPrompt::yes);
    }
    GenerateOptions g;
    g.max_new_tokens = o->max_new_tokens;
    const SpecialTokenIds& sp = tok.special_ids();
    for (const auto& id : {sp.eos, sp.im_end})
      if (id) g.stop_ids.push_back(*id);
    std::vector<int32_t> out = generate_greedy(m.params, tok.encode(text), g);
    std::printf("%s\n", tok.decode(out, DecodeSpecial::skip).c_str());
  });
}

}  // namespace lt::cli
