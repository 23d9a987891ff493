// Checkpoints: HF-loadable model files, exact resume state, atomic replacement, pruning.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "io/json_file.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "testing/model_testing.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace lt {
namespace {

ModelConfig tiny() {
  return testing::small_model_config(ModelType::qwen3, {.tied = true, .max_positions = 64});
}

TEST(Checkpoint, SaveLoadRoundTripIsExactAndPrunes) {
  const std::string out = ::testing::TempDir() + "lt_ckpt";
  fs::remove_all(out);
  ModelConfig cfg = tiny();
  ModelSlabs params(cfg), grads(cfg);
  init_random(params, 3, 0.1f);
  init_random(grads, 4, 0.01f);
  AdamWConfig ocfg;
  ocfg.min_q8_numel = 256;
  HybridAdamW opt(params, grads, ocfg);
  opt.update(SlabKind::layer, 0, StepArgs{1, 1e-3, 1.0f});  // non-trivial states

  CheckpointWriter w{out, 2, "bf16"};
  fs::create_directories(out + "/.checkpoint-5.partial");  // a torn save from a killed run
  for (int64_t step : {10, 20, 30}) save_checkpoint(w, step, params, opt, {{"cursor", step * 7}});
  EXPECT_FALSE(fs::exists(out + "/.checkpoint-5.partial"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-10"));  // pruned: keep 2
  EXPECT_TRUE(fs::exists(out + "/checkpoint-20"));
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-30");

  // The model files are an HF directory (bf16) that loads as a model.
  LoadedModel hf = load_hf_model(out + "/checkpoint-30");
  EXPECT_EQ(hf.config.num_layers, 2);

  ModelSlabs params2(cfg), grads2(cfg);
  HybridAdamW opt2(params2, grads2, ocfg);
  nlohmann::json st = load_checkpoint(latest_checkpoint(out), params2, opt2);
  EXPECT_EQ(st["step"], 30);
  EXPECT_EQ(st["cursor"], 210);
  auto A = params.named_tensors(), B = params2.named_tensors();
  for (size_t t = 0; t < A.size(); ++t) EXPECT_EQ(0, std::memcmp(A[t].view.data, B[t].view.data, A[t].view.bytes()));
  // The optimizer continues identically (same gradients).
  init_random(grads2, 4, 0.01f);
  opt.update(SlabKind::layer, 0, StepArgs{2, 1e-3, 1.0f});
  opt2.update(SlabKind::layer, 0, StepArgs{2, 1e-3, 1.0f});
  EXPECT_EQ(0, std::memcmp(params.layer(0), params2.layer(0), params.layout(SlabKind::layer).bytes()));
}

TEST(Checkpoint, MissingPiecesAreNamed) {
  const std::string out = ::testing::TempDir() + "lt_ckpt_missing";
  fs::remove_all(out);
  fs::create_directories(out + "/checkpoint-3/resume");
  ModelConfig cfg = tiny();
  ModelSlabs params(cfg), grads(cfg);
  HybridAdamW opt(params, grads, AdamWConfig{});
  try {
    load_checkpoint(out + "/checkpoint-3", params, opt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume/params.safetensors"), std::string::npos) << e.what();
  }
  write_file_atomic(out + "/latest", "checkpoint-9\n");
  EXPECT_THROW(latest_checkpoint(out), Error);
  EXPECT_EQ(latest_checkpoint(out + "/nowhere"), "");
}

}  // namespace
}  // namespace lt
