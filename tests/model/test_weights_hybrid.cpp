// Tests for model/weights.h on the Qwen3.5 / Qwen3.6 hybrid checkpoints the PyTorch reference writes
// (tests/reference/torch_reference.py make): both forms load (bf16-stored, sharded); the vision-language form's
// untrained tensors (model.visual.*, mtp.*) are carried raw; save -> load -> save keeps them byte for byte, keeps
// A_log and the gated norm F32 in a bf16 save and every trained tensor exact; damaged shards are named in the
// error; and init_random follows transformers' Qwen3.5 init while leaving the other models' draws unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "testing/files_testing.h"
#include "testing/model_testing.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

// The running test's fresh scratch directory, removed with what it holds when the test ends.
class ScratchDir {
 public:
  ScratchDir() : path_(testing::fresh_test_dir("lt_weights_hybrid_")) {}
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
    fs::remove(fs::path(path_).parent_path(), ignored);  // the per-process folder, once empty
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

// A tiny hybrid checkpoint (linear, full, linear layers) stored bf16 with A_log and the gated norm F32, as
// released checkpoints are. arch: "qwen3_5" (text form) or "qwen3_5_vl" (vision-language form, visual + mtp).
void make_reference_model(const std::string& arch, const std::string& out, int shards) {
  const std::string cmd = std::string("/usr/bin/python3 ") + LT_SOURCE_DIR +
                          "/tests/reference/torch_reference.py make --arch " + arch + " --out " + out +
                          " --seed 3 --layers 3 --layer-types linear,full,linear --hidden 40 --heads 4 --kv-heads 2"
                          " --head-dim 12 --partial-rotary-factor 0.5 --intermediate 72 --vocab 101"
                          " --linear-key-heads 2 --linear-value-heads 4 --linear-key-dim 12 --linear-value-dim 10"
                          " --batch 2 --seq 40 --dtype bfloat16 --shards " +
                          std::to_string(shards) + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed (needs /usr/bin/python3 with torch): " << cmd;
}

std::vector<uint8_t> bytes_of(const TensorView& v) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  return {p, p + v.bytes()};
}

// The names A_log and linear_attn.norm.weight take in layers 0 and 2 (the linear-attention layers).
std::set<std::string> f32_stored_names(const std::string& prefix) {
  std::set<std::string> out;
  for (int layer : {0, 2})
    for (const char* t : {"linear_attn.A_log", "linear_attn.norm.weight"})
      out.insert(prefix + "layers." + std::to_string(layer) + "." + t);
  return out;
}

// Every trained tensor of a and b holds the same f32 bits.
void expect_params_equal(const ModelSlabs& a, const ModelSlabs& b) {
  const auto A = a.named_tensors(), B = b.named_tensors();
  ASSERT_EQ(A.size(), B.size());
  for (size_t i = 0; i < A.size(); ++i) {
    ASSERT_EQ(A[i].hf_name, B[i].hf_name);
    EXPECT_EQ(0, std::memcmp(A[i].view.data, B[i].view.data, A[i].view.bytes())) << A[i].hf_name;
  }
}

// The carried tensors of `m` are exactly `dir`'s model.visual.* and mtp.* tensors, byte for byte.
void expect_carried_as_in(const LoadedModel& m, const std::string& dir) {
  SafetensorsModel files = SafetensorsModel::open_dir(dir);
  std::vector<std::string> untrained;
  for (const auto& n : files.names())
    if (n.starts_with("model.visual.") || n.starts_with("mtp.")) untrained.push_back(n);
  ASSERT_EQ(m.extras.carried.size(), untrained.size());
  for (size_t i = 0; i < untrained.size(); ++i) {
    const RawTensor& r = m.extras.carried[i];
    const TensorView v = files.view(untrained[i]);
    EXPECT_EQ(r.name, untrained[i]);
    EXPECT_EQ(r.dtype, v.dtype) << r.name;
    EXPECT_EQ(r.shape, v.shape) << r.name;
    EXPECT_EQ(r.bytes, bytes_of(v)) << r.name;
  }
}

