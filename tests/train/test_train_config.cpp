// Training configs: LLaMA-Factory keys, LazyTrain keys, overrides, and every kind of mistake named.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "train/config.h"

namespace lt {
namespace {

std::string write_yaml(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

const char* kGood = R"(### model
model_name_or_path: runs/model
### data
dataset: arith_train, extra
template: qwen3
cutoff_len: 128
### train
per_device_train_batch_size: 16
gradient_accumulation_steps: 2
learning_rate: 1.0e-3
lr_scheduler_type: cosine
warmup_ratio: 0.05
num_train_epochs: 2.0
max_grad_norm: 1.0
output_dir: runs/demo
logging_steps: 5
save_steps: 100
### lazytrain
device_memory: 256MiB
plan: every:2
optimizer_state_bits: 8
)";

TEST(TrainConfig, ReadsKeysAndOverrides) {
  TrainConfig c = load_train_config(write_yaml("good.yaml", kGood), {"learning_rate=5e-4", "plan=keep-all", "seed=7"});
  EXPECT_EQ(c.model_name_or_path, "runs/model");
  EXPECT_EQ(c.dataset, (std::vector<std::string>{"arith_train", "extra"}));
  EXPECT_EQ(c.template_name, "qwen3");
  EXPECT_EQ(c.per_device_train_batch_size, 16);
  EXPECT_DOUBLE_EQ(c.learning_rate, 5e-4);
  EXPECT_EQ(c.lr_scheduler_type, "cosine");
  EXPECT_EQ(c.plan, "keep-all");
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.device_memory, "256MiB");
  EXPECT_EQ(c.to_json()["cutoff_len"], 128);
}

void expect_error(const std::string& yaml, const std::vector<std::string>& overrides,
                  const std::vector<std::string>& needles) {
  std::string path = write_yaml("bad.yaml", yaml);
  try {
    load_train_config(path, overrides);
    ADD_FAILURE() << "accepted:\n" << yaml;
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// `plan` is the key; `policy` (the CLI's older --policy) is read as it, and the config records `plan`.
TEST(TrainConfig, PolicyIsAnotherSpellingOfPlan) {
  TrainConfig c = load_train_config(write_yaml("policy.yaml", kGood), {"policy=host:2"});
  EXPECT_EQ(c.plan, "host:2");
  EXPECT_EQ(c.to_json()["plan"], "host:2");
  EXPECT_FALSE(c.to_json().contains("policy"));
  std::string text = kGood;
  text.replace(text.find("plan: every:2"), 13, "policy: every:3");
  EXPECT_EQ(load_train_config(write_yaml("policy2.yaml", text)).plan, "every:3");
}

TEST(TrainConfig, MistakesAreNamed) {
  std::string base = "model_name_or_path: m\ndataset: d\noutput_dir: o\n";
  expect_error(base + "learning_rat: 1e-4\n", {}, {"bad.yaml:4", "unknown key 'learning_rat'", "did you mean 'learning_rate'"});
  expect_error(base + "per_device_train_batch_size: many\n", {}, {"per_device_train_batch_size", "an integer", "many"});
  expect_error(base + "lr_scheduler_type: exponential\n", {}, {"lr_scheduler_type", "cosine, linear, constant"});
  expect_error(base + "device_memory: 12 parsecs\n", {}, {"device_memory", "unknown unit"});
  expect_error(base + "optimizer_state_bits: 16\n", {}, {"optimizer_state_bits must be 8 or 32"});
  expect_error(base + "cutoff_len: 1\n", {}, {"cutoff_len", "at least 2"});
  expect_error("dataset: d\noutput_dir: o\n", {}, {"model_name_or_path is required"});
  expect_error(base + "learning_rate: [1, 2]\n", {}, {"learning_rate", "a number"});
  expect_error(base + "key: [unclosed\n", {}, {"invalid YAML"});
  expect_error(base, {"seeed=3"}, {"unknown key 'seeed'", "did you mean 'seed'"});
  expect_error(base, {"no_equals_sign"}, {"expected key=value"});
  EXPECT_THROW(load_train_config(::testing::TempDir() + "absent.yaml"), Error);
}

TEST(TrainConfig, ClosestKey) {
  std::vector<std::string> k = {"learning_rate", "seed", "save_steps"};
  EXPECT_EQ(closest_key("learnig_rate", k), "learning_rate");
  EXPECT_EQ(closest_key("save_step", k), "save_steps");
  EXPECT_EQ(closest_key("completely_different", k), "");
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// LLaMA-Factory's freeze keys, their defaults, and the keys of another method refused by name.
TEST(TrainConfig, FinetuningTypeAndFreezeKeys) {
  TrainConfig full = load_train_config(write_yaml("full.yaml", kGood));
  EXPECT_EQ(full.finetuning_type, "full");
  TrainConfig f = load_train_config(write_yaml("freeze.yaml", std::string(kGood) + "finetuning_type: freeze\n"),
                                    {"freeze_trainable_layers=-3", "freeze_trainable_modules=mlp,self_attn",
                                     "freeze_extra_modules=[embed_tokens, norm]"});
  EXPECT_EQ(f.finetuning_type, "freeze");
  EXPECT_EQ(f.freeze_trainable_layers, -3);
  EXPECT_EQ(f.freeze_trainable_modules, (std::vector<std::string>{"mlp", "self_attn"}));
  EXPECT_EQ(f.freeze_extra_modules, (std::vector<std::string>{"embed_tokens", "norm"}));
  TrainConfig d = load_train_config(write_yaml("freeze2.yaml", std::string(kGood) + "finetuning_type: freeze\n"));
  EXPECT_EQ(d.freeze_trainable_layers, 2);  // LLaMA-Factory's defaults
  EXPECT_EQ(d.freeze_trainable_modules, (std::vector<std::string>{"all"}));
  EXPECT_TRUE(d.freeze_extra_modules.empty());
  expect_error(std::string(kGood) + "freeze_trainable_layers: 4\n", {},
               {"freeze_trainable_layers", "finetuning_type: freeze", "full"});
  expect_error(std::string(kGood) + "finetuning_type: freeze\n", {"freeze_trainable_layers=0"},
               {"freeze_trainable_layers", "0"});
  expect_error(std::string(kGood) + "finetuning_type: qlora\n", {}, {"finetuning_type", "qlora", "full, freeze"});
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// LLaMA-Factory's LoRA keys and defaults (alpha 2 x rank), and the keys of another method refused by name.
TEST(TrainConfig, LoraKeys) {
  TrainConfig c = load_train_config(write_yaml("lora.yaml", std::string(kGood) + "finetuning_type: lora\n"),
                                    {"lora_rank=16", "lora_target=q_proj,v_proj", "use_rslora=true",
                                     "lora_dropout=0.05", "additional_target=embed_tokens",
                                     "adapter_name_or_path=a1,a2", "create_new_adapter=true"});
  EXPECT_EQ(c.finetuning_type, "lora");
  EXPECT_EQ(c.lora_rank, 16);
  EXPECT_TRUE(std::isnan(c.lora_alpha));  // unset: 2 x lora_rank where it is used
  EXPECT_EQ(c.lora_target, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_TRUE(c.use_rslora);
  EXPECT_DOUBLE_EQ(c.lora_dropout, 0.05);
  EXPECT_EQ(c.additional_target, (std::vector<std::string>{"embed_tokens"}));
  EXPECT_EQ(c.adapter_name_or_path, (std::vector<std::string>{"a1", "a2"}));
  EXPECT_TRUE(c.create_new_adapter);
  TrainConfig d = load_train_config(write_yaml("lora2.yaml", std::string(kGood) + "finetuning_type: lora\n"));
  EXPECT_EQ(d.lora_rank, 8);
  EXPECT_EQ(d.lora_target, (std::vector<std::string>{"all"}));
  expect_error(std::string(kGood) + "lora_rank: 4\n", {}, {"lora_rank", "finetuning_type: lora", "full"});
  expect_error(std::string(kGood) + "finetuning_type: freeze\n", {"additional_target=norm"},
               {"additional_target", "finetuning_type: lora", "freeze"});
  expect_error(std::string(kGood) + "finetuning_type: lora\n", {"lora_dropout=1"}, {"lora_dropout", "below 1"});
  expect_error(std::string(kGood) + "finetuning_type: lora\n", {"lora_rank=0"}, {"lora_rank", "at least 1"});
  expect_error(std::string(kGood) + "finetuning_type: lora\nlora_rnak: 4\n", {}, {"lora_rnak", "lora_rank"});
}

}  // namespace
}  // namespace lt
