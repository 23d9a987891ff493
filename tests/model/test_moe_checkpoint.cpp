// MoE checkpoints on disk. Save → load → save gives the same files byte for byte and the same slabs for every expert
// layout — Qwen3-MoE one tensor per expert and fused (transformers 5.x), Qwen3.5-MoE with its shared expert, GPT-OSS's
// fused input-major experts with biases — in f32 and bf16, sharded. A released GPT-OSS directory's MXFP4 experts load
// as their values onto the per-expert entries (gate_up_proj's even rows the gate, odd rows the up) and save in bf16
// without quantization_config, from which they load again bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/mxfp4.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "testing/exec_testing.h"
#include "testing/model_testing.h"

namespace lt {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Every file of a directory by name, with its bytes.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_bytes(e.path());
  return out;
}

void expect_same_slabs(const ModelSlabs& got, const ModelSlabs& want) {
  const auto a = got.named_tensors(), b = want.named_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_EQ(a[t].hf_name, b[t].hf_name);
    EXPECT_EQ(0, std::memcmp(a[t].view.data, b[t].view.data, a[t].view.bytes())) << a[t].hf_name;
  }
}

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "lt_moe_checkpoint_" + name;
  fs::remove_all(d);
  return d;
}

TEST(MoeCheckpoint, SaveLoadSaveIsByteForByte) {
  struct Case {
    std::string name;
    ModelConfig cfg;
    bool fused;
  };
  Rng rng(77);
  const std::vector<Case> cases = {{"qwen3_moe", testing::random_moe_config(rng), false},
                                   {"qwen3_moe_fused", testing::random_moe_config(rng), true},
                                   {"qwen3_5_moe", testing::random_hybrid_moe_config(rng), false},
                                   {"gpt_oss", testing::random_gpt_oss_config(rng), false}};
  for (const Case& c : cases)
    for (const DType dt : {DType::f32, DType::bf16}) {
      const std::string what = c.name + "_" + std::string(dtype_name(dt));
      SCOPED_TRACE(what);
      const ModelSlabs params = testing::random_model_params(c.cfg, 5);
      SavedExtras extras;
      extras.fused_experts = c.fused;
      const std::string d1 = fresh_dir(what + "_1"), d2 = fresh_dir(what + "_2");
      save_hf_model(params, d1, dt, size_t(4) << 10, extras);  // small shards: the index too
      const LoadedModel m = load_hf_model(d1);
      ModelConfig want = c.cfg;
      want.torch_dtype = dt;  // config.json records the files' dtype
      EXPECT_EQ(m.config, want);
      if (c.cfg.type != ModelType::gpt_oss) EXPECT_EQ(m.extras.fused_experts, c.fused);  // GPT-OSS: always fused
      if (dt == DType::f32) expect_same_slabs(m.params, params);
      save_hf_model(m.params, d2, dt, size_t(4) << 10, m.extras);
      const auto first = files_of(d1), second = files_of(d2);
      EXPECT_GT(first.size(), 2u);  // config.json, the index and its shards
      EXPECT_TRUE(first == second) << "the second save's files differ from the first's";
      expect_same_slabs(load_hf_model(d2).params, m.params);
    }
}

