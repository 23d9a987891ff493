#include "text/tokenizer.h"

#include <filesystem>
#include <unordered_map>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/paths.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace lt {

namespace {

using nlohmann::json;

// GPT-2's pattern, which a ByteLevel pre-tokenizer with use_regex=true applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Ids above this are refused (a corrupt file, not a vocabulary).
constexpr int64_t kMaxId = int64_t(1) << 24;

enum class TokenKind : uint8_t { none, vocab, added, special };

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

bool flag(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

// True when the normalizer is NFC, false when there is none; anything else is refused.
bool parse_normalizer(const json& n, const std::string& src) {
  if (n.is_null()) return false;
  std::string t = type_of(n);
  if (t == "NFC") return true;
  if (t == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    bool nfc = false;
    for (const json& m : n["normalizers"]) nfc = parse_normalizer(m, src) || nfc;
    return nfc;
  }
  LT_FAIL("{}: normalizer {} is not supported (supported: NFC, a Sequence of NFC, or none)", src, n.dump());
}

// The split regex, or "" when pieces are whole stretches of text. Accepts ByteLevel (its own regex
// when use_regex) or a Sequence of one Split(Isolated, not inverted) then ByteLevel(use_regex=false).
std::string parse_pre_tokenizer(const json& p, const std::string& src) {
  auto byte_level = [&](const json& b) {
    LT_CHECK(!flag(b, "add_prefix_space", false),
             "{}: pre_tokenizer ByteLevel with add_prefix_space=true is not supported", src);
    return flag(b, "use_regex", true);
  };
  std::string t = type_of(p);
  if (t == "ByteLevel") return byte_level(p) ? std::string(kGpt2Pattern) : std::string();
  if (t == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    const json& list = p["pretokenizers"];
    if (list.size() == 1 && type_of(list[0]) == "ByteLevel") return parse_pre_tokenizer(list[0], src);
    if (list.size() == 2 && type_of(list[0]) == "Split" && type_of(list[1]) == "ByteLevel") {
      const json& s = list[0];
      LT_CHECK(!byte_level(list[1]), "{}: a Split followed by a ByteLevel with use_regex=true is not supported", src);
      LT_CHECK(s.contains("pattern") && s["pattern"].is_object() && s["pattern"].contains("Regex") &&
                   s["pattern"]["Regex"].is_string(),
               "{}: pre_tokenizer Split needs a {{\"Regex\": ...}} pattern (got {})", src, s.value("pattern", json()).dump());
      LT_CHECK(s.value("behavior", std::string()) == "Isolated",
               "{}: pre_tokenizer Split behavior {} is not supported (supported: Isolated)", src,
               s.value("behavior", json()).dump());
      LT_CHECK(!flag(s, "invert", false), "{}: pre_tokenizer Split with invert=true is not supported", src);
      return s["pattern"]["Regex"].get<std::string>();
    }
  }
  LT_FAIL("{}: pre_tokenizer {} is not supported (supported: ByteLevel, or Sequence[Split(Regex, Isolated), "
          "ByteLevel(use_regex=false)])",
          src, p.dump().substr(0, 300));
}

// A token of tokenizer_config.json: "text", {"content": "text", ...} or null.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::vector<std::string> token_str;    // [vocab_size] HF form; "" where no token
  std::vector<std::string> token_bytes;  // [vocab_size] raw bytes
  std::vector<TokenKind> kind;           // [vocab_size]
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> str_to_id;
  AddedTokenMatcher raw_added, normalized_added;
  bool nfc = false;
  std::unique_ptr<SplitRegex> split;  // null: a stretch of text is one piece
  std::unique_ptr<BpeModel> bpe;
  SpecialTokenIds special;

  void check_id(int32_t id) const {
    LT_CHECK(id >= 0 && size_t(id) < kind.size() && kind[size_t(id)] != TokenKind::none,
             "token id {} is not in the vocabulary of {} (size {})", id, source, kind.size());
  }

  void encode_pieces(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    if (!split) {
      bpe->encode_piece(text, out);
      return;
    }
    thread_local std::vector<std::string_view> pieces;  // reused: no allocation per call
    pieces.clear();
    split->split(text, pieces);
    for (std::string_view piece : pieces) bpe->encode_piece(piece, out);
    pieces.clear();
  }

  void encode_section(std::string_view raw, std::vector<int32_t>& out, bool allow_special) const {
    std::string storage;
    std::string_view text = nfc ? lt::nfc(raw, storage) : raw;
    size_t pos = 0;
    while (pos < text.size()) {
      std::optional<AddedTokenMatch> m = normalized_added.find(text, pos, allow_special);
      size_t end = m ? m->begin : text.size();
      encode_pieces(text.substr(pos, end - pos), out);
      if (!m) break;
      out.push_back(m->id);
      pos = m->end;
    }
  }

  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
    std::string repaired;
    if (!utf8_is_valid(text)) {
      repaired = utf8_repair(text);
      text = repaired;
    }
    out.reserve(out.size() + text.size() / 3 + 8);
    size_t pos = 0;
    while (pos < text.size()) {
      std::optional<AddedTokenMatch> m = raw_added.find(text, pos, allow_special);
      size_t end = m ? m->begin : text.size();
      if (end > pos) encode_section(text.substr(pos, end - pos), out, allow_special);
      if (!m) break;
      out.push_back(m->id);
      pos = m->end;
    }
  }
};

