// model/batch.h — one batch of token rows, and the per-token data every step derives from it.
//
// Labels follow transformers' causal-LM convention: aligned with input_ids, shifted inside (the target
// of token t is labels[t + 1]), -100 ignored, loss = mean over counted tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lt {

struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> input_ids;  // [B, T]
  std::vector<int32_t> labels;     // [B, T], -100 = not counted
  std::vector<int32_t> doc_ids;    // [B, T] when rows pack several documents; empty otherwise
  std::vector<int32_t> positions;  // [B, T] RoPE positions when packing; empty = 0..T-1 per row

  int64_t N() const { return B * T; }
  // {"input_ids": [[...], ...], "labels": [[...], ...], "position_ids": [[...], ...]} — rows of equal
  // length; labels default to input_ids; position_ids (optional) mark packed documents, each starting
  // at position 0. Ids are checked against `vocab`; errors name the source, row, column and value.
  static Batch from_json(const nlohmann::json& j, const std::string& source, int64_t vocab);
  static Batch load(const std::string& path, int64_t vocab);
};

// Per-token arrays derived from a batch, shared by all layers and the head.
struct StepTokens {
  std::vector<int32_t> targets;  // [N] shifted labels, -100 at each row's last token
  std::vector<int32_t> pos;      // [N]
  int64_t count = 0;             // counted targets
  static StepTokens make(const Batch& batch);
};

}  // namespace lt
