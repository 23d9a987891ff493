#include "train/data_loader.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "ops/head.h"

namespace lt {

namespace {

constexpr uint64_t kPackStream = 0x7061636b696e67ull;  // "packing": the packing order's own stream

std::vector<int64_t> identity(int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t(0));
  return p;
}

// 0..n-1 shuffled by Fisher-Yates (Rng::below's modulo bias is below 2^-40 for n < 2^24, and is the
// same on every platform, which is what matters here).
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p = identity(n);
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t(rng.below(uint64_t(i + 1)))]);
  return p;
}

uint64_t hash_u64(uint64_t h, uint64_t v) { return fnv1a64(&v, sizeof v, h); }

}  // namespace

int32_t default_pad_id(const Tokenizer& tokenizer) {
  const SpecialTokenIds& s = tokenizer.special_ids();
  if (s.pad) return *s.pad;
  LT_CHECK(s.eos, "{}: the tokenizer has neither a pad_token nor an eos_token (tokenizer_config.json) to pad with",
           tokenizer.source());
  return *s.eos;
}

nlohmann::json Cursor::to_json() const {
  return {{"epoch", epoch}, {"position", position}, {"fingerprint", fmt::format("{:016x}", fingerprint)}};
}

Cursor Cursor::from_json(const nlohmann::json& j, const std::string& source) {
  LT_CHECK(j.is_object() && j.contains("epoch") && j["epoch"].is_number_integer() && j.contains("position") &&
               j["position"].is_number_integer() && j.contains("fingerprint") && j["fingerprint"].is_string(),
           "{}: a data cursor is {{\"epoch\": int, \"position\": int, \"fingerprint\": hex string}}, got {}", source,
           j.dump());
  Cursor c;
  c.epoch = j["epoch"].get<int64_t>();
  c.position = j["position"].get<int64_t>();
  std::string hex = j["fingerprint"].get<std::string>();
  size_t used = 0;
  try {
    c.fingerprint = std::stoull(hex, &used, 16);
  } catch (const std::exception&) {
    used = 0;
  }
  LT_CHECK(!hex.empty() && used == hex.size(), "{}: data cursor fingerprint '{}' is not a hex number", source, hex);
  return c;
}

DataLoader::DataLoader(TokenizedDataset data, LoaderOptions options) : data_(std::move(data)), options_(options) {
  const LoaderOptions& o = options_;
  const int64_t n = data_.size();
  LT_CHECK(n > 0, "the data loader has no examples");
  LT_CHECK(o.batch_size >= 1, "batch_size must be at least 1 (got {})", o.batch_size);
  LT_CHECK(o.pad_id >= 0, "the data loader needs a pad id (got {}); see default_pad_id", o.pad_id);
  LT_CHECK(o.pad_to_multiple >= 1, "pad_to_multiple must be at least 1 (got {})", o.pad_to_multiple);
  const bool packed = o.packing == Packing::on;
  if (packed || o.pad_to == PadTo::fixed) {
    LT_CHECK(o.row_len >= 2, "{} needs row_len (cutoff_len) of at least 2 (got {})",
             packed ? "packing" : "padding to a fixed length", o.row_len);
    LT_CHECK_LE(data_.max_length(), o.row_len, "the longest example does not fit in a row of row_len tokens");
  }

  // Units: one example each, or examples packed greedily (next fit) in the packing order.
  const std::vector<int64_t> pack_order =
      o.order == Order::shuffled && packed ? permutation(n, splitmix64(o.seed ^ kPackStream)) : identity(n);
  unit_members_ = pack_order;
  unit_begin_.push_back(0);
  int64_t fill = 0;
  for (int64_t k = 0; k < n; ++k) {
    int64_t len = data_.length(pack_order[size_t(k)]);
    if (k > 0 && (!packed || fill + len > o.row_len)) {
      unit_begin_.push_back(k);
      fill = 0;
    }
    fill += len;
  }
  unit_begin_.push_back(n);

  const int64_t U = units_per_epoch();
  pack_stats_.rows = U;
  pack_stats_.tokens = data_.total_tokens();
  pack_stats_.fill = packed ? double(pack_stats_.tokens) / (double(U) * double(o.row_len)) : 1.0;
  LT_CHECK(o.last_batch == LastBatch::keep || U >= o.batch_size,
           "{} {} but batch_size is {}: with the last partial batch dropped there would be no batch", U,
           packed ? "packed rows" : "examples", o.batch_size);

  uint64_t h = hash_u64(data_.key(), o.seed);
  h = hash_u64(h, uint64_t(o.order));
  h = hash_u64(h, uint64_t(o.packing));
  h = hash_u64(h, packed ? uint64_t(o.row_len) : 0);
  fingerprint_ = hash_u64(h, uint64_t(U));
  start_epoch(0);
}