TEST(HybridWeights, VisionLanguageFormLoadsAndCarriesTheUntrainedTensors) {
  const ScratchDir scratch;
  const std::string dir = scratch.str() + "/vl";
  make_reference_model("qwen3_5_vl", dir, 2);
  LoadedModel m = load_hf_model(dir);
  EXPECT_TRUE(m.config.vision_language);
  EXPECT_EQ(m.config.type, ModelType::qwen3_5);
  EXPECT_EQ(m.config.torch_dtype, DType::bf16);

  // The trained tensors are the checkpoint's, under model.language_model.: bf16 widens to f32 exactly.
  SafetensorsModel files = SafetensorsModel::open_dir(dir);
  for (const auto& t : m.params.named_tensors()) {
    EXPECT_TRUE(t.hf_name == "lm_head.weight" || t.hf_name.starts_with("model.language_model.")) << t.hf_name;
    std::vector<float> want(size_t(t.view.numel()));
    files.read_f32(t.hf_name, want.data(), t.view.shape);
    EXPECT_EQ(0, std::memcmp(want.data(), t.view.data, t.view.bytes())) << t.hf_name;
  }
  expect_carried_as_in(m, dir);
  bool visual = false, mtp = false;
  for (const RawTensor& r : m.extras.carried) {
    EXPECT_TRUE(is_untrained_tensor(m.config, r.name)) << r.name;
    visual |= r.name.starts_with("model.visual.");
    mtp |= r.name.starts_with("mtp.");
  }
  EXPECT_TRUE(visual && mtp) << "the reference writes both a vision tower and an MTP head";
  EXPECT_EQ(m.extras.keep_f32, f32_stored_names("model.language_model."));
}

TEST(HybridWeights, TextFormLoadsWithNothingCarried) {
  const ScratchDir scratch;
  const std::string dir = scratch.str() + "/text";
  make_reference_model("qwen3_5", dir, 1);
  LoadedModel m = load_hf_model(dir);
  EXPECT_FALSE(m.config.vision_language);
  EXPECT_TRUE(m.extras.carried.empty());
  EXPECT_EQ(m.extras.keep_f32, f32_stored_names("model."));
  for (const auto& t : m.params.named_tensors())
    EXPECT_TRUE(t.hf_name == "lm_head.weight" || t.hf_name.starts_with("model.layers.") ||
                t.hf_name == "model.embed_tokens.weight" || t.hf_name == "model.norm.weight")
        << t.hf_name;
}

