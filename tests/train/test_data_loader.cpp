// The data loader on synthetic examples: padding (longest, multiple, fixed), labels (-100 on prompts,
// padding and document starts), seeded shuffling per epoch, the last partial batch, packing (rows,
// positions, doc ids, next-fit boundaries), the cursor (resume bit for bit, JSON, refusals), and a
// packed batch through the model giving the same loss and gradients as the same examples unpacked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "testing/files_testing.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "testing/model_testing.h"
#include "train/data_loader.h"

namespace lt {
namespace {

constexpr int32_t kPad = 999;

using testing::error_of;

// n examples with lengths in [min_len, max_len]: ids[0] = the example's index (so a row tells which
// example it holds), the rest random below `vocab`; a prompt of random length, maybe none (not
// trainable), then an answer (trainable).
std::vector<TokenizedChat> make_examples(int64_t n, int64_t min_len, int64_t max_len, uint64_t seed, int64_t vocab = 900) {
  Rng rng(seed);
  std::vector<TokenizedChat> out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t len = min_len + int64_t(rng.below(uint64_t(max_len - min_len + 1)));
    // Some examples are trained from their first token, so the first-label rule is exercised.
    int64_t prompt = int64_t(rng.below(uint64_t(len - 1)));
    TokenizedChat t;
    for (int64_t k = 0; k < len; ++k) {
      t.ids.push_back(k == 0 ? int32_t(i % vocab) : int32_t(rng.below(uint64_t(vocab))));
      t.trainable.push_back(k >= prompt ? 1 : 0);
    }
    out.push_back(std::move(t));
  }
  return out;
}

// The first token of each document in a batch row (packed: per doc id; else the row's first token).
std::vector<int32_t> row_docs(const Batch& b, int64_t r) {
  std::vector<int32_t> out;
  for (int64_t t = 0; t < b.T; ++t) {
    size_t at = size_t(r * b.T + t);
    bool start = b.doc_ids.empty() ? t == 0 : (b.positions[at] == 0 && b.input_ids[at] != kPad);
    if (start) out.push_back(b.input_ids[at]);
  }
  return out;
}

// Checks a batch's rows against the examples they hold: ids, labels, positions, doc ids, padding (the attention
// mask's 0s, present when any row has padding).
void check_batch(const Batch& b, const DataLoader& loader, const std::vector<TokenizedChat>& ex) {
  const bool packed = loader.options().packing == Packing::on;
  ASSERT_EQ(b.input_ids.size(), size_t(b.N()));
  ASSERT_EQ(b.labels.size(), size_t(b.N()));
  ASSERT_EQ(b.doc_ids.size(), packed ? size_t(b.N()) : 0u);
  ASSERT_EQ(b.positions.size(), packed ? size_t(b.N()) : 0u);
  bool padded = false;
  for (int64_t r = 0; r < b.B; ++r) {
    int64_t t = 0;
    int32_t doc = 0;
    for (int32_t first : row_docs(b, r)) {
      const TokenizedChat& e = ex[size_t(first)];
      for (size_t k = 0; k < e.ids.size(); ++k, ++t) {
        size_t at = size_t(r * b.T + t);
        ASSERT_EQ(b.input_ids[at], e.ids[k]);
        // -100 where not trained and at every document's first token.
        ASSERT_EQ(b.labels[at], k > 0 && e.trainable[k] ? e.ids[k] : -100) << "row " << r << " t " << t;
        if (!b.attention_mask.empty()) ASSERT_EQ(b.attention_mask[at], 1) << "row " << r << " t " << t;
        if (packed) {
          ASSERT_EQ(b.positions[at], int32_t(k));
          ASSERT_EQ(b.doc_ids[at], doc);
        }
      }
      ++doc;
    }
    for (int64_t p = t; p < b.T; ++p) {  // padding
      size_t at = size_t(r * b.T + p);
      padded = true;
      ASSERT_EQ(b.input_ids[at], kPad);
      ASSERT_EQ(b.labels[at], -100);
      ASSERT_EQ(b.attention_mask.size(), size_t(b.N())) << "padding without an attention mask";
      ASSERT_EQ(b.attention_mask[at], 0) << "row " << r << " t " << p;
      if (packed) {
        ASSERT_EQ(b.doc_ids[at], doc);
        ASSERT_EQ(b.positions[at], int32_t(p - t));
      }
    }
  }
  if (!padded) ASSERT_TRUE(b.attention_mask.empty()) << "an attention mask without padding";
}

TEST(DataLoader, PadsToTheLongestRoundedUpToAMultiple) {
  auto ex = make_examples(7, 2, 30, 1);
  DataLoader loader(TokenizedDataset::from_examples(ex),
                    {.batch_size = 3, .order = Order::sequential, .pad_to_multiple = 8, .pad_id = kPad});
  for (int step = 0; step < 3; ++step) {
    Batch b = loader.next();
    ASSERT_EQ(b.B, step < 2 ? 3 : 1);
    int64_t longest = 0;
    for (int64_t r = 0; r < b.B; ++r) longest = std::max(longest, int64_t(ex[size_t(step * 3 + r)].ids.size()));
    EXPECT_EQ(b.T, (longest + 7) / 8 * 8);
    for (int64_t r = 0; r < b.B; ++r) EXPECT_EQ(row_docs(b, r), std::vector<int32_t>{int32_t(step * 3 + r)});
    check_batch(b, loader, ex);
  }
  DataLoader exact(TokenizedDataset::from_examples(ex), {.batch_size = 7, .order = Order::sequential, .pad_id = kPad});
  int64_t longest = 0;
  for (const auto& e : ex) longest = std::max(longest, int64_t(e.ids.size()));
  EXPECT_EQ(exact.next().T, longest);
}

TEST(DataLoader, PadsToAFixedLength) {
  auto ex = make_examples(5, 2, 20, 2);
  DataLoader loader(TokenizedDataset::from_examples(ex), {.batch_size = 2, .order = Order::sequential, .row_len = 24,
                                                          .pad_to = PadTo::fixed, .pad_id = kPad});
  Batch b = loader.next();
  EXPECT_EQ(b.T, 24);
  check_batch(b, loader, ex);
  std::string e = error_of([&] {
    DataLoader(TokenizedDataset::from_examples(ex), {.row_len = 10, .pad_to = PadTo::fixed, .pad_id = kPad});
  });
  EXPECT_NE(e.find("the longest example does not fit in a row of row_len tokens"), std::string::npos) << e;
}

// The example order of one epoch, read from the batches' first tokens.
std::vector<int32_t> epoch_order(DataLoader& loader) {
  std::vector<int32_t> order;
  for (int64_t s = 0; s < loader.steps_per_epoch(); ++s) {
    Batch b = loader.next();
    for (int64_t r = 0; r < b.B; ++r)
      for (int32_t d : row_docs(b, r)) order.push_back(d);
  }
  return order;
}

TEST(DataLoader, ShufflesEveryExampleOncePerEpochBySeed) {
  auto ex = make_examples(37, 2, 12, 3);
  auto data = TokenizedDataset::from_examples(ex);
  DataLoader a(data, {.batch_size = 4, .seed = 7, .pad_id = kPad});
  DataLoader b(data, {.batch_size = 4, .seed = 7, .pad_id = kPad});
  DataLoader c(data, {.batch_size = 4, .seed = 8, .pad_id = kPad});
  std::vector<int32_t> all(37);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int32_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int32_t> oa = epoch_order(a);
    std::vector<int32_t> sorted = oa;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all) << "epoch " << e;
    EXPECT_EQ(epoch_order(b), oa) << "same seed, same order";
    EXPECT_NE(epoch_order(c), oa) << "another seed, another order";
    EXPECT_NE(oa, all) << "shuffled";
    epochs.push_back(oa);
    EXPECT_EQ(a.cursor().epoch, e);
    EXPECT_EQ(a.cursor().position, 37);
    EXPECT_DOUBLE_EQ(a.epoch_progress(), e + 1.0);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  DataLoader seq(data, {.batch_size = 5, .order = Order::sequential, .pad_id = kPad});
  EXPECT_EQ(epoch_order(seq), all);
  EXPECT_EQ(epoch_order(seq), all);
}

