// Tokenised datasets with the real Qwen3 tokenizer: which tokens are trained for every template, every
// format end to end through load_datasets, mixing, the cutoff policies, bad records (stop / skip), and
// the cache (hit, rebuilt when corrupt, a new key when anything that matters changes).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "testing/files_testing.h"
#include "core/error.h"
#include "io/io_faults.h"
#include "io/json_file.h"
#include "text/text_testing.h"
#include "train/data_loader.h"
#include "train/data_tokenize.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using testing::qwen3_tokenizer;

std::string temp_dir() { return testing::fresh_test_dir("lt_data_tok_"); }
using testing::error_of;
void write(const std::string& path, const std::string& text) { testing::write_text_file(path, text); }

// The decoded text of each maximal run of tokens whose flag is `flag`.
std::vector<std::string> runs(std::span<const int32_t> ids, std::span<const uint8_t> trainable, uint8_t flag = 1) {
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size();) {
    if (trainable[i] != flag) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < ids.size() && trainable[j] == flag) ++j;
    out.push_back(qwen3_tokenizer().decode(ids.subspan(i, j - i)));
    i = j;
  }
  return out;
}

using Strings = std::vector<std::string>;

const std::vector<ChatMessage> kTwoTurns = {{"system", "You are terse."}, {"user", "Hi there"},
                                            {"assistant", "Hello!"},        {"user", "2+2?"},
                                            {"assistant", "4, as 2+2=4."}};

TEST(DataTokenize, Qwen25TrainsOnlyAssistantTurnsAndTheirImEnd) {
  LT_REQUIRE_QWEN3();
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, qwen3_tokenizer());
  TokenizedChat t = tokenize_conversation(qwen3_tokenizer(), tpl, kTwoTurns);
  EXPECT_EQ(qwen3_tokenizer().decode(t.ids), tpl.render(kTwoTurns));
  EXPECT_EQ(runs(t.ids, t.trainable), (Strings{"Hello!<|im_end|>", "4, as 2+2=4.<|im_end|>"}));
  EXPECT_EQ(runs(t.ids, t.trainable, 0),
            (Strings{"<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                     "<|im_start|>assistant\n",
                     "\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", "\n"}));
}