TEST(HybridWeights, UntrainedTensorsAreQwen35VisualAndMtpOnly) {
  ModelConfig hybrid;
  hybrid.type = ModelType::qwen3_5;
  EXPECT_TRUE(is_untrained_tensor(hybrid, "model.visual.blocks.0.attn.qkv.weight"));
  EXPECT_TRUE(is_untrained_tensor(hybrid, "mtp.fc.weight"));
  EXPECT_FALSE(is_untrained_tensor(hybrid, "model.language_model.visual.x"));
  EXPECT_FALSE(is_untrained_tensor(hybrid, "model.language_model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(is_untrained_tensor(hybrid, "lm_head.weight"));
  for (ModelType t : {ModelType::qwen2, ModelType::qwen3, ModelType::llama}) {
    ModelConfig c;
    c.type = t;
    EXPECT_FALSE(is_untrained_tensor(c, "model.visual.patch_embed.proj.weight"));
    EXPECT_FALSE(is_untrained_tensor(c, "mtp.fc.weight"));
  }
}

// Loads `a`, saves it (bf16, small shards) to b, loads b and saves that to c: b and c hold every tensor with the
// same dtype and bytes, the trained ones equal to a's, the carried ones equal to a's file bytes.
void check_round_trip(const std::string& arch, const std::string& root) {
  const std::string a = root + "/a", b = root + "/b", c = root + "/c";
  make_reference_model(arch, a, 2);
  LoadedModel ma = load_hf_model(a);
  const size_t shard = size_t(16) << 10;  // several shards: carried tensors go into shards and the index too
  save_hf_model(ma.params, b, DType::bf16, shard, ma.extras);
  LoadedModel mb = load_hf_model(b);
  EXPECT_EQ(mb.config, ma.config);
  EXPECT_EQ(mb.config.vision_language, ma.config.vision_language);
  expect_params_equal(ma.params, mb.params);  // bf16 -> f32 -> bf16 is exact
  expect_carried_as_in(mb, a);
  EXPECT_EQ(mb.extras.keep_f32, ma.extras.keep_f32);

  SafetensorsModel fb = SafetensorsModel::open_dir(b);
  EXPECT_GT(fb.num_files(), size_t(1));
  EXPECT_TRUE(fs::exists(b + "/" + kSafetensorsIndexName));
  const std::set<std::string> keep = f32_stored_names(hf_prefix(ma.config));
  for (const auto& t : mb.params.named_tensors())
    EXPECT_EQ(fb.info(t.hf_name).dtype, keep.count(t.hf_name) ? DType::f32 : DType::bf16) << t.hf_name;
  const nlohmann::json index = read_json_file(b + "/" + kSafetensorsIndexName);
  for (const RawTensor& r : ma.extras.carried) EXPECT_TRUE(index["weight_map"].contains(r.name)) << r.name;

  save_hf_model(mb.params, c, DType::bf16, shard, mb.extras);
  SafetensorsModel fc = SafetensorsModel::open_dir(c);
  ASSERT_EQ(fb.names(), fc.names());
  for (const auto& n : fb.names()) {
    EXPECT_EQ(fb.info(n).dtype, fc.info(n).dtype) << n;
    EXPECT_EQ(bytes_of(fb.view(n)), bytes_of(fc.view(n))) << n;
  }
  EXPECT_EQ(read_file(b + "/config.json"), read_file(c + "/config.json"));

  // An f32 save is exact too, and carries the same bytes; everything is F32 there.
  const std::string d = root + "/d";
  save_hf_model(ma.params, d, DType::f32, shard, ma.extras);
  LoadedModel md = load_hf_model(d);
  ModelConfig want = ma.config;
  want.torch_dtype = DType::f32;
  EXPECT_EQ(md.config, want);
  expect_params_equal(ma.params, md.params);
  expect_carried_as_in(md, a);
  EXPECT_TRUE(md.extras.keep_f32.empty());
}

TEST(HybridWeights, VisionLanguageSaveLoadSaveKeepsEveryTensor) {
  const ScratchDir scratch;
  check_round_trip("qwen3_5_vl", scratch.str());
}

TEST(HybridWeights, TextFormSaveLoadSaveKeepsEveryTensor) {
  const ScratchDir scratch;
  check_round_trip("qwen3_5", scratch.str());
}

TEST(HybridWeights, DamagedOrMissingShardOfCarriedTensorsIsNamed) {
  const ScratchDir scratch;
  const std::string root = scratch.str();
  const std::string src = root + "/src", dir = root + "/saved";
  make_reference_model("qwen3_5_vl", src, 1);
  LoadedModel m = load_hf_model(src);
  save_hf_model(m.params, dir, DType::bf16, size_t(16) << 10, m.extras);
  const nlohmann::json index = read_json_file(dir + "/" + kSafetensorsIndexName);
  const std::string shard = index["weight_map"]["mtp.fc.weight"].get<std::string>();
  const std::string path = dir + "/" + shard;
  const std::string good = read_file(path);

  // Truncated: the data area ends before the tensors the header lists.
  write_file_atomic(path, good.substr(0, good.size() / 2));
  std::string msg = error_of([&] { load_hf_model(dir); });
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("reach outside the data area"), std::string::npos) << msg;

  // A garbage header.
  write_file_atomic(path, std::string(64, '\x7f'));
  msg = error_of([&] { load_hf_model(dir); });
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;

  // Missing: the index maps tensors to a file that is not there.
  fs::remove(path);
  msg = error_of([&] { load_hf_model(dir); });
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  // The shard is back but without mtp.fc.weight, which the index still maps to it.
  write_file_atomic(path, good);
  SafetensorsFile f = SafetensorsFile::open(path);
  NamedTensors kept;
  for (const auto& n : f.names())
    if (n != "mtp.fc.weight") kept[n] = f.view(n);
  write_safetensors(path + ".new", kept);
  fs::rename(path + ".new", path);
  msg = error_of([&] { load_hf_model(dir); });
  EXPECT_NE(msg.find("mtp.fc.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not contain it"), std::string::npos) << msg;

  // Saving carried bytes that do not match their dtype and shape is refused.
  m.extras.carried[0].bytes.pop_back();
  msg = error_of([&] { save_hf_model(m.params, root + "/bad", DType::bf16, size_t(1) << 30, m.extras); });
  EXPECT_NE(msg.find(m.extras.carried[0].name), std::string::npos) << msg;
}

TEST(HybridWeights, InitRandomFollowsTransformersQwen35Init) {
  const ScratchDir scratch;
  const std::string dir = scratch.str() + "/vl";
  make_reference_model("qwen3_5_vl", dir, 1);
  const ModelConfig cfg = load_model_config(dir);
  ModelSlabs p(cfg);
  init_random(p, 11, 0.02f);
  int a_logs = 0, dt_biases = 0, zero_norms = 0, gated_norms = 0, matrices = 0;
  for (const auto& t : p.named_tensors()) {
    const float* x = t.view.ptr<float>();
    const int64_t n = t.view.numel();
    auto all = [&](float v) {
      for (int64_t i = 0; i < n; ++i)
        if (x[i] != v) return false;
      return true;
    };
    const std::string& name = t.hf_name;
    if (name.ends_with("linear_attn.A_log")) {
      ++a_logs;
      std::set<float> distinct(x, x + n);
      EXPECT_EQ(distinct.size(), size_t(n)) << name;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_GE(x[i], std::log(0.01f)) << name;
        EXPECT_LT(x[i], std::log(16.f)) << name;
      }
    } else if (name.ends_with("linear_attn.dt_bias")) {
      ++dt_biases;
      EXPECT_TRUE(all(1.f)) << name;
    } else if (name.ends_with("linear_attn.norm.weight")) {
      ++gated_norms;
      EXPECT_TRUE(all(1.f)) << name;
    } else if (name.find("norm") != std::string::npos) {  // zero-centred: the model scales by 1 + w
      ++zero_norms;
      EXPECT_TRUE(all(0.f)) << name;
    } else {  // matrices and conv1d: N(0, std)
      ++matrices;
      double sum2 = 0;
      for (int64_t i = 0; i < n; ++i) sum2 += double(x[i]) * x[i];
      const double rms = std::sqrt(sum2 / double(n));
      EXPECT_NEAR(rms, 0.02, 0.02 * 0.5) << name;  // n >= 40 samples: the rms is within 50% of std
    }
  }
  EXPECT_EQ(a_logs, 2);
  EXPECT_EQ(dt_biases, 2);
  EXPECT_EQ(gated_norms, 2);
  EXPECT_EQ(zero_norms, 3 * 2 + 2 + 1);  // two per layer, q/k norm of the full layer, the final norm
  EXPECT_GT(matrices, 0);

  // It saves and loads as a model directory (what `lazytrain init` writes).
  const std::string out = scratch.str() + "/init";
  save_hf_model(p, out, DType::f32, size_t(1) << 30);
  expect_params_equal(p, load_hf_model(out).params);
}