TEST(DataLoader, LastPartialBatchIsKeptOrDropped) {
  auto data = TokenizedDataset::from_examples(make_examples(10, 2, 5, 4));
  DataLoader keep(data, {.batch_size = 4, .pad_id = kPad});
  EXPECT_EQ(keep.steps_per_epoch(), 3);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 4; ++i) sizes.push_back(keep.next().B);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2, 4}));
  DataLoader drop(data, {.batch_size = 4, .pad_id = kPad, .last_batch = LastBatch::drop});
  EXPECT_EQ(drop.steps_per_epoch(), 2);
  sizes.clear();
  for (int i = 0; i < 3; ++i) sizes.push_back(drop.next().B);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(drop.cursor().epoch, 1);
  EXPECT_EQ(drop.cursor().position, 4);
  std::string e = error_of([&] { DataLoader(data, {.batch_size = 11, .pad_id = kPad, .last_batch = LastBatch::drop}); });
  EXPECT_NE(e.find("10 examples but batch_size is 11"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { DataLoader(data, {.batch_size = 0, .pad_id = kPad}); }).find("batch_size must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(data, {}); }).find("needs a pad id"), std::string::npos);
}

TEST(DataLoader, PacksGreedilyIntoRowsWithPositionsAndDocIds) {
  auto ex = make_examples(200, 2, 40, 5);
  auto data = TokenizedDataset::from_examples(ex);
  const int64_t row_len = 64;
  DataLoader loader(data, {.batch_size = 3, .seed = 11, .packing = Packing::on, .row_len = row_len, .pad_id = kPad});
  const int64_t U = loader.units_per_epoch();
  EXPECT_LT(U, 200);
  // Every example in exactly one row; rows fit; next fit: a row ends only when the next example does
  // not fit in it.
  std::vector<int64_t> seen;
  for (int64_t u = 0; u < U; ++u) {
    int64_t tokens = 0;
    for (int64_t e : loader.unit_examples(u)) {
      tokens += data.length(e);
      seen.push_back(e);
    }
    EXPECT_LE(tokens, row_len);
    if (u + 1 < U) {
      EXPECT_GT(tokens + data.length(loader.unit_examples(u + 1)[0]), row_len) << "unit " << u;
    }
  }
  std::vector<int64_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 200; ++i) ASSERT_EQ(sorted[size_t(i)], i);
  EXPECT_NE(seen, sorted) << "packed in a shuffled order";
  EXPECT_EQ(loader.pack_stats().rows, U);
  EXPECT_EQ(loader.pack_stats().tokens, data.total_tokens());
  EXPECT_NEAR(loader.pack_stats().fill, double(data.total_tokens()) / double(U * row_len), 1e-12);
  EXPECT_GT(loader.pack_stats().fill, 0.7);

  // Batches: documents in row order, positions restart, labels -100 at each document's first token.
  std::vector<int32_t> order;
  for (int64_t s = 0; s < loader.steps_per_epoch(); ++s) {
    Batch b = loader.next();
    check_batch(b, loader, ex);
    if (::testing::Test::HasFatalFailure()) return;
    for (int64_t r = 0; r < b.B; ++r)
      for (int32_t d : row_docs(b, r)) order.push_back(d);
  }
  std::sort(order.begin(), order.end());
  EXPECT_EQ(std::vector<int64_t>(order.begin(), order.end()), sorted);

  // The same seed packs the same rows; another packs others; rows stay the same across epochs.
  DataLoader same(data, {.batch_size = 3, .seed = 11, .packing = Packing::on, .row_len = row_len, .pad_id = kPad});
  DataLoader other(data, {.batch_size = 3, .seed = 12, .packing = Packing::on, .row_len = row_len, .pad_id = kPad});
  bool all_same = true, any_other = false;
  for (int64_t u = 0; u < U; ++u) {
    auto a = loader.unit_examples(u), b = same.unit_examples(u);
    all_same = all_same && std::equal(a.begin(), a.end(), b.begin(), b.end());
    if (u < other.units_per_epoch()) {
      auto c = other.unit_examples(u);
      any_other = any_other || !std::equal(a.begin(), a.end(), c.begin(), c.end());
    }
  }
  EXPECT_TRUE(all_same);
  EXPECT_TRUE(any_other);
}