TEST(DataTokenize, Qwen3LeavesTheEmptyThinkBlockUntrainedAndTrainsReasoning) {
  LT_REQUIRE_QWEN3();
  ChatTemplate tpl(ChatTemplateKind::qwen3, qwen3_tokenizer());
  TokenizedChat t = tokenize_conversation(qwen3_tokenizer(), tpl, kTwoTurns);
  EXPECT_EQ(runs(t.ids, t.trainable), (Strings{"Hello!<|im_end|>", "4, as 2+2=4.<|im_end|>"}));
  EXPECT_EQ(runs(t.ids, t.trainable, 0).at(1), "\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  std::vector<ChatMessage> thinking = {{"user", "2+2?"}, {"assistant", "<think>\nadd them\n</think>\n\n4"}};
  TokenizedChat r = tokenize_conversation(qwen3_tokenizer(), tpl, thinking);
  EXPECT_EQ(runs(r.ids, r.trainable), (Strings{"<think>\nadd them\n</think>\n\n4<|im_end|>"}));
}

TEST(DataTokenize, PlainTemplateTrainsTheAnswerAndEos) {
  LT_REQUIRE_QWEN3();
  ChatTemplate tpl(ChatTemplateKind::plain, qwen3_tokenizer());
  std::vector<ChatMessage> m = {{"user", "Capital of France?"}, {"assistant", "Paris."}};
  TokenizedChat t = tokenize_conversation(qwen3_tokenizer(), tpl, m);
  EXPECT_EQ(runs(t.ids, t.trainable), (Strings{"Paris.<|im_end|>"}));
  EXPECT_EQ(runs(t.ids, t.trainable, 0), (Strings{"Capital of France?\n"}));
}

TEST(DataTokenize, ApplyCutoffTruncatesDropsAndRefusesExamplesWithoutTargets) {
  TokenizedChat t{{1, 2, 3, 4, 5, 6}, {0, 0, 1, 1, 1, 1}};
  TokenizedChat a = t;
  EXPECT_EQ(apply_cutoff(a, 6, Overlong::truncate), CutoffResult::kept);
  EXPECT_EQ(apply_cutoff(a, 4, Overlong::truncate), CutoffResult::truncated);
  EXPECT_EQ(a.ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(a.trainable, (std::vector<uint8_t>{0, 0, 1, 1}));
  TokenizedChat b = t;
  EXPECT_EQ(apply_cutoff(b, 4, Overlong::drop), CutoffResult::dropped_overlong);
  TokenizedChat c = t;
  EXPECT_EQ(apply_cutoff(c, 2, Overlong::truncate), CutoffResult::dropped_no_target);
  TokenizedChat first_only{{1, 2}, {1, 0}};  // position 0 is never a target
  EXPECT_EQ(apply_cutoff(first_only, 8, Overlong::truncate), CutoffResult::dropped_no_target);
  EXPECT_NE(error_of([&] { apply_cutoff(a, 1, Overlong::truncate); }).find("cutoff_len must be at least 2"),
            std::string::npos);
}

// Five datasets, one per format, three of them registered.
std::vector<DatasetSpec> write_mix(const std::string& dir) {
  write(dir + "/alpaca.json", R"([
  {"instruction": "Translate to English.", "input": "Bonjour", "output": "Hello", "system": "You translate."},
  {"instruction": "Name a colour.", "input": "", "output": "Blue",
   "history": [["Hi", "Hello! How can I help?"]]}
])");
  write(dir + "/chat.jsonl",
        R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hey."}, {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Bye!"}]})"
        "\n");
  write(dir + "/oa.jsonl",
        R"({"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "You're welcome."}]})"
        "\n");
  write(dir + "/gsm8k.jsonl",
        R"({"question": "Ann has 2 cats and gets 3 more. How many cats?", "answer": "2+3=<<2+3=5>>5\n#### 5"})"
        "\n");
  write(dir + "/mm.json", R"([{"query": "What is 3*4?", "response": "3*4=12. The answer is: 12", "type": "MATH_AnsAug"}])");
  write(dir + "/dataset_info.json", R"({
  "chat": {"file_name": "chat.jsonl", "formatting": "sharegpt"},
  "oa": {"file_name": "oa.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
         "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
                  "system_tag": "system"}},
  "metamath": {"file_name": "mm.json", "columns": {"prompt": "query", "response": "response"}}
})");
  return resolve_datasets(split_dataset_list("alpaca.json,chat,oa,gsm8k.jsonl,metamath"), dir);
}

TEST(DataTokenize, LoadsAndMixesEveryFormatInOrder) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  std::string dir = temp_dir();
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, tok);
  TokenizedDataset data = load_datasets(write_mix(dir), tok, tpl, {});
  ASSERT_EQ(data.size(), 6);
  ASSERT_EQ(data.reports().size(), 5u);
  const std::vector<std::vector<ChatMessage>> expected = {
      {{"system", "You translate."}, {"user", "Translate to English.\nBonjour"}, {"assistant", "Hello"}},
      {{"user", "Hi"}, {"assistant", "Hello! How can I help?"}, {"user", "Name a colour."}, {"assistant", "Blue"}},
      {{"user", "Hi"}, {"assistant", "Hey."}, {"user", "Bye"}, {"assistant", "Bye!"}},
      {{"system", "Be kind."}, {"user", "Thanks"}, {"assistant", "You're welcome."}},
      {{"user", "Ann has 2 cats and gets 3 more. How many cats?"}, {"assistant", "2+3=<<2+3=5>>5\n#### 5"}},
      {{"user", "What is 3*4?"}, {"assistant", "3*4=12. The answer is: 12"}},
  };
  for (int64_t i = 0; i < data.size(); ++i) {
    TokenizedChat want = tokenize_conversation(tok, tpl, expected[size_t(i)]);
    EXPECT_EQ(std::vector<int32_t>(data.ids(i).begin(), data.ids(i).end()), want.ids) << "example " << i;
    EXPECT_EQ(std::vector<uint8_t>(data.trainable(i).begin(), data.trainable(i).end()), want.trainable) << "example " << i;
  }
  EXPECT_EQ(runs(data.ids(2), data.trainable(2)), (Strings{"Hey.<|im_end|>", "Bye!<|im_end|>"}));
  EXPECT_EQ(data.reports()[1].name, "chat");
  EXPECT_EQ(data.reports()[0].examples, 2);
  EXPECT_EQ(data.reports()[0].records, 2);
  EXPECT_EQ(data.reports()[0].cache, CacheUse::none);
  EXPECT_NE(data.summary().find("data: 6 examples from 5 dataset(s)"), std::string::npos) << data.summary();
}