// The other models draw as they always did: one normal per matrix/bias-free element in named_tensors() order,
// norm weights 1, biases 0 — bit for bit the same values for the same seed.
TEST(HybridWeights, InitRandomOfOtherModelsIsUnchanged) {
  for (ModelType type : {ModelType::qwen2, ModelType::qwen3, ModelType::llama}) {
    ModelConfig cfg = testing::small_model_config(type);
    cfg.o_bias = type == ModelType::llama;
    ModelSlabs p(cfg);
    init_random(p, 5, 0.03f);
    Rng rng(5);
    for (const auto& t : p.named_tensors()) {
      const bool is_norm = t.hf_name.find("norm") != std::string::npos;
      const bool is_bias = t.hf_name.ends_with(".bias");
      const float* x = t.view.ptr<float>();
      for (int64_t i = 0; i < t.view.numel(); ++i) {
        const float want = is_norm ? 1.f : is_bias ? 0.f : float(rng.normal() * 0.03f);
        ASSERT_EQ(x[i], want) << t.hf_name << "[" << i << "] of " << model_type_name(type);
      }
    }
  }
}

// init_random draws in parallel chunks of 2^16 values, each generator jumped to its chunk's first draw: the
// same bits as the reference's one sequential generator, for a model whose tensors span several chunks and for
// a hybrid (A_log's one draw per value, dt_bias and norms' none, between normal tensors).
TEST(HybridWeights, InitRandomInChunksIsTheSequentialDraw) {
  ModelConfig big = testing::small_model_config(ModelType::qwen3);
  big.hidden_size = 256, big.intermediate_size = 704, big.vocab_size = 1001;  // embedding: 4 chunks
  const ScratchDir scratch;
  make_reference_model("qwen3_5_vl", scratch.str() + "/vl", 1);
  for (const ModelConfig& cfg : {big, load_model_config(scratch.str() + "/vl")}) {
    ModelSlabs fast(cfg), reference(cfg);
    init_random(fast, 9, 0.05f);
    init_random_reference(reference, 9, 0.05f);
    expect_params_equal(fast, reference);
  }
}

}  // namespace
}  // namespace lt
