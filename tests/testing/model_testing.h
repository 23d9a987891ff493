// tests/testing/model_testing.h — small decoder models for tests: a config with the flags each
// architecture implies (transformers' semantics) and seeded random weights of a useful scale.
#pragma once

#include <cstdint>
#include <string>

#include "core/rng.h"
#include "model/weights.h"

namespace lt::testing {

struct SmallShape {
  int64_t vocab = 61, hidden = 32, intermediate = 40, layers = 2, heads = 4, kv_heads = 2, head_dim = 8;
  bool tied = false;
  int64_t max_positions = 256;
};

// Qwen2: q/k/v biases; Qwen3: q/k norms; Llama: no biases (set the flags after for variants).
inline ModelConfig small_model_config(ModelType type, SmallShape s = {}) {
  ModelConfig c;
  c.type = type;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.qkv_bias = type == ModelType::qwen2;
  c.qk_norm = type == ModelType::qwen3;
  c.tie_word_embeddings = s.tied;
  c.max_position_embeddings = s.max_positions;
  return c;
}

// Matrices and biases N(0, matrix_std); norm weights 1 + N(0, norm_std) — never exactly one, so the
// norm-weight gradients are exercised.
inline ModelSlabs random_model_params(const ModelConfig& cfg, uint64_t seed, double matrix_std = 0.2,
                                      double norm_std = 0.1) {
  ModelSlabs p(cfg);
  Rng rng(seed);
  for (auto& t : p.named_tensors()) {
    float* d = t.view.ptr<float>();
    const bool norm = t.hf_name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < t.view.numel(); ++i)
      d[i] = norm ? float(1.0 + norm_std * rng.normal()) : float(matrix_std * rng.normal());
  }
  return p;
}

}  // namespace lt::testing
