// tests/optim/optim_testing.h — helpers shared by the optimizer tests: the PyTorch reference script, temporary
// directories, raw f32 files, the vector paths this CPU has, and brute-force nearest codes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/weights.h"
#include "optim/kernels.h"
#include "optim/quant_map.h"
#include "testing/grad_check.h"
#include "testing/model_testing.h"

namespace lt::testing {

// Runs tests/optim/torch_optim_reference.py with Debian's interpreter (python3-torch); fails the test when
// it cannot run: the comparison with PyTorch is part of the suite, never skipped.
inline bool run_torch_reference(const std::string& args) {
  const std::string cmd =
      std::string("/usr/bin/python3 ") + LT_SOURCE_DIR + "/tests/optim/torch_optim_reference.py " + args;
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "the PyTorch reference failed (needs /usr/bin/python3 with torch and numpy): " << cmd;
  return rc == 0;
}

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("lt_optim_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline void write_f32(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  const auto bytes = size_t(f.tellg());
  std::vector<float> v(bytes / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(bytes));
  return v;
}

template <typename T>
bool bits_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The vector paths this CPU can run (plain always).
inline std::vector<VectorPath> available_paths() {
  std::vector<VectorPath> paths = {VectorPath::plain};
  const CpuFeatures& f = cpu_features();
  if (f.avx2 && f.fma) paths.push_back(VectorPath::avx2);
  if (f.avx512f && f.avx512bw && f.avx512vl && f.fma) {
    paths.push_back(VectorPath::avx512);
    if (f.avx512vbmi) paths.push_back(VectorPath::avx512_vbmi);
  }
  return paths;
}

// argmin_c |x - Q[c]| over all 256 codes in long double (exact for the candidates near x), ties to the lower.
inline uint8_t brute_force_nearest(const QuantMap& q, float x) {
  int best = 0;
  long double best_d = std::fabs((long double)x - (long double)q[0]);
  for (int c = 1; c < 256; ++c) {
    const long double d = std::fabs((long double)x - (long double)q[size_t(c)]);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return uint8_t(best);
}

// A small Qwen2-style model whose slabs mix every kind of tensor: 8-bit states for q/o/gate/up/down
// (>= 4096 elements) and the untied lm_head, f32 for k/v (2048 elements), norms, biases and the embedding.
inline ModelConfig tiny_model_config() {
  return small_model_config(ModelType::qwen2, {.vocab = 97, .hidden = 64, .intermediate = 96, .layers = 3,
                                               .head_dim = 16, .max_positions = 128});
}

// Fills every gradient slab of `grads` with seeded values of scale `scale`, never zero.
inline void random_grads(ModelSlabs& grads, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  for (auto& t : grads.named_tensors()) {
    float* g = t.view.ptr<float>();
    for (int64_t i = 0; i < t.view.numel(); ++i) g[i] = float(rng.normal()) * scale + 1e-6f;
  }
}

}  // namespace lt::testing