TEST(DataTokenize, LabelsInABatchAreMinus100OutsideAssistantTokens) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3_tokenizer();
  ChatTemplate tpl(ChatTemplateKind::qwen3, tok);
  TokenizedDataset data = TokenizedDataset::from_examples({tokenize_conversation(tok, tpl, kTwoTurns)});
  DataLoader loader(data, {.batch_size = 1, .order = Order::sequential, .pad_to_multiple = 8, .pad_id = default_pad_id(tok)});
  Batch b = loader.next();
  ASSERT_EQ(b.B, 1);
  EXPECT_EQ(b.T % 8, 0);
  EXPECT_EQ(default_pad_id(tok), *tok.token_to_id("<|endoftext|>"));
  std::vector<int32_t> trained;
  for (int64_t t = 0; t < b.T; ++t) {
    if (b.labels[size_t(t)] != -100) {
      EXPECT_EQ(b.labels[size_t(t)], b.input_ids[size_t(t)]);
      trained.push_back(b.labels[size_t(t)]);
    }
  }
  EXPECT_EQ(tok.decode(trained), "Hello!<|im_end|>4, as 2+2=4.<|im_end|>");
  EXPECT_EQ(b.input_ids.back(), *tok.token_to_id("<|endoftext|>"));
}

// A file with every kind of bad record between two good ones.
std::string write_bad_file(const std::string& dir) {
  std::string path = dir + "/mixed.jsonl";
  write(path,
        "{\"instruction\": \"Q1\", \"output\": \"A1\"}\n"
        "{\"instruction\": \"Q2\", \"output\": \"A2\"\n"          // 2: invalid JSON
        "{\"instruction\": \"Q3\"}\n"                              // 3: missing field
        "{\"instruction\": \"Q4\", \"output\": [\"A4\"]}\n"        // 4: wrong type
        "{\"instruction\": \"Q5\", \"output\": \"\"}\n"            // 5: empty response
        "[\"not\", \"an object\"]\n"                               // 6: not an object
        "{\"instruction\": \"Q7\", \"output\": \"A7\"}\n");
  return path;
}

TEST(DataTokenize, BadRecordStopsTheLoadWithFileLineAndField) {
  LT_REQUIRE_QWEN3();
  std::string path = write_bad_file(temp_dir());
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, qwen3_tokenizer());
  std::vector<DatasetSpec> specs = resolve_datasets({path}, "");
  std::string e = error_of([&] { load_datasets(specs, qwen3_tokenizer(), tpl, {}); });
  EXPECT_EQ(e.rfind(path + ":2: invalid JSON (syntax error while parsing object", 0), 0u) << e;
  EXPECT_NE(e.find("(set on_bad_example: skip to skip such records)"), std::string::npos) << e;
  // Fixing line 2 moves the error to line 3.
  std::string text = read_file(path);
  text.replace(text.find("\"A2\"\n"), 5, "\"A2\"}\n");
  write(path, text);
  e = error_of([&] { load_datasets(specs, qwen3_tokenizer(), tpl, {}); });
  EXPECT_EQ(e.rfind(path + ":3: missing field 'output'", 0), 0u) << e;
}

TEST(DataTokenize, BadRecordsAreSkippedAndCountedWithSkip) {
  LT_REQUIRE_QWEN3();
  std::string path = write_bad_file(temp_dir());
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, qwen3_tokenizer());
  TokenizedDataset data = load_datasets(resolve_datasets({path}, ""), qwen3_tokenizer(), tpl,
                                        {.on_bad_example = OnBadExample::skip});
  ASSERT_EQ(data.size(), 2);
  EXPECT_EQ(runs(data.ids(1), data.trainable(1)), (Strings{"A7<|im_end|>"}));
  const DatasetReport& r = data.reports()[0];
  EXPECT_EQ(r.records, 7);
  EXPECT_EQ(r.bad, 5);
  EXPECT_EQ(r.examples, 2);
  ASSERT_EQ(r.bad_messages.size(), 5u);
  EXPECT_EQ(r.bad_messages[0].rfind(path + ":2: invalid JSON (", 0), 0u);
  EXPECT_EQ(r.bad_messages[1], path + ":3: missing field 'output'");
  EXPECT_EQ(r.bad_messages[2], path + ":4: field 'output': expected a string, got array");
  EXPECT_EQ(r.bad_messages[3], path + ":5: field 'output': empty response");
  EXPECT_EQ(r.bad_messages[4], path + ":6: expected a JSON object, got array");
  EXPECT_NE(r.summary().find("5 bad, skipped"), std::string::npos) << r.summary();
}