TEST(DataLoader, PackingFixedLengthAndSequentialOrder) {
  auto ex = make_examples(30, 2, 10, 6);
  DataLoader loader(TokenizedDataset::from_examples(ex), {.batch_size = 2, .order = Order::sequential,
                                                          .packing = Packing::on, .row_len = 16, .pad_to = PadTo::fixed,
                                                          .pad_id = kPad});
  int32_t next = 0;
  for (int64_t s = 0; s < loader.steps_per_epoch(); ++s) {
    Batch b = loader.next();
    EXPECT_EQ(b.T, 16);
    check_batch(b, loader, ex);
    for (int64_t r = 0; r < b.B; ++r)
      for (int32_t d : row_docs(b, r)) EXPECT_EQ(d, next++);
  }
  EXPECT_EQ(next, 30);
  std::string e = error_of([&] { DataLoader(TokenizedDataset::from_examples(ex), {.packing = Packing::on, .pad_id = kPad}); });
  EXPECT_NE(e.find("packing needs row_len"), std::string::npos) << e;
}

void expect_same_batch(const Batch& a, const Batch& b, const std::string& what) {
  EXPECT_EQ(a.B, b.B) << what;
  EXPECT_EQ(a.T, b.T) << what;
  EXPECT_EQ(a.input_ids, b.input_ids) << what;
  EXPECT_EQ(a.labels, b.labels) << what;
  EXPECT_EQ(a.positions, b.positions) << what;
  EXPECT_EQ(a.doc_ids, b.doc_ids) << what;
}

