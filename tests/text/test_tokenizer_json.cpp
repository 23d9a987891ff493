// Tests for text/tokenizer.h on small tokenizer.json files built here: both merge formats, added
// tokens (special or not, lstrip, rstrip, normalized), ignore_merges, duplicate merges, the GPT-2
// ByteLevel regex, gaps in the ids, loading from a directory or a file with tokenizer_config.json, and
// one test per refused file, each error naming the file and what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "text/bpe.h"
#include "text/tokenizer.h"
#include "testing/error_testing.h"

namespace lt {
namespace {

using testing::expect_error;

using nlohmann::json;

const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// 256 byte tokens (ids 0..255), then one token per merge (256..); added tokens at 300..304.
json tiny(bool pair_merges = false) {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, char(b)))] = id++;
  std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}};
  json m = json::array();
  for (auto& [a, b] : merges) {
    vocab[a + b] = id++;
    m.push_back(pair_merges ? json::array({a, b}) : json(a + " " + b));
  }
  auto added = [](int id, const char* content, bool special, bool lstrip, bool rstrip, bool normalized) {
    return json{{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", lstrip},
                {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
  };
  return json{
      {"version", "1.0"},
      {"added_tokens",
       {added(300, "<|s|>", true, false, false, false), added(301, "<x>", false, false, false, false),
        added(302, "[L]", true, true, false, false), added(303, "[R]", true, false, true, false),
        added(304, "\u00e9!", false, false, false, true)}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kQwenPattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
        {"ignore_merges", false}, {"vocab", vocab}, {"merges", m}}},
  };
}

Tokenizer make(const json& j, const json& config = nullptr) { return Tokenizer::from_json(j, config, "tiny.json"); }

int32_t id_of(const Tokenizer& t, const std::string& s) { return *t.token_to_id(s); }

TEST(TokenizerJson, MergesInBothFormsGiveTheSameIds) {
  Tokenizer a = make(tiny(false)), b = make(tiny(true));
  std::vector<int32_t> expected = {id_of(a, "hello"), id_of(a, "Ġworld")};
  EXPECT_EQ(a.encode("hello world"), expected);
  EXPECT_EQ(b.encode("hello world"), expected);
  EXPECT_EQ(a.decode(expected), "hello world");
  EXPECT_EQ(a.encode("help"), (std::vector<int32_t>{id_of(a, "he"), 'l', 'p'}));
}

TEST(TokenizerJson, GapsInTheIdsAreNotTokens) {
  Tokenizer t = make(tiny());
  EXPECT_EQ(t.vocab_size(), 305);
  EXPECT_EQ(t.id_to_token(265 - 1), "Ġworld");
  expect_error([&] { t.id_to_token(270); }, {"token id 270", "tiny.json"});
  expect_error([&] { t.decode(std::vector<int32_t>{1, 299}); }, {"token id 299"});
}

TEST(TokenizerJson, AddedTokensSpecialOrNot) {
  Tokenizer t = make(tiny());
  EXPECT_EQ(t.encode("a<|s|>b<x>c"), (std::vector<int32_t>{'a', 300, 'b', 301, 'c'}));
  // Not allowed: the special token is text, the non-special one is still a token.
  std::vector<int32_t> plain = t.encode("a<|s|>b<x>c", /*allow_special=*/false);
  EXPECT_EQ(plain, (std::vector<int32_t>{'a', '<', '|', 's', '|', '>', 'b', 301, 'c'}));
  EXPECT_EQ(t.decode(plain), "a<|s|>b<x>c");
  EXPECT_EQ(t.decode(t.encode("a<|s|>b")), "a<|s|>b");
  EXPECT_EQ(t.decode(t.encode("a<|s|>b"), DecodeSpecial::skip), "ab");
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(301));
}

TEST(TokenizerJson, LstripAndRstripSwallowWhitespace) {
  Tokenizer t = make(tiny());
  EXPECT_EQ(t.encode("a \t [L]b"), (std::vector<int32_t>{'a', 302, 'b'}));
  EXPECT_EQ(t.encode("a[R] \u3000 b"), (std::vector<int32_t>{'a', 303, 'b'}));
  EXPECT_EQ(t.encode("a [R] b"), (std::vector<int32_t>{'a', id_of(t, "Ġ"), 303, 'b'}));
  // lstrip never reaches back past the previous added token.
  EXPECT_EQ(t.encode("<x> [L]"), (std::vector<int32_t>{301, 302}));
}

TEST(TokenizerJson, NormalizedAddedTokensMatchAfterNfc) {
  Tokenizer t = make(tiny());
  EXPECT_EQ(t.encode("\u00e9!"), std::vector<int32_t>{304});
  EXPECT_EQ(t.encode("e\u0301!"), std::vector<int32_t>{304});  // NFC makes é! first
  EXPECT_EQ(t.encode("xe\u0301!y"), (std::vector<int32_t>{'x', 304, 'y'}));
}

TEST(TokenizerJson, DuplicateMergeKeepsItsLastRank) {
  json j = tiny();
  j["model"]["vocab"]["el"] = 290;
  // "l l" first appears at rank 1; listed again after "e l", it ranks below it, as HF and JS read it.
  j["model"]["merges"].push_back("e l");
  j["model"]["merges"].push_back("l l");
  Tokenizer t = make(j);
  EXPECT_EQ(t.encode("ell"), (std::vector<int32_t>{290, 'l'}));
}