TEST(DataTokenize, AConversationTheTemplateRefusesIsABadRecord) {
  // Qwen3.5's template raises on a conversation without a user query (here the only user turn wraps a tool
  // response): that record is named by file and line, and skipped with on_bad_example: skip.
  LT_REQUIRE_QWEN3();
  std::string dir = temp_dir();
  write(dir + "/d.jsonl",
        "{\"instruction\": \"Q1\", \"output\": \"A1\"}\n"
        "{\"instruction\": \"<tool_response>r</tool_response>\", \"output\": \"A2\"}\n");
  ChatTemplate tpl(ChatTemplateKind::qwen3_5, qwen3_tokenizer());
  const std::vector<DatasetSpec> specs = resolve_datasets({dir + "/d.jsonl"}, "");
  const std::string e = error_of([&] { load_datasets(specs, qwen3_tokenizer(), tpl, {}); });
  EXPECT_EQ(e.rfind(dir + "/d.jsonl:2: chat template qwen3_5: no user message", 0), 0u) << e;
  TokenizedDataset data = load_datasets(specs, qwen3_tokenizer(), tpl, {.on_bad_example = OnBadExample::skip});
  ASSERT_EQ(data.size(), 1);
  EXPECT_EQ(runs(data.ids(0), data.trainable(0)), (Strings{"A1<|im_end|>"}));
  EXPECT_EQ(data.reports()[0].bad, 1);
}

TEST(DataTokenize, SkippedRecordsKeepOnlyTheFirstMessages) {
  LT_REQUIRE_QWEN3();
  std::string dir = temp_dir();
  std::string text = "{\"instruction\": \"Q\", \"output\": \"A\"}\n";
  for (int i = 0; i < 25; ++i) text += "{\"instruction\": \"Q\"}\n";
  write(dir + "/d.jsonl", text);
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, qwen3_tokenizer());
  TokenizedDataset data = load_datasets(resolve_datasets({dir + "/d.jsonl"}, ""), qwen3_tokenizer(), tpl,
                                        {.on_bad_example = OnBadExample::skip});
  EXPECT_EQ(data.reports()[0].bad, 25);
  EXPECT_EQ(data.reports()[0].bad_messages.size(), DatasetReport::kMaxBadMessages);
}

TEST(DataTokenize, CutoffPoliciesAreCountedAndReported) {
  LT_REQUIRE_QWEN3();
  std::string dir = temp_dir();
  std::string long_answer;
  for (int i = 0; i < 40; ++i) long_answer += "word ";
  std::string long_prompt = long_answer + long_answer;
  write(dir + "/d.jsonl", "{\"instruction\": \"short\", \"output\": \"ok\"}\n"
                          "{\"instruction\": \"q\", \"output\": \"" + long_answer + "\"}\n"
                          "{\"instruction\": \"" + long_prompt + "\", \"output\": \"a\"}\n");
  ChatTemplate tpl(ChatTemplateKind::qwen3, qwen3_tokenizer());
  auto specs = resolve_datasets({dir + "/d.jsonl"}, "");
  TokenizedDataset trunc = load_datasets(specs, qwen3_tokenizer(), tpl, {.cutoff_len = 32});
  EXPECT_EQ(trunc.size(), 2);
  EXPECT_EQ(trunc.length(1), 32);
  EXPECT_EQ(trunc.max_length(), 32);
  EXPECT_EQ(trunc.reports()[0].truncated, 1);
  EXPECT_EQ(trunc.reports()[0].dropped_no_target, 1);
  TokenizedDataset drop = load_datasets(specs, qwen3_tokenizer(), tpl, {.cutoff_len = 32, .overlong = Overlong::drop});
  EXPECT_EQ(drop.size(), 1);
  EXPECT_EQ(drop.reports()[0].dropped_overlong, 2);
  EXPECT_NE(drop.reports()[0].summary().find("2 longer than cutoff_len, dropped"), std::string::npos);
  std::string e = error_of([&] { load_datasets(specs, qwen3_tokenizer(), tpl, {.cutoff_len = 4, .overlong = Overlong::drop}); });
  EXPECT_NE(e.find("no examples left to train on"), std::string::npos) << e;
}

