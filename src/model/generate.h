// model/generate.h — greedy decoding with a KV cache, on the host, for evaluation and `lazytrain generate`.
//
// The prompt is run through every block at once (block_forward, the training kernels) and each layer's
// keys and values (after q/k-norm and RoPE) are kept; then one token at a time: the new token's q, k, v,
// attention over the cache, the MLP, the head's argmax. The f32 master weights are used.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace lt {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these (it is included)
};

// Greedy continuation of `prompt` (ids). Returns the new tokens only.
std::vector<int32_t> generate_greedy(const ModelSlabs& params, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& options);

}  // namespace lt