TEST(GptOssCheckpoint, Mxfp4ExpertsLoadAsTheirValuesAndSaveAsBf16) {
  Rng rng(91);
  ModelConfig cfg = testing::random_gpt_oss_config(rng);
  cfg.hidden_size = 32, cfg.moe_intermediate_size = 64;  // MXFP4 blocks of 32 inputs
  const int64_t E = cfg.num_experts, C = cfg.hidden_size, Ie = cfg.moe_intermediate_size;
  const std::string dir = fresh_dir("mxfp4"), saved = fresh_dir("mxfp4_saved");
  save_hf_model(testing::random_model_params(cfg, 3), dir, DType::bf16, size_t(1) << 30);
  // The released form: the expert matrices as seeded blocks and scales (scales 2^-7 .. 2^-2), the config marked.
  NamedTensors kept;
  const SafetensorsFile file = SafetensorsFile::open(dir + "/model.safetensors");
  for (const std::string& n : file.names())
    if (!n.ends_with("mlp.experts.gate_up_proj") && !n.ends_with("mlp.experts.down_proj")) kept[n] = file.view(n);
  struct Quantized {
    std::string name;
    int64_t rows, cols;
    std::vector<uint8_t> blocks, scales;
  };
  std::vector<Quantized> q;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (const auto& [name, rows, cols] : {std::tuple{std::string("gate_up_proj"), 2 * Ie, C},
                                           std::tuple{std::string("down_proj"), C, Ie}}) {
      Quantized x{"model.layers." + std::to_string(l) + ".mlp.experts." + name, rows, cols, {}, {}};
      x.blocks.resize(size_t(E * rows * cols / 2));
      x.scales.resize(size_t(E * rows * cols / 32));
      for (uint8_t& b : x.blocks) b = uint8_t(rng.below(256));
      for (uint8_t& s : x.scales) s = uint8_t(120 + rng.below(6));
      q.push_back(std::move(x));
    }
  for (Quantized& x : q) {
    kept[x.name + "_blocks"] = TensorView::contiguous(x.blocks.data(), DType::u8, {E, x.rows, x.cols / 32, 16});
    kept[x.name + "_scales"] = TensorView::contiguous(x.scales.data(), DType::u8, {E, x.rows, x.cols / 32});
  }
  write_safetensors(dir + "/model.tmp.safetensors", kept);
  fs::rename(dir + "/model.tmp.safetensors", dir + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(read_bytes(dir + "/config.json"));
  config["quantization_config"] = {{"quant_method", "mxfp4"}};
  std::ofstream(dir + "/config.json") << config.dump(2);

  const LoadedModel m = load_hf_model(dir);
  ASSERT_TRUE(m.config.mxfp4_experts);
  std::vector<float> want;
  for (const Quantized& x : q) {
    const int64_t l = std::stoll(x.name.substr(std::strlen("model.layers.")));
    want.resize(size_t(x.rows * x.cols));
    for (int64_t e = 0; e < E; ++e) {
      mxfp4_dequantize(want.data(), x.blocks.data() + e * x.rows * x.cols / 2,
                       x.scales.data() + e * x.rows * x.cols / 32, x.rows, x.cols, x.name);
      auto entry = [&](const char* n) {
        return m.params.tensor(SlabKind::layer, l, "mlp.experts." + std::to_string(e) + "." + n).ptr<float>();
      };
      if (x.name.ends_with("down_proj")) {  // rows are down's output features: [C, Ie]
        EXPECT_EQ(0, std::memcmp(entry("down_proj.weight"), want.data(), want.size() * 4)) << x.name << " " << e;
        continue;
      }
      for (int64_t i = 0; i < Ie; ++i) {
        EXPECT_EQ(0, std::memcmp(entry("gate_proj.weight") + i * C, want.data() + 2 * i * C, size_t(C) * 4));
        EXPECT_EQ(0, std::memcmp(entry("up_proj.weight") + i * C, want.data() + (2 * i + 1) * C, size_t(C) * 4));
      }
    }
  }
  // Saved in bf16 (every MXFP4 value is exact there) without the quantization: the same slabs again.
  save_hf_model(m.params, saved, DType::bf16, size_t(1) << 30, m.extras);
  EXPECT_FALSE(nlohmann::json::parse(read_bytes(saved + "/config.json")).contains("quantization_config"));
  const LoadedModel back = load_hf_model(saved);
  EXPECT_FALSE(back.config.mxfp4_experts);
  expect_same_slabs(back.params, m.params);
}

// A data-parallel rank's load (load_hf_model's `only`): each GPT-OSS expert entry gets exactly the elements its range
// names — the full load's values there, nothing written elsewhere — from fused bf16 files (MXFP4 goes through the
// same per-entry store, model/weights.cpp).
TEST(GptOssCheckpoint, ARanksLoadReadsOnlyItsRangesOfEachExpert) {
  Rng rng(93);
  ModelConfig cfg = testing::random_gpt_oss_config(rng);
  cfg.hidden_size = 32, cfg.moe_intermediate_size = 32;
  const std::string dir = fresh_dir("ranges");
  save_hf_model(testing::random_model_params(cfg, 4), dir, DType::bf16, size_t(1) << 30);
  const LoadedModel full = load_hf_model(dir);
  TensorRanges only;
  for (const auto& t : full.params.named_tensors()) {  // a third of each tensor, from a seeded start
    const int64_t n = t.view.numel(), begin = int64_t(rng.below(uint64_t(n)));
    only[t.hf_name] = ElementRange{begin, std::min(n, begin + std::max<int64_t>(1, n / 3))};
  }
  const LoadedModel part = load_hf_model(dir, &only);
  const auto a = part.params.named_tensors(), b = full.params.named_tensors();
  int64_t in_range = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    const ElementRange r = only.at(a[t].hf_name);
    const float *got = a[t].view.ptr<float>(), *want = b[t].view.ptr<float>();
    for (int64_t i = 0; i < a[t].view.numel(); ++i) {
      const bool inside = i >= r.begin && i < r.end;
      if (inside) {
        ++in_range;
        ASSERT_EQ(got[i], want[i]) << a[t].hf_name << " element " << i;
      } else if (want[i] != 0 && a[t].hf_name.find(".experts.") != std::string::npos) {
        ASSERT_NE(got[i], want[i]) << a[t].hf_name << " element " << i << " outside the rank's range was written";
      }
    }
  }
  EXPECT_GT(in_range, 0);
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// A frozen run's load (model/weights.h load_hf_model_by_slab): a pass per slab — per layer, or the layers together
// for fused experts — gives every tensor and the extras as the whole load does.
TEST(LoadBySlab, EveryTensorAsTheWholeLoad) {
  Rng rng(41);
  struct Case {
    std::string name;
    ModelConfig cfg;
    bool fused;
  };
  const std::vector<Case> cases = {{"dense", testing::random_config(rng), false},
                                   {"hybrid", testing::random_hybrid_config(rng), false},
                                   {"moe_fused", testing::random_moe_config(rng), true},
                                   {"gpt_oss", testing::random_gpt_oss_config(rng), false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SavedExtras extras;
    extras.fused_experts = c.fused;
    const std::string dir = fresh_dir("by_slab_" + c.name);
    save_hf_model(testing::random_model_params(c.cfg, 7), dir, DType::bf16, size_t(8) << 10, extras);
    const LoadedModel whole = load_hf_model(dir);
    ModelSlabs got(whole.config, DType::f32, Fill::zero);
    std::vector<std::pair<SlabKind, int64_t>> seen;
    SavedExtras got_extras;
    load_hf_model_by_slab(dir, [&](const ModelSlabs& pass, SlabKind kind, int64_t layer) {
      copy_slab_by_name(got, pass, kind, layer);
      seen.emplace_back(kind, layer);
    }, &got_extras);
    expect_same_slabs(got, whole.params);
    EXPECT_EQ(seen.size(), size_t(whole.config.num_layers + 2));  // every slab once
    EXPECT_EQ(got_extras.fused_experts, whole.extras.fused_experts);
    EXPECT_EQ(got_extras.keep_f32, whole.extras.keep_f32);
  }
}

}  // namespace
}  // namespace lt
