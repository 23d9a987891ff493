#include "model/batch.h"

#include "core/error.h"
#include "io/json_file.h"
#include "ops/head.h"

namespace lt {
namespace {

std::vector<int32_t> read_rows(const nlohmann::json& j, const char* key, const std::string& source, int64_t vocab,
                               bool allow_ignore, int64_t* rows, int64_t* cols) {
  LT_CHECK(j.contains(key), "{}: missing \"{}\" (expected a list of equal-length rows of token ids)", source, key);
  const auto& v = j.at(key);
  LT_CHECK(v.is_array() && !v.empty(), "{}: \"{}\" must be a non-empty list of rows", source, key);
  std::vector<int32_t> out;
  *rows = int64_t(v.size());
  *cols = -1;
  for (size_t r = 0; r < v.size(); ++r) {
    const auto& row = v[r];
    LT_CHECK(row.is_array() && !row.empty(), "{}: {}[{}] must be a non-empty list of token ids", source, key, r);
    if (*cols < 0) *cols = int64_t(row.size());
    LT_CHECK(int64_t(row.size()) == *cols, "{}: {}[{}] has {} tokens but row 0 has {} (rows must have equal length)",
             source, key, r, row.size(), *cols);
    for (size_t c = 0; c < row.size(); ++c) {
      LT_CHECK(row[c].is_number_integer(), "{}: {}[{}][{}] is not an integer", source, key, r, c);
      int64_t id = row[c].get<int64_t>();
      bool ok = (id >= 0 && id < vocab) || (allow_ignore && id == kIgnoreIndex);
      LT_CHECK(ok, "{}: {}[{}][{}] = {} is outside the vocabulary [0, {}){}", source, key, r, c, id, vocab,
               allow_ignore ? " and is not -100" : "");
      out.push_back(int32_t(id));
    }
  }
  return out;
}

// attention_mask [B, T]: 0 or 1, each row's 1s first (right padding only: our attention is causal, so a token
// never reads the padding after it, as transformers' mask would hide it), no counted label on a padding position.
void read_attention_mask(Batch& b, const nlohmann::json& j, const std::string& source) {
  int64_t rows, cols;
  const std::vector<int32_t> m = read_rows(j, "attention_mask", source, INT32_MAX, false, &rows, &cols);
  LT_CHECK(rows == b.B && cols == b.T, "{}: attention_mask is {}x{} but input_ids are {}x{}", source, rows, cols,
           b.B, b.T);
  b.attention_mask.resize(m.size());
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = 0; t < b.T; ++t) {
      const size_t n = size_t(r * b.T + t);
      LT_CHECK(m[n] == 0 || m[n] == 1, "{}: attention_mask[{}][{}] = {} (expected 0 or 1)", source, r, t, m[n]);
      LT_CHECK(t == 0 || m[n] <= m[n - 1],
               "{}: attention_mask[{}][{}] is 1 after a 0: only right padding is supported (a row's tokens first)",
               source, r, t);
      LT_CHECK(m[n] == 1 || b.labels[n] == kIgnoreIndex,
               "{}: labels[{}][{}] = {} is counted but attention_mask is 0 there (padding has label -100)", source, r,
               t, b.labels[n]);
      b.attention_mask[n] = uint8_t(m[n]);
    }
}

}  // namespace

Batch Batch::from_json(const nlohmann::json& j, const std::string& source, int64_t vocab) {
  LT_CHECK(j.is_object(), "{}: a batch is a JSON object with \"input_ids\" and \"labels\"", source);
  Batch b;
  b.input_ids = read_rows(j, "input_ids", source, vocab, false, &b.B, &b.T);
  if (j.contains("labels")) {
    int64_t rows, cols;
    b.labels = read_rows(j, "labels", source, vocab, true, &rows, &cols);
    LT_CHECK(rows == b.B && cols == b.T, "{}: labels are {}x{} but input_ids are {}x{}", source, rows, cols, b.B,
             b.T);
  } else {
    b.labels = b.input_ids;
  }
  // Packed rows (several documents per row, as transformers' DataCollatorWithFlattening): positions
  // restart at 0 where a document starts, and attention must not cross documents.
  if (j.contains("position_ids")) {
    int64_t rows, cols;
    b.positions = read_rows(j, "position_ids", source, INT32_MAX, false, &rows, &cols);
    LT_CHECK(rows == b.B && cols == b.T, "{}: position_ids are {}x{} but input_ids are {}x{}", source, rows, cols,
             b.B, b.T);
    b.doc_ids.resize(b.positions.size());
    for (int64_t r = 0; r < b.B; ++r) {
      int32_t doc = 0;
      for (int64_t t = 0; t < b.T; ++t) {
        size_t n = size_t(r * b.T + t);
        if (t > 0 && b.positions[n] == 0) ++doc;
        b.doc_ids[n] = doc;
      }
    }
  }
  if (j.contains("attention_mask")) read_attention_mask(b, j, source);
  return b;
}

Batch Batch::load(const std::string& path, int64_t vocab) {
  return with_json_errors(path, [&] { return from_json(read_json_file(path), path, vocab); });
}

StepTokens StepTokens::make(const Batch& batch) {
  StepTokens s;
  const int64_t N = batch.N();
  s.targets.assign(size_t(N), kIgnoreIndex);
  s.pos.resize(size_t(N));
  for (int64_t b = 0; b < batch.B; ++b)
    for (int64_t t = 0; t < batch.T; ++t) {
      int64_t n = b * batch.T + t;
      s.pos[size_t(n)] = batch.positions.empty() ? int32_t(t) : batch.positions[size_t(n)];
      if (t + 1 < batch.T) s.targets[size_t(n)] = batch.labels[size_t(n + 1)];
      if (s.targets[size_t(n)] != kIgnoreIndex) ++s.count;
    }
  return s;
}

}  // namespace lt