// Every example's ids and flags, for comparing loads.
std::vector<TokenizedChat> all(const TokenizedDataset& d) {
  std::vector<TokenizedChat> out;
  for (int64_t i = 0; i < d.size(); ++i)
    out.push_back({{d.ids(i).begin(), d.ids(i).end()}, {d.trainable(i).begin(), d.trainable(i).end()}});
  return out;
}

bool same(const std::vector<TokenizedChat>& a, const std::vector<TokenizedChat>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].ids != b[i].ids || a[i].trainable != b[i].trainable) return false;
  return true;
}

TEST(DataTokenize, CacheIsHitOnRestartAndGivesTheSameExamples) {
  LT_REQUIRE_QWEN3();
  std::string dir = temp_dir();
  std::vector<DatasetSpec> specs = write_mix(dir);
  ChatTemplate tpl(ChatTemplateKind::qwen3, qwen3_tokenizer());
  TokenizeOptions opt{.cutoff_len = 64, .cache_dir = dir + "/cache"};
  TokenizedDataset first = load_datasets(specs, qwen3_tokenizer(), tpl, opt);
  for (const DatasetReport& r : first.reports()) {
    EXPECT_EQ(r.cache, CacheUse::built) << r.summary();
    EXPECT_TRUE(fs::exists(r.cache_path)) << r.cache_path;
  }
  TokenizedDataset second = load_datasets(specs, qwen3_tokenizer(), tpl, opt);
  for (const DatasetReport& r : second.reports()) EXPECT_EQ(r.cache, CacheUse::hit) << r.summary();
  EXPECT_TRUE(same(all(first), all(second)));
  EXPECT_EQ(first.key(), second.key());
  EXPECT_EQ(second.reports()[0].examples, first.reports()[0].examples);
  EXPECT_EQ(second.reports()[0].trainable_tokens, first.reports()[0].trainable_tokens);
  EXPECT_NE(second.summary().find("cache hit"), std::string::npos);

  // What changes the result changes the key: the data, the cutoff, the template, the policies.
  auto path_of = [&](const TokenizeOptions& o, const ChatTemplate& t) {
    return load_datasets({specs[3]}, qwen3_tokenizer(), t, o).reports()[0];
  };
  DatasetReport base = path_of(opt, tpl);
  EXPECT_EQ(base.cache, CacheUse::hit);
  TokenizeOptions other_cutoff = opt;
  other_cutoff.cutoff_len = 65;
  EXPECT_EQ(path_of(other_cutoff, tpl).cache, CacheUse::built);
  TokenizeOptions other_policy = opt;
  other_policy.on_bad_example = OnBadExample::skip;
  EXPECT_EQ(path_of(other_policy, tpl).cache, CacheUse::built);
  EXPECT_EQ(path_of(opt, ChatTemplate(ChatTemplateKind::qwen2_5, qwen3_tokenizer())).cache, CacheUse::built);
  write(dir + "/gsm8k.jsonl", R"({"question": "Q?", "answer": "A"})" "\n");
  DatasetReport changed = path_of(opt, tpl);
  EXPECT_EQ(changed.cache, CacheUse::built);
  EXPECT_NE(changed.cache_path, base.cache_path);
}

