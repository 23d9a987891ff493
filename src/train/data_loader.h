// train/data_loader.h — tokenised examples -> batches: shuffling by seed, epochs, padding, packing, and
// a cursor that resumes exactly.
//
// Legend: B rows per batch, T tokens per row, n examples, U units per epoch.
//
// Units. The loader deals out units: an example each, or with packing a packed row of several. Packing
// is done once, when the loader is built: the examples in a seeded shuffled order (the seed's own
// stream, not an epoch's) go greedily into rows of row_len tokens (next fit: an example that does not
// fit in the current row starts the next one). So a row boundary is a function of the seed and data
// only, every epoch has the same U and steps, and the learning-rate schedule knows the run's length
// up front. (LLaMA-Factory also packs once, at preprocessing.) Each epoch then deals the units in a
// permutation derived from (seed, epoch) — a Fisher-Yates shuffle with lt::Rng, O(U) at the start of
// an epoch — B units per batch; the last batch of an epoch is smaller (LastBatch::keep) or skipped.
// Order::sequential keeps the data's order for both packing and dealing.
//
// Cursor (epoch, position): the units of `epoch` already dealt. seek() rebuilds the epoch's
// permutation and continues from there: no data is re-read or re-tokenised, and the batches that
// follow are bit for bit those an uninterrupted loader would have given. The fingerprint (data key,
// seed, order, packing, row_len, U) makes seek() refuse a cursor of other data or another order;
// batch size and padding may change across a resume (the position counts units, not batches).
//
// A batch (model/batch.h): input_ids and labels [B, T], right-padded with pad_id (the tokenizer's pad,
// Qwen's <|endoftext|>) and label -100. T is the longest row, rounded up to pad_to_multiple
// (PadTo::longest), or row_len (PadTo::fixed). labels[t] = ids[t] where the token is trainable, -100
// elsewhere, and -100 at the first token of every document: transformers' causal-LM shift makes
// labels[t] the target of position t-1, so in a packed row this keeps the last token of one document
// from being trained to predict the first of the next (DataCollatorWithFlattening does the same); in
// an unpacked row it changes nothing. Packed batches also carry positions [B, T] (restarting at 0 per
// document) and doc_ids [B, T] (0, 1, ... per row), so attention never crosses documents; the padding
// after the last document is one more document. Unpacked batches leave both empty (plain causal
// attention: right padding is never attended to by the real tokens before it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/batch.h"
#include "train/data_tokenize.h"

namespace lt {

enum class Order { shuffled, sequential };
enum class Packing { off, on };
enum class PadTo { longest, fixed };
enum class LastBatch { keep, drop };

struct LoaderOptions {
  int64_t batch_size = 1;  // B: rows per batch (per_device_train_batch_size)
  uint64_t seed = 42;
  Order order = Order::shuffled;
  Packing packing = Packing::off;
  int64_t row_len = 0;          // packing: tokens per packed row (cutoff_len); PadTo::fixed: T
  PadTo pad_to = PadTo::longest;
  int64_t pad_to_multiple = 1;  // PadTo::longest: T rounded up to a multiple of this
  int32_t pad_id = -1;          // required; see default_pad_id
  LastBatch last_batch = LastBatch::keep;
};

// The tokenizer's pad token (tokenizer_config.json pad_token), else its EOS. Throws when it has neither.
int32_t default_pad_id(const Tokenizer& tokenizer);

struct Cursor {
  int64_t epoch = 0;         // the epoch being dealt
  int64_t position = 0;      // units of it already dealt, 0..U
  uint64_t fingerprint = 0;  // of the data and order; 0 = not checked by seek()

  bool operator==(const Cursor&) const = default;
  // {"epoch": 1, "position": 40, "fingerprint": "00ff..."} (hex, so 64 bits survive any JSON reader).
  nlohmann::json to_json() const;
  static Cursor from_json(const nlohmann::json& j, const std::string& source);
};

struct PackStats {
  int64_t rows = 0;    // units with packing (packed rows), else examples
  int64_t tokens = 0;  // tokens of all examples
  // tokens / (rows * row_len): how full packed rows are (1 without packing).
  double fill = 1.0;
};

class DataLoader {
 public:
  // Throws lt::Error on options that cannot work (batch_size < 1, no pad_id, packing without row_len,
  // an example longer than row_len, fewer units than one batch with LastBatch::drop, an empty dataset).
  DataLoader(TokenizedDataset data, LoaderOptions options);

  // The next batch; rolls over into the next epoch after the last batch of one.
  Batch next();

  Cursor cursor() const { return {epoch_, position_, fingerprint_}; }
  // Throws lt::Error for a cursor of other data/order (fingerprint) or a position outside [0, U].
  void seek(const Cursor& cursor);

  int64_t units_per_epoch() const { return int64_t(unit_begin_.size()) - 1; }
  int64_t steps_per_epoch() const;
  // epoch + position / U, for logs (LLaMA-Factory's "epoch").
  double epoch_progress() const;
  const PackStats& pack_stats() const { return pack_stats_; }
  // The examples of a unit, in row order (one without packing).
  std::span<const int64_t> unit_examples(int64_t unit) const;
  const TokenizedDataset& data() const { return data_; }
  const LoaderOptions& options() const { return options_; }

 private:
  void start_epoch(int64_t epoch);
  int64_t unit_tokens(int64_t unit) const;

  TokenizedDataset data_;
  LoaderOptions options_;
  std::vector<int64_t> unit_begin_;    // [U + 1] into unit_members_
  std::vector<int64_t> unit_members_;  // [n] example indices, unit by unit
  PackStats pack_stats_;
  uint64_t fingerprint_ = 0;
  int64_t epoch_ = 0, position_ = 0;
  int64_t order_epoch_ = -1;           // the epoch order_ was built for
  std::vector<int64_t> order_;         // [U] this epoch's unit order
};

}  // namespace lt
