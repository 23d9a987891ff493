#include "train/data_tokenize.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "core/parallel.h"
#include "io/json_file.h"
#include "train/data_cache.h"

namespace lt {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Records converted and tokenised together; bounds memory and, with on_bad_example: stop, the work
// done before the first bad record is reported.
constexpr int64_t kChunkRecords = 1024;

// Records tried when detecting a format: the first one that is a JSON object decides.
constexpr size_t kDetectTries = 100;

// Hashes a length-prefixed piece, so that concatenations cannot collide ("ab"+"c" vs "a"+"bc").
uint64_t hash_piece(uint64_t h, std::string_view bytes) {
  uint64_t len = bytes.size();
  h = fnv1a64(&len, sizeof len, h);
  return fnv1a64(bytes.data(), bytes.size(), h);
}

// The tokenizer's files, hashed; nullopt-like 0 with `why` when it was not loaded from a file.
uint64_t tokenizer_hash(const Tokenizer& tok, std::string* why) {
  const fs::path file = tok.source();
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    *why = fmt::format("the tokenizer was not loaded from a file ('{}'), so it cannot be part of a cache key", tok.source());
    return 0;
  }
  uint64_t h = hash_piece(kFnvOffset, read_file(file.string()));
  fs::path config = file.parent_path() / "tokenizer_config.json";
  return hash_piece(h, fs::exists(config) ? read_file(config.string()) : std::string());
}

// What a template does, hashed from a probe rendering (so a custom EOS changes the key too).
uint64_t template_hash(const ChatTemplate& tpl) {
  const std::vector<ChatMessage> probe = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}};
  uint64_t h = hash_piece(kFnvOffset, chat_template_name(tpl.kind()));
  for (const ChatSegment& seg : tpl.render_segments(probe)) h = hash_piece(h, seg.text + (seg.trainable ? "1" : "0"));
  return h;
}

std::string sanitize(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, 64)) out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ? c : '_';
  return out;
}

struct DataFile {
  std::string path;
  std::string bytes;
  std::vector<DataRecord> records;
};

// One record's outcome in a chunk.
struct RecordResult {
  TokenizedChat chat;
  std::string error;
  int64_t line = 0;
};

// Parses, converts and tokenises every record; the store and report for one dataset.
std::shared_ptr<TokenStore> build_store(const std::vector<DataFile>& files, const DatasetSpec& spec,
                                        const Tokenizer& tok, const ChatTemplate& tpl,
                                        const TokenizeOptions& opt, DatasetReport& report) {
  auto store = std::make_shared<TokenStore>();
  store->own_offsets.push_back(0);
  for (const DataFile& f : files) {
    const int64_t n = int64_t(f.records.size());
    for (int64_t begin = 0; begin < n; begin += kChunkRecords) {
      const int64_t count = std::min(kChunkRecords, n - begin);
      std::vector<RecordResult> results(static_cast<size_t>(count));
      parallel_for(count, [&](int64_t k) {
        const DataRecord& rec = f.records[size_t(begin + k)];
        RecordResult& res = results[size_t(k)];
        ConvertedRecord conv = convert_record(rec.text, rec.line, spec);
        if (!conv.error.empty()) {
          res.error = std::move(conv.error);
          res.line = conv.error_line;
          return;
        }
        res.chat = tokenize_conversation(tok, tpl, conv.messages);
      });
      // In record order, so the first bad record is the one reported and counts do not depend on threads.
      for (RecordResult& res : results) {
        ++report.records;
        if (!res.error.empty()) {
          std::string message = fmt::format("{}:{}: {}", f.path, res.line, res.error);
          LT_CHECK(opt.on_bad_example == OnBadExample::skip, "{} (set on_bad_example: skip to skip such records)",
                   message);
          ++report.bad;
          if (report.bad_messages.size() < DatasetReport::kMaxBadMessages) report.bad_messages.push_back(message);
          continue;
        }
        switch (apply_cutoff(res.chat, opt.cutoff_len, opt.overlong)) {
          case CutoffResult::dropped_overlong: ++report.dropped_overlong; continue;
          case CutoffResult::dropped_no_target: ++report.dropped_no_target; continue;
          case CutoffResult::truncated: ++report.truncated; break;
          case CutoffResult::kept: break;
        }
        ++report.examples;
        report.tokens += int64_t(res.chat.ids.size());
        report.trainable_tokens += std::count(res.chat.trainable.begin(), res.chat.trainable.end(), uint8_t(1));
        store->own_ids.insert(store->own_ids.end(), res.chat.ids.begin(), res.chat.ids.end());
        store->own_trainable.insert(store->own_trainable.end(), res.chat.trainable.begin(), res.chat.trainable.end());
        store->own_offsets.push_back(int64_t(store->own_ids.size()));
      }
    }
  }
  store->n = int64_t(store->own_offsets.size()) - 1;
  store->offsets = store->own_offsets.data();
  store->ids = store->own_ids.data();
  store->trainable = store->own_trainable.data();
  return store;
}

