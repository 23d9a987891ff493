// fuzz_peft_config: a PEFT adapter's adapter_config.json (model/peft.h) — what `--adapter` and
// adapter_name_or_path read — and the LoRA it makes on a small Qwen3 (its targets checked against the model's linears).
#include "fuzz_common.h"
#include "model/finetune.h"
#include "model/peft.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = lt::fuzz::write_file("adapter/adapter_config.json", lt::fuzz::as_text(data, size));
  const std::string dir = std::filesystem::path(path).parent_path().string();
  lt::fuzz::expect_clean([&] {
    const lt::PeftAdapterConfig a = lt::read_peft_config(dir);
    lt::ModelConfig cfg;
    cfg.type = lt::ModelType::qwen3;
    cfg.vocab_size = 64, cfg.hidden_size = 32, cfg.intermediate_size = 48, cfg.num_layers = 2;
    cfg.num_heads = 4, cfg.num_kv_heads = 2, cfg.head_dim = 8, cfg.qk_norm = true, cfg.rms_norm_eps = 1e-6;
    cfg.rope_theta = 10000, cfg.max_position_embeddings = 128;
    const lt::Finetune f = lt::finetune_of_adapter(cfg, a, dir);
    (void)f.summary(cfg);
  });
  return 0;
}
