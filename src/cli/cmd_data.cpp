// cli/cmd_data.cpp — `lazytrain data CONFIG.yaml [key=value ...]`: the training data prepared exactly as `train`
// prepares it (datasets read as streams, tokenised into output_dir/data_cache, the loader built), then a report
// and a stop. Tokenising a large data set once, on any machine, before the run that needs the accelerator; a
// later `train` with the same config finds the cache.
//
// Prints each dataset's report, then one JSON line: examples, tokens, trained tokens, the loader's units and
// steps per epoch (optimizer steps: per gradient_accumulation_steps micro-batches), packing fill, and the cache
// files.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/paths.h"
#include "model/config.h"
#include "text/text.h"
#include "train/trainer.h"

namespace lt::cli {

void register_data(CLI::App& app) {
  auto config = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto* cmd = app.add_subcommand("data", "tokenise a config's datasets into its data cache and report them");
  cmd->add_option("config", *config, "the YAML config")->required();
  cmd->add_option("overrides", *overrides, "key=value overrides of the config");
  cmd->callback([config, overrides]() {
    namespace fs = std::filesystem;
    const TrainConfig c = load_train_config(*config, *overrides);
    // The model's directory holds the tokenizer; a config.json alone (training from scratch) sits beside it.
    const fs::path model(c.model_name_or_path);
    const std::string dir = is_file_path(model) ? model.parent_path().string() : model.string();
    const ModelConfig mc = load_model_config(c.model_name_or_path);
    const Tokenizer tok = Tokenizer::load(dir);
    const ChatTemplate tpl(train_template_kind(c, mc.type), tok);
    make_directories(c.output_dir, "output_dir");
    const DataLoader loader = load_train_data(c, tok, tpl);
    const TokenizedDataset& data = loader.data();
    std::printf("%s\n", data.summary().c_str());
    nlohmann::json caches = nlohmann::json::array();
    int64_t trained = 0;
    for (const DatasetReport& r : data.reports()) {
      trained += r.trainable_tokens;
      if (!r.cache_path.empty()) caches.push_back({{"path", r.cache_path}, {"use", cache_use_name(r.cache)}});
    }
    const nlohmann::json out = {
        {"examples", data.size()},
        {"tokens", data.total_tokens()},
        {"trained_tokens", trained},
        {"longest", data.max_length()},
        {"units_per_epoch", loader.units_per_epoch()},
        {"micro_batches_per_epoch", loader.steps_per_epoch()},
        {"steps_per_epoch", std::max<int64_t>(1, loader.steps_per_epoch() / c.gradient_accumulation_steps)},
        {"packing_fill", loader.pack_stats().fill},
        {"caches", caches},
    };
    std::printf("%s\n", out.dump().c_str());
  });
}

}  // namespace lt::cli