TEST(DataTokenize, CorruptOrTruncatedCacheIsRebuiltNeverTrusted) {
  LT_REQUIRE_QWEN3();
  std::string dir = temp_dir();
  write(dir + "/d.jsonl", "{\"instruction\": \"Q1\", \"output\": \"A1\"}\n{\"instruction\": \"Q2\", \"output\": \"A2\"}\n");
  auto specs = resolve_datasets({dir + "/d.jsonl"}, "");
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, qwen3_tokenizer());
  TokenizeOptions opt{.cache_dir = dir + "/cache"};
  TokenizedDataset fresh = load_datasets(specs, qwen3_tokenizer(), tpl, opt);
  const std::string cache = fresh.reports()[0].cache_path;
  const std::string good = read_file(cache);
  // `fresh` maps the cache, and this test rewrites that file in place (LazyTrain never does: it writes a new
  // file and renames it over, so a mapping keeps the old one), so its examples are copied first.
  const std::vector<TokenizedChat> expected = all(fresh);

  struct Case {
    std::string name, bytes, why;
  };
  std::string flipped = good;
  flipped[64 + 8 * 3 + 5] ^= 0x40;  // a byte of the token ids
  std::string wrong_key = good;
  wrong_key[16] ^= 1;
  std::string wrong_version = good;
  wrong_version[8] = 9;
  const std::vector<Case> cases = {
      {"flipped", flipped, "payload checksum mismatch"},
      {"truncated", good.substr(0, good.size() - 3), "(truncated?)"},
      {"header only", good.substr(0, 40), "shorter than the 64-byte header"},
      {"wrong key", wrong_key, "key "},
      {"wrong version", wrong_version, "format version 9"},
      {"not ours", std::string(100, 'x'), "bad magic"},
  };
  for (const Case& c : cases) {
    write(cache, c.bytes);
    TokenizedDataset again = load_datasets(specs, qwen3_tokenizer(), tpl, opt);
    const DatasetReport& r = again.reports()[0];
    EXPECT_EQ(r.cache, CacheUse::rebuilt) << c.name;
    EXPECT_NE(r.cache_note.find(c.why), std::string::npos) << c.name << ": " << r.cache_note;
    EXPECT_TRUE(same(all(again), expected)) << c.name;
    EXPECT_EQ(read_file(cache), good) << c.name << ": the rebuilt cache is written back";
  }
}

// A data set of `n` alpaca records, some long, every 97th malformed (for on_bad_example: skip), as JSON Lines.
std::string write_many(const std::string& dir, int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    if (i % 97 == 13) {
      text += "{\"instruction\": \"broken\"\n";
      continue;
    }
    std::string answer = fmt::format("Answer {}: ", i);
    for (int k = 0; k < (i % 7) * 9; ++k) answer += fmt::format("word{} ", (i * 31 + k) % 1000);
    text += nlohmann::json{{"instruction", fmt::format("Question {}?", i)}, {"output", answer}}.dump() + "\n";
  }
  write(dir + "/many.jsonl", text);
  return dir + "/many.jsonl";
}

TEST(DataTokenize, StreamedIntoTheCacheEqualsTokenisedInMemory) {
  LT_REQUIRE_QWEN3();
  const std::string dir = temp_dir();
  const auto specs = resolve_datasets({write_many(dir, 3000)}, "");  // three chunks of records and more
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, qwen3_tokenizer());
  TokenizeOptions memory_opt{.cutoff_len = 96, .on_bad_example = OnBadExample::skip};
  TokenizeOptions cache_opt = memory_opt;
  cache_opt.cache_dir = dir + "/cache";
  const TokenizedDataset memory = load_datasets(specs, qwen3_tokenizer(), tpl, memory_opt);
  const TokenizedDataset built = load_datasets(specs, qwen3_tokenizer(), tpl, cache_opt);
  const TokenizedDataset hit = load_datasets(specs, qwen3_tokenizer(), tpl, cache_opt);
  ASSERT_EQ(built.reports()[0].cache, CacheUse::built) << built.reports()[0].summary();
  ASSERT_EQ(hit.reports()[0].cache, CacheUse::hit);
  EXPECT_GT(memory.reports()[0].truncated, 0);
  EXPECT_EQ(memory.reports()[0].bad, 31);
  for (const TokenizedDataset* d : {&built, &hit}) {
    EXPECT_TRUE(same(all(*d), all(memory)));
    EXPECT_EQ(d->reports()[0].to_json(), memory.reports()[0].to_json());
    EXPECT_EQ(d->key(), memory.key());
    EXPECT_EQ(d->max_length(), memory.max_length());
  }
}

// Fails the `fail_at`-th call of kind `op` (counting only calls on paths under `under`) with `error`.
struct CacheFault {
  std::map<IoOp, int> calls;
  IoOp op = IoOp::write;
  int fail_at = -1;
  int error = ENOSPC;
  explicit CacheFault(const std::string& under) {
    set_io_fault_hook([this, under](IoOp o, const std::string& path) {
      if (path.find(under) == std::string::npos) return IoFault{};
      return calls[o]++ == fail_at && o == op ? IoFault{error} : IoFault{};
    });
  }
  ~CacheFault() { set_io_fault_hook({}); }
};