Tokenizer Tokenizer::from_json(const json& tj, const json& config, const std::string& src) {
  auto impl = std::make_shared<Impl>();
  impl->source = src;
  LT_CHECK(tj.is_object() && tj.contains("model") && tj["model"].is_object(), "{}: no \"model\" object", src);
  const json& model = tj["model"];
  LT_CHECK(type_of(model) == "BPE", "{}: model type {} is not supported (supported: BPE)", src,
           model.value("type", json()).dump());
  LT_CHECK(!flag(model, "byte_fallback", false), "{}: BPE byte_fallback=true is not supported (byte-level BPE only)", src);
  LT_CHECK(!model.contains("dropout") || model["dropout"].is_null() || model["dropout"].get<double>() == 0.0,
           "{}: BPE dropout {} is not supported at encode time", src, model.value("dropout", json()).dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    LT_CHECK(!model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(),
             "{}: BPE {} {} is not supported", src, key, model[key].dump());
  }
  LT_CHECK(model.contains("vocab") && model["vocab"].is_object(), "{}: model.vocab must be an object", src);
  LT_CHECK(model.contains("merges") && model["merges"].is_array(), "{}: model.merges must be an array", src);

  impl->nfc = parse_normalizer(tj.value("normalizer", json()), src);
  std::string pattern = parse_pre_tokenizer(tj.value("pre_tokenizer", json()), src);
  if (!pattern.empty()) impl->split = std::make_unique<SplitRegex>(pattern, src);
  LT_CHECK(type_of(tj.value("decoder", json())) == "ByteLevel", "{}: decoder {} is not supported (supported: ByteLevel)",
           src, tj.value("decoder", json()).dump());

  // Added tokens first: they take precedence over a vocabulary entry with the same id.
  std::vector<AddedToken> added;
  for (const json& a : tj.value("added_tokens", json::array())) {
    LT_CHECK(a.contains("id") && a["id"].is_number_integer() && a.contains("content") && a["content"].is_string(),
             "{}: an added token needs an integer id and a string content (got {})", src, a.dump());
    AddedToken t;
    t.content = a["content"].get<std::string>();
    t.id = a["id"].get<int32_t>();
    t.special = flag(a, "special", false);
    t.lstrip = flag(a, "lstrip", false);
    t.rstrip = flag(a, "rstrip", false);
    t.normalized = flag(a, "normalized", !t.special);  // HF's default
    LT_CHECK(!flag(a, "single_word", false), "{}: added token '{}' has single_word=true, which is not supported", src,
             t.content);
    LT_CHECK(t.id >= 0 && t.id < kMaxId, "{}: added token '{}' has id {} out of range", src, t.content, t.id);
    LT_CHECK(!t.content.empty() && utf8_is_valid(t.content), "{}: added token {} must be non-empty valid UTF-8", src, t.id);
    added.push_back(t);
  }

  int64_t size = 0;
  for (const auto& [tok, id] : model["vocab"].items()) {
    LT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxId,
             "{}: vocab entry '{}' has id {}, not an integer in [0, {})", src, tok, id.dump(), kMaxId);
    size = std::max(size, id.get<int64_t>() + 1);
  }
  for (const AddedToken& t : added) size = std::max<int64_t>(size, t.id + 1);
  impl->token_str.resize(size_t(size));
  impl->token_bytes.resize(size_t(size));
  impl->kind.assign(size_t(size), TokenKind::none);
  for (const AddedToken& t : added) {
    impl->token_str[size_t(t.id)] = t.content;
    impl->token_bytes[size_t(t.id)] = t.content;
    impl->kind[size_t(t.id)] = t.special ? TokenKind::special : TokenKind::added;
  }
  std::vector<std::string> bpe_bytes(static_cast<size_t>(size));  // the vocabulary proper, for the BPE model
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_ids;
  vocab_ids.reserve(model["vocab"].size());
  for (const auto& [tok, id_json] : model["vocab"].items()) {
    auto id = size_t(id_json.get<int64_t>());
    vocab_ids.emplace(tok, int32_t(id));
    std::optional<std::string> bytes = byte_level_decode(tok);
    if (impl->kind[id] == TokenKind::added || impl->kind[id] == TokenKind::special) {
      if (bytes) bpe_bytes[id] = *bytes;
      continue;
    }
    LT_CHECK(bytes.has_value(), "{}: vocab entry '{}' (id {}) has characters outside the byte-level alphabet", src, tok, id);
    LT_CHECK(impl->kind[id] == TokenKind::none, "{}: id {} appears twice in the vocabulary ('{}' and '{}')", src, id,
             impl->token_str[id], tok);
    impl->token_str[id] = tok;
    impl->token_bytes[id] = *bytes;
    impl->kind[id] = TokenKind::vocab;
    bpe_bytes[id] = std::move(*bytes);
  }
  for (size_t id = 0; id < impl->token_str.size(); ++id) {
    if (impl->kind[id] != TokenKind::none) impl->str_to_id.insert_or_assign(impl->token_str[id], int32_t(id));
  }
  for (const AddedToken& t : added) impl->str_to_id.insert_or_assign(t.content, t.id);

  // Merges: "a b" strings (one space) or ["a", "b"] pairs (tokenizers >= 0.20).
  const json& mj = model["merges"];
  std::vector<BpeMerge> merges;
  merges.reserve(mj.size());
  std::string merged;
  for (size_t r = 0; r < mj.size(); ++r) {
    std::string a, b;
    if (mj[r].is_string()) {
      const std::string& s = mj[r].get_ref<const std::string&>();
      size_t sp = s.find(' ');
      LT_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
               "{}: merge #{} '{}' is not two tokens separated by one space", src, r, s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      LT_CHECK(mj[r].is_array() && mj[r].size() == 2 && mj[r][0].is_string() && mj[r][1].is_string(),
               "{}: merge #{} {} is neither \"a b\" nor [\"a\", \"b\"]", src, r, mj[r].dump());
      a = mj[r][0].get<std::string>(), b = mj[r][1].get<std::string>();
    }
    auto ia = vocab_ids.find(a), ib = vocab_ids.find(b), im = vocab_ids.find(merged = a + b);
    LT_CHECK(ia != vocab_ids.end() && ib != vocab_ids.end(),
             "{}: merge #{} '{} {}' uses a token that is not in the vocabulary", src, r, a, b);
    LT_CHECK(im != vocab_ids.end(), "{}: merge #{} '{} {}' makes '{}', which is not in the vocabulary", src, r, a, b,
             merged);
    merges.push_back(BpeMerge{ia->second, ib->second, im->second});
  }
  impl->bpe = std::make_unique<BpeModel>(bpe_bytes, merges, flag(model, "ignore_merges", false), src);

  std::vector<AddedToken> raw, normalized;
  for (const AddedToken& t : added) (t.normalized && impl->nfc ? normalized : raw).push_back(t);
  impl->raw_added = AddedTokenMatcher(raw);
  impl->normalized_added = AddedTokenMatcher(normalized);

  auto lookup = [&](const std::string& name, const char* key) {
    auto it = impl->str_to_id.find(name);
    LT_CHECK(it != impl->str_to_id.end(), "{}: tokenizer_config.json {} '{}' is not in the vocabulary", src, key, name);
    return it->second;
  };
  if (auto t = config_token(config, "bos_token")) impl->special.bos = lookup(*t, "bos_token");
  if (auto t = config_token(config, "eos_token")) impl->special.eos = lookup(*t, "eos_token");
  if (auto t = config_token(config, "pad_token")) impl->special.pad = lookup(*t, "pad_token");
  if (auto it = impl->str_to_id.find("<|im_start|>"); it != impl->str_to_id.end()) impl->special.im_start = it->second;
  if (auto it = impl->str_to_id.find("<|im_end|>"); it != impl->str_to_id.end()) impl->special.im_end = it->second;
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path_or_dir) {
  namespace fs = std::filesystem;
  fs::path path = path_or_dir;
  if (is_directory_path(path)) {
    path /= "tokenizer.json";
    LT_CHECK(path_exists(path), "{}: no tokenizer.json in this directory", path_or_dir);
  }
  json config;
  fs::path config_path = path.parent_path() / "tokenizer_config.json";
  if (path_exists(config_path)) config = read_json_file(config_path.string());
  return with_json_errors(path.string() + " (with " + config_path.filename().string() + ")",
                          [&] { return from_json(read_json_file(path.string()), config, path.string()); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  impl_->encode(text, out, allow_special);
  return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  impl_->encode(text, out, allow_special);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, DecodeSpecial special) const {
  std::string bytes;
  for (int32_t id : ids) {
    impl_->check_id(id);
    if (special == DecodeSpecial::skip && impl_->kind[size_t(id)] == TokenKind::special) continue;
    bytes += impl_->token_bytes[size_t(id)];
  }
  return utf8_is_valid(bytes) ? bytes : utf8_repair(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->str_to_id.find(token);
  if (it == impl_->str_to_id.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  impl_->check_id(id);
  return impl_->token_str[size_t(id)];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  impl_->check_id(id);
  return impl_->token_bytes[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  impl_->check_id(id);
  return impl_->kind[size_t(id)] == TokenKind::special;
}

bool Tokenizer::is_added(int32_t id) const {
  impl_->check_id(id);
  return impl_->kind[size_t(id)] == TokenKind::special || impl_->kind[size_t(id)] == TokenKind::added;
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->kind.size()); }
const SpecialTokenIds& Tokenizer::special_ids() const { return impl_->special; }
const std::string& Tokenizer::source() const { return impl_->source; }
bool Tokenizer::regex_jit() const { return impl_->split && impl_->split->jit(); }
size_t Tokenizer::cache_entries() const { return impl_->bpe->cache_entries(); }
void Tokenizer::clear_cache() const { impl_->bpe->clear_cache(); }

void copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                        "generation_config.json"}) {
    const std::filesystem::path src = std::filesystem::path(from_dir) / f;
    if (path_exists(src)) write_file_atomic((std::filesystem::path(to_dir) / f).string(), read_file(src.string()));
  }
}

}  // namespace lt