TEST(TokenizerJson, IgnoreMergesTakesWholeTokens) {
  json j = tiny();
  j["model"]["vocab"]["hlo"] = 291;  // no merge makes it
  EXPECT_EQ(make(j).encode("hlo"), (std::vector<int32_t>{'h', 'l', 'o'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(make(j).encode("hlo"), std::vector<int32_t>{291});
  EXPECT_EQ(make(j).encode("hello"), std::vector<int32_t>{id_of(make(j), "hello")});
}

TEST(TokenizerJson, Gpt2ByteLevelRegex) {
  json j = tiny();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["normalizer"] = nullptr;
  Tokenizer t = make(j);
  EXPECT_EQ(t.encode("hello world"), (std::vector<int32_t>{id_of(t, "hello"), id_of(t, "Ġworld")}));
  EXPECT_EQ(t.encode("e\u0301").size(), 3u);  // no normalizer: e + two bytes of U+0301
}

TEST(TokenizerJson, LoadsDirectoryOrFileWithConfig) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(::testing::TempDir()) / ("lt_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tiny().dump();
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"eos_token", "<|s|>"}, {"pad_token", {{"content", "<x>"}, {"__type", "AddedToken"}}}, {"bos_token", nullptr}}
             .dump();
  for (const fs::path& p : {dir, dir / "tokenizer.json"}) {
    Tokenizer t = Tokenizer::load(p.string());
    EXPECT_EQ(t.special_ids().eos, 300);
    EXPECT_EQ(t.special_ids().pad, 301);
    EXPECT_FALSE(t.special_ids().bos.has_value());
    EXPECT_FALSE(t.special_ids().im_end.has_value());
    EXPECT_EQ(t.source(), (dir / "tokenizer.json").string());
  }
  std::ofstream(dir / "tokenizer_config.json") << json{{"eos_token", "</s>"}}.dump();
  expect_error([&] { Tokenizer::load(dir.string()); }, {"eos_token", "'</s>'", "not in the vocabulary"});
  fs::remove(dir / "tokenizer.json");
  expect_error([&] { Tokenizer::load(dir.string()); }, {"no tokenizer.json"});
  fs::remove_all(dir);
  expect_error([&] { Tokenizer::load((dir / "tokenizer.json").string()); }, {"tokenizer.json"});
}

TEST(TokenizerJson, EncodeAppendAppends) {
  Tokenizer t = make(tiny());
  std::vector<int32_t> out = {7};
  t.encode_append("hello", out);
  t.encode_append("<|s|>", out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, id_of(t, "hello"), 300}));
}

TEST(TokenizerJson, RefusesWhatItDoesNotImplement) {
  auto with = [](const char* path, json value) {
    json j = tiny();
    j[json::json_pointer(path)] = std::move(value);
    return j;
  };
  expect_error([&] { make(with("/model/type", "WordPiece")); }, {"tiny.json", "model type", "WordPiece"});
  expect_error([&] { make(with("/model/byte_fallback", true)); }, {"byte_fallback"});
  expect_error([&] { make(with("/model/dropout", 0.1)); }, {"dropout"});
  expect_error([&] { make(with("/model/continuing_subword_prefix", "##")); }, {"continuing_subword_prefix"});
  expect_error([&] { make(with("/normalizer", {{"type", "NFKC"}})); }, {"normalizer", "NFKC"});
  expect_error([&] { make(with("/pre_tokenizer", {{"type", "Metaspace"}})); }, {"pre_tokenizer", "Metaspace"});
  expect_error([&] { make(with("/pre_tokenizer/pretokenizers/0/behavior", "Removed")); }, {"behavior", "Removed"});
  expect_error([&] { make(with("/pre_tokenizer/pretokenizers/0/invert", true)); }, {"invert"});
  expect_error([&] { make(with("/pre_tokenizer/pretokenizers/1/add_prefix_space", true)); }, {"add_prefix_space"});
  expect_error([&] { make(with("/pre_tokenizer/pretokenizers/0/pattern", {{"Regex", "(ab"}})); },
               {"regex does not compile", "offset"});
  expect_error([&] { make(with("/decoder", {{"type", "Metaspace"}})); }, {"decoder", "Metaspace"});
  expect_error([&] { make(with("/added_tokens/0/single_word", true)); }, {"single_word", "<|s|>"});
  expect_error([&] { make(with("/model/merges/0", "h e x")); }, {"merge #0", "one space"});
  expect_error([&] { make(with("/model/merges/0", "h zz")); }, {"merge #0", "not in the vocabulary"});
  expect_error([&] { make(with("/model/merges/0", "a b")); }, {"merge #0", "makes 'ab'", "not in the vocabulary"});
  expect_error([&] { make(with("/model/merges/0", json::array({1, 2}))); }, {"merge #0"});
  json no_byte = tiny();
  no_byte["model"]["vocab"].erase(byte_level_encode("\x7f"));
  expect_error([&] { make(no_byte); }, {"no token for byte 0x7F"});
  json not_byte_level = tiny();
  not_byte_level["model"]["vocab"]["two words"] = 292;
  expect_error([&] { make(not_byte_level); }, {"'two words'", "byte-level alphabet"});
}

}  // namespace
}  // namespace lt