TEST(DataTokenize, ACacheThatCannotBeWrittenIsNotFatalAndLeavesNothing) {
  LT_REQUIRE_QWEN3();
  const std::string dir = temp_dir();
  const auto specs = resolve_datasets({write_many(dir, 1500)}, "");
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, qwen3_tokenizer());
  const TokenizeOptions memory_opt{.cutoff_len = 400, .on_bad_example = OnBadExample::skip};
  TokenizeOptions opt = memory_opt;
  opt.cache_dir = dir + "/cache";
  const std::vector<TokenizedChat> expected = all(load_datasets(specs, qwen3_tokenizer(), tpl, memory_opt));
  std::map<IoOp, int> per_build;
  {
    CacheFault count(opt.cache_dir);
    load_datasets(specs, qwen3_tokenizer(), tpl, opt);
    per_build = count.calls;
  }
  ASSERT_GE(per_build[IoOp::write], 3);  // buffered ids, the sections copied in, the header
  int cases = 0;
  for (const auto& [op, err] : {std::pair{IoOp::write, ENOSPC}, {IoOp::write, EIO}, {IoOp::fsync, EIO},
                                {IoOp::rename, EROFS}}) {
    for (int k = 0; k < per_build[op]; ++k) {
      fs::remove_all(opt.cache_dir);
      const std::string what = fmt::format("{} #{} fails with {}", io_op_name(op), k, std::strerror(err));
      CacheFault fault(opt.cache_dir);
      fault.op = op, fault.fail_at = k, fault.error = err;
      const TokenizedDataset d = load_datasets(specs, qwen3_tokenizer(), tpl, opt);
      const DatasetReport& r = d.reports()[0];
      ++cases;
      EXPECT_EQ(r.cache, CacheUse::none) << what;
      EXPECT_NE(r.cache_note.find("could not write the cache"), std::string::npos) << what << ": " << r.cache_note;
      EXPECT_NE(r.cache_note.find(std::strerror(err)), std::string::npos) << what << ": " << r.cache_note;
      EXPECT_TRUE(same(all(d), expected)) << what;
      EXPECT_EQ(r.examples, int64_t(expected.size())) << what << ": counted once, not once per pass";
      // No temporary is left, and a cache file only when the failure came after its rename (the directory's
      // fsync): then it is whole, and the next load uses it.
      bool left = false;
      for (const auto& e : fs::directory_iterator(opt.cache_dir)) {
        EXPECT_EQ(e.path().string(), r.cache_path) << what << ": left " << e.path().filename();
        left = true;
      }
      if (left) {
        set_io_fault_hook({});
        const TokenizedDataset again = load_datasets(specs, qwen3_tokenizer(), tpl, opt);
        EXPECT_EQ(again.reports()[0].cache, CacheUse::hit) << what;
        EXPECT_TRUE(same(all(again), expected)) << what;
      }
    }
  }
  EXPECT_GE(cases, 6);
  // Without faults the next load builds it.
  EXPECT_EQ(load_datasets(specs, qwen3_tokenizer(), tpl, opt).reports()[0].cache, CacheUse::built);
}

TEST(DataTokenize, TokenizerNotFromAFileIsNeverCached) {
  LT_REQUIRE_QWEN3();
  std::string dir = temp_dir();
  write(dir + "/d.jsonl", "{\"instruction\": \"Q1\", \"output\": \"A1\"}\n");
  Tokenizer mem = Tokenizer::from_json(read_json_file(testing::qwen3_dir() + "/tokenizer.json"),
                                       read_json_file(testing::qwen3_dir() + "/tokenizer_config.json"), "in memory");
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, mem);
  TokenizedDataset d = load_datasets(resolve_datasets({dir + "/d.jsonl"}, ""), mem, tpl, {.cache_dir = dir + "/cache"});
  EXPECT_EQ(d.reports()[0].cache, CacheUse::none);
  EXPECT_NE(d.reports()[0].cache_note.find("not loaded from a file"), std::string::npos) << d.reports()[0].cache_note;
  EXPECT_FALSE(fs::exists(dir + "/cache") && !fs::is_empty(dir + "/cache"));
}

}  // namespace
}  // namespace lt