TEST(DataLoader, ResumingFromACursorGivesTheSameBatchesBitForBit) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Rng rng(seed * 977);
    auto data = TokenizedDataset::from_examples(make_examples(20 + int64_t(rng.below(40)), 2, 30, seed));
    LoaderOptions o{.batch_size = 1 + int64_t(rng.below(5)), .seed = seed, .pad_id = kPad};
    o.packing = seed % 2 ? Packing::on : Packing::off;
    o.row_len = 48;
    o.last_batch = seed % 3 == 0 ? LastBatch::drop : LastBatch::keep;
    o.pad_to_multiple = seed % 4 == 0 ? 8 : 1;
    DataLoader first(data, o);
    // Up to three epochs before the cursor is saved, so it may sit at an epoch's end or start.
    int64_t n = int64_t(rng.below(uint64_t(3 * first.steps_per_epoch() + 1)));
    int64_t m = 1 + int64_t(rng.below(uint64_t(2 * first.steps_per_epoch() + 1)));
    std::string what = fmt::format("seed {} n {} m {}", seed, n, m);
    for (int64_t i = 0; i < n; ++i) first.next();
    Cursor saved = Cursor::from_json(nlohmann::json::parse(first.cursor().to_json().dump()), "checkpoint");
    EXPECT_EQ(saved, first.cursor()) << what;
    std::vector<Batch> expected;
    for (int64_t i = 0; i < m; ++i) expected.push_back(first.next());

    DataLoader resumed(data, o);
    resumed.seek(saved);
    for (int64_t i = 0; i < m; ++i) expect_same_batch(resumed.next(), expected[size_t(i)], what + " batch " + std::to_string(i));
    EXPECT_EQ(resumed.cursor(), first.cursor()) << what;
  }
}

TEST(DataLoader, SeekRefusesACursorOfOtherDataOrOrder) {
  auto ex = make_examples(20, 2, 10, 8);
  auto data = TokenizedDataset::from_examples(ex);
  DataLoader a(data, {.batch_size = 2, .seed = 1, .pad_id = kPad});
  a.next();
  Cursor c = a.cursor();
  // Batch size and padding may change across a resume; the order may not.
  DataLoader bigger(data, {.batch_size = 4, .seed = 1, .pad_to_multiple = 8, .pad_id = kPad});
  bigger.seek(c);
  EXPECT_EQ(bigger.cursor().position, 2);
  DataLoader other_seed(data, {.batch_size = 2, .seed = 2, .pad_id = kPad});
  EXPECT_NE(error_of([&] { other_seed.seek(c); }).find("belongs to other data or another shuffle/packing setting"),
            std::string::npos);
  ex[3].ids[1] ^= 1;
  DataLoader other_data(TokenizedDataset::from_examples(ex), {.batch_size = 2, .seed = 1, .pad_id = kPad});
  EXPECT_NE(error_of([&] { other_data.seek(c); }).find("belongs to other data"), std::string::npos);
  DataLoader packed(data, {.batch_size = 2, .seed = 1, .packing = Packing::on, .row_len = 32, .pad_id = kPad});
  EXPECT_NE(error_of([&] { packed.seek(c); }).find("belongs to other data"), std::string::npos);
  EXPECT_NE(error_of([&] { a.seek({0, 21, c.fingerprint}); }).find("outside an epoch of 20 units"), std::string::npos);
  a.seek({3, 20, 0});  // fingerprint 0: not checked; the end of epoch 3 rolls into epoch 4
  a.next();
  EXPECT_EQ(a.cursor().epoch, 4);
  EXPECT_EQ(a.cursor().position, 2);
}