void DataLoader::start_epoch(int64_t epoch) {
  if (order_epoch_ == epoch) return;
  const int64_t U = units_per_epoch();
  if (options_.order == Order::shuffled) {
    // splitmix64 spreads (seed, epoch) over the whole state: neighbouring epochs (or seeds) start Rng from distant
    // streams.
    order_ = permutation(U, splitmix64(options_.seed ^ splitmix64(uint64_t(epoch))));
  } else {
    order_ = identity(U);
  }
  order_epoch_ = epoch;
}

int64_t DataLoader::steps_per_epoch() const {
  const int64_t U = units_per_epoch(), B = options_.batch_size;
  return options_.last_batch == LastBatch::keep ? (U + B - 1) / B : U / B;
}

double DataLoader::epoch_progress() const { return double(epoch_) + double(position_) / double(units_per_epoch()); }

std::span<const int64_t> DataLoader::unit_examples(int64_t unit) const {
  LT_CHECK(unit >= 0 && unit < units_per_epoch(), "unit {} is outside [0, {})", unit, units_per_epoch());
  size_t b = size_t(unit_begin_[size_t(unit)]), e = size_t(unit_begin_[size_t(unit) + 1]);
  return {unit_members_.data() + b, e - b};
}

int64_t DataLoader::unit_tokens(int64_t unit) const {
  int64_t t = 0;
  for (int64_t ex : unit_examples(unit)) t += data_.length(ex);
  return t;
}

void DataLoader::seek(const Cursor& c) {
  LT_CHECK(c.fingerprint == 0 || c.fingerprint == fingerprint_,
           "the data cursor (fingerprint {:016x}) belongs to other data or another shuffle/packing setting (this "
           "loader's is {:016x}): resuming with it would not continue the same order",
           c.fingerprint, fingerprint_);
  LT_CHECK(c.epoch >= 0 && c.position >= 0 && c.position <= units_per_epoch(),
           "data cursor (epoch {}, position {}) is outside an epoch of {} units", c.epoch, c.position,
           units_per_epoch());
  epoch_ = c.epoch;
  position_ = c.position;
  start_epoch(epoch_);
}

Batch DataLoader::next() {
  const int64_t U = units_per_epoch();
  const LoaderOptions& o = options_;
  if (position_ >= U || (o.last_batch == LastBatch::drop && U - position_ < o.batch_size)) {
    ++epoch_;
    position_ = 0;
  }
  start_epoch(epoch_);
  const int64_t rows = std::min(o.batch_size, U - position_);
  std::span<const int64_t> units(order_.data() + position_, size_t(rows));
  position_ += rows;

  int64_t longest = 0;
  for (int64_t u : units) longest = std::max(longest, unit_tokens(u));
  const int64_t T = o.pad_to == PadTo::fixed ? o.row_len
                                               : (longest + o.pad_to_multiple - 1) / o.pad_to_multiple * o.pad_to_multiple;
  const bool packed = o.packing == Packing::on;

  Batch b;
  b.B = rows;
  b.T = T;
  b.input_ids.assign(size_t(rows * T), o.pad_id);  // [B, T]
  b.labels.assign(size_t(rows * T), kIgnoreIndex);  // [B, T]
  if (packed) {
    b.doc_ids.assign(size_t(rows * T), 0);    // [B, T]
    b.positions.assign(size_t(rows * T), 0);  // [B, T]
  }
  for (int64_t r = 0; r < rows; ++r) {
    const size_t row = size_t(r * T);
    int64_t t0 = 0, doc = 0;
    for (int64_t ex : unit_examples(units[size_t(r)])) {
      std::span<const int32_t> ids = data_.ids(ex);
      std::span<const uint8_t> train = data_.trainable(ex);
      for (size_t t = 0; t < ids.size(); ++t) {
        const size_t at = row + size_t(t0) + t;
        b.input_ids[at] = ids[t];
        b.labels[at] = t > 0 && train[t] ? ids[t] : kIgnoreIndex;
        if (packed) {
          b.doc_ids[at] = int32_t(doc);
          b.positions[at] = int32_t(t);
        }
      }
      t0 += int64_t(ids.size());
      ++doc;
    }
    if (packed) {  // the padding is one more document, so it attends only to itself
      for (int64_t t = t0; t < T; ++t) {
        b.doc_ids[row + size_t(t)] = int32_t(doc);
        b.positions[row + size_t(t)] = int32_t(t - t0);
      }
    }
    if (t0 < T) {  // padding: the attention mask's 0s (the MoE load-balancing loss leaves them out)
      if (b.attention_mask.empty()) b.attention_mask.assign(size_t(rows * T), 1);
      std::fill(b.attention_mask.begin() + std::ptrdiff_t(row) + t0, b.attention_mask.begin() + std::ptrdiff_t(row) + T,
                uint8_t(0));
    }
  }
  return b;
}

}  // namespace lt
