// fuzz_config_json: a model's config.json as load_model_config reads it (every supported model type: the seeds
// hold qwen2, qwen3 and llama configs), then the shapes it implies.
#include "fuzz_common.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = lt::fuzz::write_file("config.json", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::ModelConfig c = lt::load_model_config(path);
    (void)c.num_parameters();
    (void)lt::model_config_to_json(c).dump();
  });
  return 0;
}
