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
  // [B, T] transformers' attention_mask: 1 = a token, 0 = padding, which only ever follows a row's tokens and
  // has no counted label (so causal attention never reads it for a counted token). Only the MoE load-balancing
  // loss reads it (padding is not routed into its counts); empty = every position a token.
  std::vector<uint8_t> attention_mask;
  // LoRA dropout (model/lora.h): the key this batch's masks are drawn from; the trainer sets it from the seed, the
  // step and the micro-batch, so a resumed run and every plan draw the same masks.
  uint64_t dropout_key = 0;

  int64_t N() const { return B * T; }
  // {"input_ids": [[...], ...], "labels": [[...], ...], "position_ids": [[...], ...]} — rows of equal
  // length; labels default to input_ids; position_ids (optional) mark packed documents, each starting
  // at position 0; attention_mask (optional) 1s then 0s in each row (right padding), the labels -100 at its 0s.
  // Ids are checked against `vocab`; errors name the source, row, column and value.
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