TEST(DataLoader, CursorJson) {
  Cursor c{3, 17, 0xfedcba9876543210ull};
  nlohmann::json j = c.to_json();
  EXPECT_EQ(j["fingerprint"], "fedcba9876543210");
  EXPECT_EQ(Cursor::from_json(j, "ckpt"), c);
  EXPECT_NE(error_of([] { Cursor::from_json(nlohmann::json::parse(R"({"epoch": 1})"), "ckpt/state.json"); })
                .find("ckpt/state.json: a data cursor is"),
            std::string::npos);
  EXPECT_NE(error_of([] { Cursor::from_json(nlohmann::json::parse(R"({"epoch": 1, "position": 2, "fingerprint": "xyz"})"), "s"); })
                .find("is not a hex number"),
            std::string::npos);
}

// A small model for the packed-vs-unpacked check.
ModelConfig tiny_qwen3() { return testing::small_model_config(ModelType::qwen3); }

ModelSlabs random_params(const ModelConfig& cfg, uint64_t seed) { return testing::random_model_params(cfg, seed); }

TEST(DataLoader, PackedBatchGivesTheUnpackedLossAndGradients) {
  ModelConfig cfg = tiny_qwen3();
  ModelSlabs params = random_params(cfg, 5);
  const int32_t pad = int32_t(cfg.vocab_size) - 1;  // no example uses it, so padding is recognisable
  auto ex = make_examples(40, 3, 20, 9, pad);
  DataLoader packed(TokenizedDataset::from_examples(ex),
                    {.batch_size = 2, .seed = 3, .packing = Packing::on, .row_len = 48, .pad_id = pad});
  for (int step = 0; step < 3; ++step) {
    Batch pb = packed.next();
    // The examples this packed batch holds (a document's first id is its index), one per row.
    std::vector<TokenizedChat> docs;
    for (int64_t r = 0; r < pb.B; ++r)
      for (int64_t t = 0; t < pb.T; ++t) {
        size_t i = size_t(r * pb.T + t);
        if (pb.positions[i] == 0 && pb.input_ids[i] != pad) docs.push_back(ex[size_t(pb.input_ids[i])]);
      }
    ASSERT_GE(docs.size(), 3u);
    DataLoader flat(TokenizedDataset::from_examples(docs),
                    {.batch_size = int64_t(docs.size()), .order = Order::sequential, .pad_id = pad});
    Batch ub = flat.next();
    ASSERT_TRUE(ub.doc_ids.empty());
    ModelSlabs gp(cfg), gu(cfg);
    LossResult lp = model_forward_backward(gp, params, pb, ComputeType::f32);
    LossResult lu = model_forward_backward(gu, params, ub, ComputeType::f32);
    ASSERT_EQ(lp.tokens, lu.tokens) << "step " << step;
    // f32 throughout; the two batches sum the same per-token losses in another order and run GEMMs of
    // other shapes, so agreement is to f32 rounding over a few hundred terms, not bitwise.
    EXPECT_NEAR(lp.loss_sum, lu.loss_sum, 1e-5 * std::abs(lu.loss_sum)) << "step " << step;
    // The control: without doc ids attention crosses documents and the loss moves.
    Batch crossing = pb;
    crossing.doc_ids.clear();
    EXPECT_GT(std::abs(model_forward(params, crossing, ComputeType::f32).loss_sum - lu.loss_sum),
              1e-3 * std::abs(lu.loss_sum))
        << "step " << step;
    auto P = gp.named_tensors(), Q = gu.named_tensors();
    for (size_t k = 0; k < P.size(); ++k) {
      const float* a = P[k].view.ptr<float>();
      const float* b = Q[k].view.ptr<float>();
      double max_abs = 0, max_diff = 0;
      for (int64_t i = 0; i < P[k].view.numel(); ++i) {
        max_abs = std::max(max_abs, double(std::abs(b[i])));
        max_diff = std::max(max_diff, double(std::abs(a[i] - b[i])));
      }
      EXPECT_LE(max_diff, 1e-4 * max_abs + 1e-7) << P[k].hf_name << " step " << step;
    }
  }
}

}  // namespace
}  // namespace lt