// Reads a dataset's files and splits them into records; resolves a `detect` spec from the first record
// that is a JSON object.
std::vector<DataFile> read_dataset(DatasetSpec& spec) {
  std::vector<DataFile> files;
  for (const std::string& path : dataset_files(spec)) {
    DataFile f;
    f.path = path;
    f.bytes = read_file(path);
    f.records = split_records(f.bytes, path);
    files.push_back(std::move(f));
  }
  if (spec.formatting == DataFormatting::detect) {
    const DataFile* first_file = nullptr;
    for (const DataFile& f : files) {
      if (!f.records.empty()) {
        first_file = &f;
        break;
      }
    }
    LT_CHECK(first_file, "dataset '{}': {} holds no records", spec.name, spec.path);
    const DataRecord* pick = &first_file->records[0];
    for (size_t i = 0; i < std::min(kDetectTries, first_file->records.size()); ++i) {
      if (json::parse(first_file->records[i].text, nullptr, false).is_object()) {
        pick = &first_file->records[i];
        break;
      }
    }
    spec = detect_dataset_spec(spec, pick->text, first_file->path, pick->line);
  }
  return files;
}

uint64_t dataset_key(const DatasetSpec& spec, const std::vector<DataFile>& files, uint64_t tok_hash,
                     uint64_t tpl_hash, const TokenizeOptions& opt) {
  uint64_t h = hash_piece(kFnvOffset, fmt::format("lazytrain data cache v{}", kDataCacheVersion));
  h = hash_piece(h, spec.describe());
  bool dir = fs::is_directory(spec.path);
  for (const DataFile& f : files) {
    h = hash_piece(h, dir ? fs::path(f.path).filename().string() : std::string());
    h = hash_piece(h, f.bytes);
  }
  h = fnv1a64(&tok_hash, sizeof tok_hash, h);
  h = fnv1a64(&tpl_hash, sizeof tpl_hash, h);
  return hash_piece(h, fmt::format("cutoff_len={} overlong={} on_bad_example={}", opt.cutoff_len,
                                   opt.overlong == Overlong::truncate ? "truncate" : "drop",
                                   opt.on_bad_example == OnBadExample::stop ? "stop" : "skip"));
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t size, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

Overlong parse_overlong(std::string_view s) {
  if (s == "truncate") return Overlong::truncate;
  if (s == "drop") return Overlong::drop;
  LT_FAIL("overlong: '{}' is not a policy (truncate, drop)", s);
}

OnBadExample parse_on_bad_example(std::string_view s) {
  if (s == "stop") return OnBadExample::stop;
  if (s == "skip") return OnBadExample::skip;
  LT_FAIL("on_bad_example: '{}' is not a policy (stop, skip)", s);
}

std::string_view cache_use_name(CacheUse c) {
  switch (c) {
    case CacheUse::none: return "none";
    case CacheUse::hit: return "hit";
    case CacheUse::built: return "built";
    case CacheUse::rebuilt: return "rebuilt";
  }
  return "?";
}

json DatasetReport::to_json() const {
  return json{{"name", name},
              {"path", path},
              {"records", records},
              {"bad", bad},
              {"truncated", truncated},
              {"dropped_overlong", dropped_overlong},
              {"dropped_no_target", dropped_no_target},
              {"examples", examples},
              {"tokens", tokens},
              {"trainable_tokens", trainable_tokens},
              {"bad_messages", bad_messages}};
}

DatasetReport DatasetReport::from_json(const json& j) {
  DatasetReport r;
  r.name = j.at("name").get<std::string>();
  r.path = j.at("path").get<std::string>();
  r.records = j.at("records").get<int64_t>();
  r.bad = j.at("bad").get<int64_t>();
  r.truncated = j.at("truncated").get<int64_t>();
  r.dropped_overlong = j.at("dropped_overlong").get<int64_t>();
  r.dropped_no_target = j.at("dropped_no_target").get<int64_t>();
  r.examples = j.at("examples").get<int64_t>();
  r.tokens = j.at("tokens").get<int64_t>();
  r.trainable_tokens = j.at("trainable_tokens").get<int64_t>();
  r.bad_messages = j.at("bad_messages").get<std::vector<std::string>>();
  return r;
}

std::string DatasetReport::summary() const {
  std::string s = fmt::format("{} ({}): {} records -> {} examples, {} tokens ({} trained)", name, path, records,
                              examples, tokens, trainable_tokens);
  if (bad) s += fmt::format("; {} bad, skipped", bad);
  if (truncated) s += fmt::format("; {} truncated to cutoff_len", truncated);
  if (dropped_overlong) s += fmt::format("; {} longer than cutoff_len, dropped", dropped_overlong);
  if (dropped_no_target) s += fmt::format("; {} with no trained token within cutoff_len, dropped", dropped_no_target);
  if (cache != CacheUse::none) s += fmt::format("; cache {} ({})", cache_use_name(cache), cache_path);
  if (!cache_note.empty()) s += fmt::format("{} {}", cache == CacheUse::rebuilt ? "; the old file was refused:" : ";", cache_note);
  return s;
}

TokenizedDataset TokenizedDataset::from_examples(const std::vector<TokenizedChat>& examples) {
  auto store = std::make_shared<TokenStore>();
  store->own_offsets.push_back(0);
  DatasetReport report;
  report.name = report.path = "memory";
  for (const TokenizedChat& t : examples) {
    LT_CHECK_EQ(t.ids.size(), t.trainable.size(), "an example's ids and trainable flags differ in length");
    LT_CHECK(!t.ids.empty(), "an example has no tokens");
    store->own_ids.insert(store->own_ids.end(), t.ids.begin(), t.ids.end());
    store->own_trainable.insert(store->own_trainable.end(), t.trainable.begin(), t.trainable.end());
    store->own_offsets.push_back(int64_t(store->own_ids.size()));
    report.trainable_tokens += std::count(t.trainable.begin(), t.trainable.end(), uint8_t(1));
  }
  store->n = int64_t(examples.size());
  store->offsets = store->own_offsets.data();
  store->ids = store->own_ids.data();
  store->trainable = store->own_trainable.data();
  uint64_t h = fnv1a64(store->own_offsets.data(), store->own_offsets.size() * 8);
  h = fnv1a64(store->own_ids.data(), store->own_ids.size() * 4, h);
  store->key = fnv1a64(store->own_trainable.data(), store->own_trainable.size(), h);
  report.records = report.examples = store->n;
  report.tokens = int64_t(store->own_ids.size());
  TokenizedDataset ds;
  ds.add(std::move(store), std::move(report));
  return ds;
}

void TokenizedDataset::add(std::shared_ptr<const TokenStore> store, DatasetReport report) {
  if (starts_.empty()) starts_.push_back(0);
  for (int64_t i = 0; i < store->n; ++i) max_length_ = std::max(max_length_, store->offsets[i + 1] - store->offsets[i]);
  size_ += store->n;
  total_tokens_ += store->offsets[store->n];
  key_ = fnv1a64(&store->key, sizeof store->key, key_);
  starts_.push_back(size_);
  stores_.push_back(std::move(store));
  reports_.push_back(std::move(report));
}

TokenizedDataset::Location TokenizedDataset::locate(int64_t i) const {
  LT_CHECK(i >= 0 && i < size_, "example {} is outside the dataset of {}", i, size_);
  size_t part = size_t(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
  return {stores_[part].get(), i - starts_[part]};
}

std::span<const int32_t> TokenizedDataset::ids(int64_t i) const {
  Location l = locate(i);
  const int64_t* o = l.store->offsets;
  return {l.store->ids + o[l.index], size_t(o[l.index + 1] - o[l.index])};
}

std::span<const uint8_t> TokenizedDataset::trainable(int64_t i) const {
  Location l = locate(i);
  const int64_t* o = l.store->offsets;
  return {l.store->trainable + o[l.index], size_t(o[l.index + 1] - o[l.index])};
}

int64_t TokenizedDataset::length(int64_t i) const {
  Location l = locate(i);
  return l.store->offsets[l.index + 1] - l.store->offsets[l.index];
}

std::string TokenizedDataset::summary() const {
  std::string s;
  int64_t trained = 0;
  for (const DatasetReport& r : reports_) {
    s += r.summary() + "\n";
    trained += r.trainable_tokens;
  }
  s += fmt::format("data: {} examples from {} dataset(s), {} tokens ({} trained), longest {}", size_, reports_.size(),
                   total_tokens_, trained, max_length_);
  return s;
}

TokenizedChat tokenize_conversation(const Tokenizer& tokenizer, const ChatTemplate& tpl,
                                    std::span<const ChatMessage> messages) {
  return tokenize_chat(tokenizer, tpl.render_segments(messages));
}

CutoffResult apply_cutoff(TokenizedChat& t, int64_t cutoff_len, Overlong overlong) {
  LT_CHECK(cutoff_len >= 2, "cutoff_len must be at least 2 (got {})", cutoff_len);
  CutoffResult result = CutoffResult::kept;
  if (int64_t(t.ids.size()) > cutoff_len) {
    if (overlong == Overlong::drop) return CutoffResult::dropped_overlong;
    t.ids.resize(size_t(cutoff_len));
    t.trainable.resize(size_t(cutoff_len));
    result = CutoffResult::truncated;
  }
  // The first token is never a target (nothing precedes it), so it cannot make an example useful.
  bool any = std::find(t.trainable.begin() + (t.trainable.empty() ? 0 : 1), t.trainable.end(), uint8_t(1)) !=
             t.trainable.end();
  return any ? result : CutoffResult::dropped_no_target;
}

std::string data_cache_path(const std::string& cache_dir, const std::string& name, uint64_t key) {
  return (fs::path(cache_dir) / fmt::format("{}-{:016x}.ltdata", sanitize(name), key)).string();
}

TokenizedDataset load_datasets(const std::vector<DatasetSpec>& specs, const Tokenizer& tokenizer,
                               const ChatTemplate& tpl, const TokenizeOptions& options) {
  LT_CHECK(options.cutoff_len >= 2, "cutoff_len must be at least 2 (got {})", options.cutoff_len);
  LT_CHECK(!specs.empty(), "no dataset given");
  std::string no_cache_why;
  // Hashed even without a cache: the key also fingerprints the data for the loader's cursor.
  const uint64_t tok_hash = tokenizer_hash(tokenizer, &no_cache_why);
  const bool use_cache = !options.cache_dir.empty() && no_cache_why.empty();
  const uint64_t tpl_hash = template_hash(tpl);
  if (use_cache) fs::create_directories(options.cache_dir);

  TokenizedDataset out;
  for (DatasetSpec spec : specs) {
    std::vector<DataFile> files = read_dataset(spec);
    const uint64_t key = dataset_key(spec, files, tok_hash, tpl_hash, options);
    DatasetReport report;
    std::string cache_path;
    if (use_cache) {
      cache_path = data_cache_path(options.cache_dir, spec.name, key);
      report.cache = CacheUse::built;
      if (fs::exists(cache_path)) {
        CacheRead cached = read_token_cache(cache_path, key);
        if (cached.store) {
          cached.report.name = spec.name;
          cached.report.path = spec.path;
          cached.report.cache = CacheUse::hit;
          cached.report.cache_path = cache_path;
          out.add(std::move(cached.store), std::move(cached.report));
          continue;
        }
        report.cache = CacheUse::rebuilt;
        report.cache_note = cached.why_not;
      }
    } else if (!options.cache_dir.empty()) {
      report.cache_note = "no cache: " + no_cache_why;
    }
    report.name = spec.name;
    report.path = spec.path;
    report.cache_path = cache_path;
    std::shared_ptr<TokenStore> store = build_store(files, spec, tokenizer, tpl, options, report);
    store->key = key;
    LT_CHECK(report.records > 0, "dataset '{}': {} holds no records", spec.name, spec.path);
    if (use_cache) {
      try {
        write_token_cache(cache_path, *store, report);
      } catch (const Error& e) {
        report.cache = CacheUse::none;
        report.cache_note = fmt::format("could not write the cache: {}", e.what());
      }
    }
    out.add(std::move(store), std::move(report));
  }
  LT_CHECK(out.size() > 0, "no examples left to train on:\n{}", out.summary());
  return out;
}

}  // namespace lt
