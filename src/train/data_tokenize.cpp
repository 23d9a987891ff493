#include "train/data_tokenize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/parallel.h"
#include "io/json_file.h"
#include "io/paths.h"
#include "io/unique_fd.h"
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

// hash_piece(h, the file's bytes), read in chunks.
uint64_t hash_file(uint64_t h, const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  LT_CHECK(fd.get() >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  LT_CHECK(::fstat(fd.get(), &st) == 0, "{}: cannot stat: {}", path, std::strerror(errno));
  LT_CHECK(!S_ISDIR(st.st_mode), "{}: is a directory, expected a file", path);
  const uint64_t len = uint64_t(st.st_size);
  h = fnv1a64(&len, sizeof len, h);
  std::vector<char> chunk(size_t(1) << 20);
  uint64_t done = 0;
  for (;;) {
    const ssize_t n = ::read(fd.get(), chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    LT_CHECK(n >= 0, "{}: read failed: {}", path, std::strerror(errno));
    if (n == 0) break;
    h = fnv1a64(chunk.data(), size_t(n), h);
    done += uint64_t(n);
  }
  LT_CHECK(done == len, "{}: changed while being read ({} bytes, then {})", path, len, done);
  return h;
}

// The tokenizer's files, hashed; nullopt-like 0 with `why` when it was not loaded from a file.
uint64_t tokenizer_hash(const Tokenizer& tok, std::string* why) {
  const fs::path file = tok.source();
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    *why = fmt::format("the tokenizer was not loaded from a file ('{}'), so it cannot be part of a cache key", tok.source());
    return 0;
  }
  const uint64_t h = hash_file(kFnvOffset, file.string());
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  return path_exists(config) ? hash_file(h, config.string()) : hash_piece(h, std::string());
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

// One record's outcome in a chunk.
struct RecordResult {
  std::string text;  // the record, copied out of the reader's buffer
  int64_t record_line = 0;
  TokenizedChat chat;
  std::string error;
  int64_t line = 0;
};

// Streams, converts and tokenises every record of the files in order, kChunkRecords at a time (in parallel
// within a chunk), counting into `report`, and hands each kept example to `emit` in record order. Memory: one
// chunk of records, whatever the size of the files.
template <typename Emit>
void tokenize_dataset(const std::vector<std::string>& files, const DatasetSpec& spec, const Tokenizer& tok,
                      const ChatTemplate& tpl, const TokenizeOptions& opt, DatasetReport& report, Emit&& emit) {
  std::vector<RecordResult> results;
  for (const std::string& path : files) {
    RecordReader reader(path);
    for (bool more = true; more;) {
      results.clear();
      DataRecord rec;
      while (int64_t(results.size()) < kChunkRecords && (more = reader.next(rec)))
        results.push_back({std::string(rec.text), rec.line, {}, {}, 0});
      parallel_for(int64_t(results.size()), [&](int64_t k) {
        RecordResult& res = results[size_t(k)];
        ConvertedRecord conv = convert_record(res.text, res.record_line, spec);
        if (!conv.error.empty()) {
          res.error = std::move(conv.error);
          res.line = conv.error_line;
          return;
        }
        try {
          res.chat = tokenize_conversation(tok, tpl, conv.messages);
        } catch (const Error& e) {  // a conversation the template refuses (qwen3_5: no user query) is a bad record
          res.error = e.what();
          res.line = res.record_line;
        }
      });
      // In record order, so the first bad record is the one reported and counts do not depend on threads.
      for (RecordResult& res : results) {
        ++report.records;
        if (!res.error.empty()) {
          std::string message = fmt::format("{}:{}: {}", path, res.line, res.error);
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
        emit(res.chat);
      }
    }
  }
}

// Examples kept in memory (no cache).
struct MemoryStore {
  std::shared_ptr<TokenStore> store = std::make_shared<TokenStore>();
  MemoryStore() { store->own_offsets.push_back(0); }
  void add(const TokenizedChat& t) {
    store->own_ids.insert(store->own_ids.end(), t.ids.begin(), t.ids.end());
    store->own_trainable.insert(store->own_trainable.end(), t.trainable.begin(), t.trainable.end());
    store->own_offsets.push_back(int64_t(store->own_ids.size()));
  }
  std::shared_ptr<TokenStore> finish(uint64_t key) {
    store->n = int64_t(store->own_offsets.size()) - 1;
    store->offsets = store->own_offsets.data();
    store->ids = store->own_ids.data();
    store->trainable = store->own_trainable.data();
    store->key = key;
    return std::move(store);
  }
};

// Resolves a `detect` spec from the first record that is a JSON object among the first kDetectTries records of
// the first file that has any.
void detect_format(DatasetSpec& spec, const std::vector<std::string>& files) {
  if (spec.formatting != DataFormatting::detect) return;
  for (const std::string& path : files) {
    RecordReader reader(path);
    DataRecord rec;
    if (!reader.next(rec)) continue;
    std::string pick(rec.text);
    int64_t pick_line = rec.line;
    for (size_t tries = 1;; ++tries) {
      if (json::parse(rec.text, nullptr, false).is_object()) {
        pick = rec.text;
        pick_line = rec.line;
        break;
      }
      if (tries == kDetectTries || !reader.next(rec)) break;
    }
    spec = detect_dataset_spec(spec, pick, path, pick_line);
    return;
  }
  LT_FAIL("dataset '{}': {} holds no records", spec.name, spec.path);
}

uint64_t dataset_key(const DatasetSpec& spec, const std::vector<std::string>& files, uint64_t tok_hash,
                     uint64_t tpl_hash, const TokenizeOptions& opt) {
  uint64_t h = hash_piece(kFnvOffset, fmt::format("lazytrain data cache v{}", kDataCacheVersion));
  h = hash_piece(h, spec.describe());
  bool dir = is_directory_path(spec.path);
  for (const std::string& path : files) {
    h = hash_piece(h, dir ? fs::path(path).filename().string() : std::string());
    h = hash_file(h, path);
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
  MemoryStore memory;
  DatasetReport report;
  report.name = report.path = "memory";
  for (const TokenizedChat& t : examples) {
    LT_CHECK_EQ(t.ids.size(), t.trainable.size(), "an example's ids and trainable flags differ in length");
    LT_CHECK(!t.ids.empty(), "an example has no tokens");
    memory.add(t);
    report.trainable_tokens += std::count(t.trainable.begin(), t.trainable.end(), uint8_t(1));
  }
  const TokenStore& st = *memory.store;
  uint64_t h = fnv1a64(st.own_offsets.data(), st.own_offsets.size() * 8);
  h = fnv1a64(st.own_ids.data(), st.own_ids.size() * 4, h);
  h = fnv1a64(st.own_trainable.data(), st.own_trainable.size(), h);
  report.records = report.examples = int64_t(examples.size());
  report.tokens = int64_t(st.own_ids.size());
  TokenizedDataset ds;
  ds.add(memory.finish(h), std::move(report));
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
  if (use_cache) make_directories(options.cache_dir, "the data cache");

  TokenizedDataset out;
  for (DatasetSpec spec : specs) {
    const std::vector<std::string> files = dataset_files(spec);
    detect_format(spec, files);
    const uint64_t key = dataset_key(spec, files, tok_hash, tpl_hash, options);
    DatasetReport report;
    std::string cache_path;
    if (use_cache) {
      cache_path = data_cache_path(options.cache_dir, spec.name, key);
      report.cache = CacheUse::built;
      if (path_exists(cache_path)) {
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
    const DatasetReport before = report;
    auto no_records = [&] { return fmt::format("dataset '{}': {} holds no records", spec.name, spec.path); };

    // With a cache the examples stream into it and are then mapped from it: nothing the size of the data is
    // held in memory. A cache that cannot be written (a full disk, a read-only directory) is not fatal: the
    // data is tokenised again into memory, and the report says why.
    std::string write_error;
    if (use_cache) {
      std::optional<TokenCacheWriter> writer;
      try {
        writer.emplace(cache_path, key);
      } catch (const Error& e) {
        write_error = e.what();
      }
      if (writer) {
        tokenize_dataset(files, spec, tokenizer, tpl, options, report, [&](const TokenizedChat& t) {
          if (!writer) return;
          try {
            writer->add(t.ids, t.trainable);
          } catch (const Error& e) {
            write_error = e.what();
            writer.reset();  // the temporary file goes; the rest is only counted
          }
        });
        LT_CHECK(report.records > 0, "{}", no_records());
      }
      if (writer) {
        try {
          writer->commit(report);
          CacheRead back = read_token_cache(cache_path, key);
          LT_CHECK(back.store, "{}: the cache just written does not read back: {}", cache_path, back.why_not);
          out.add(std::move(back.store), std::move(report));
          continue;
        } catch (const Error& e) {
          write_error = e.what();
        }
      }
      report = before;
      report.cache = CacheUse::none;
      report.cache_note = fmt::format("could not write the cache, tokenised in memory instead: {}", write_error);
    }
    MemoryStore memory;
    tokenize_dataset(files, spec, tokenizer, tpl, options, report, [&](const TokenizedChat& t) { memory.add(t); });
    LT_CHECK(report.records > 0, "{}", no_records());
    out.add(memory.finish(key), std::move(report));
  }
  LT_CHECK(out.size() > 0, "no examples left to train on:\n{}", out.summary());
  return out;
}

}  // namespace lt
