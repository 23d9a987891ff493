// Dataset formats: every format's conversion, format detection, the dataset_info.json registry with
// column and tag mapping, splitting JSON / JSONL files into records with line numbers, and every kind
// of bad record named with its field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "testing/files_testing.h"
#include "core/error.h"
#include "train/data_format.h"

namespace lt {

// For comparing message lists (found by argument-dependent lookup, so it lives in lt).
bool operator==(const ChatMessage& a, const ChatMessage& b) { return a.role == b.role && a.content == b.content; }

namespace {

namespace fs = std::filesystem;
using Messages = std::vector<ChatMessage>;

std::string dump(const Messages& m) {
  std::string s;
  for (const ChatMessage& x : m) s += "[" + x.role + "] " + x.content + "\n";
  return s;
}

#define EXPECT_MESSAGES(actual, ...)                       \
  do {                                                     \
    Messages expected_ = __VA_ARGS__;                      \
    Messages actual_ = (actual);                           \
    EXPECT_TRUE(actual_ == expected_) << "got:\n" << dump(actual_) << "expected:\n" << dump(expected_); \
  } while (0)

// A fresh directory per test.
std::string temp_dir() { return testing::fresh_test_dir("lt_data_format_"); }
using testing::error_of;
void write(const std::string& path, const std::string& text) { testing::write_text_file(path, text); }

DatasetSpec spec(std::string_view format) { return dataset_spec_for_format(format, "t", "t.jsonl"); }

Messages ok(std::string_view text, const DatasetSpec& s) {
  ConvertedRecord r = convert_record(text, 1, s);
  EXPECT_EQ(r.error, "") << text;
  return r.messages;
}

std::string bad(std::string_view text, const DatasetSpec& s) {
  ConvertedRecord r = convert_record(text, 1, s);
  EXPECT_TRUE(r.messages.empty()) << text;
  return r.error;
}

TEST(DataFormat, AlpacaJoinsInstructionAndInputWithSystemAndHistory) {
  DatasetSpec s = spec("alpaca");
  EXPECT_MESSAGES(ok(R"({"instruction": "Translate.", "input": "Bonjour", "output": "Hello"})", s),
                  {{"user", "Translate.\nBonjour"}, {"assistant", "Hello"}});
  EXPECT_MESSAGES(ok(R"({"instruction": "Say hi.", "input": "", "output": "Hi"})", s),
                  {{"user", "Say hi."}, {"assistant", "Hi"}});
  EXPECT_MESSAGES(ok(R"({"instruction": "Say hi.", "output": "Hi", "input": null, "system": null, "history": null})", s),
                  {{"user", "Say hi."}, {"assistant", "Hi"}});
  EXPECT_MESSAGES(ok(R"({"instruction": "", "input": "only input", "output": "Hi"})", s),
                  {{"user", "only input"}, {"assistant", "Hi"}});
  EXPECT_MESSAGES(ok(R"({"instruction": "Q3", "input": "", "output": "A3", "system": "Be brief.",
                        "history": [["Q1", "A1"], ["Q2", "A2"]]})", s),
                  {{"system", "Be brief."}, {"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2"},
                   {"user", "Q3"}, {"assistant", "A3"}});
  // An empty system prompt is no system message (the template's default applies).
  EXPECT_MESSAGES(ok(R"({"instruction": "Q", "output": "A", "system": ""})", s), {{"user", "Q"}, {"assistant", "A"}});
}

TEST(DataFormat, ShareGptTurnsSystemFirstOrFromColumn) {
  DatasetSpec s = spec("sharegpt");
  EXPECT_MESSAGES(ok(R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q1"},
                          {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}]})", s),
                  {{"system", "S"}, {"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2"}});
  EXPECT_MESSAGES(ok(R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "system": "S2"})", s),
                  {{"system", "S2"}, {"user", "Q"}, {"assistant", "A"}});
}

TEST(DataFormat, OpenAiMessages) {
  DatasetSpec s = spec("openai");
  EXPECT_MESSAGES(ok(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                        {"role": "assistant", "content": "A"}]})", s),
                  {{"system", "S"}, {"user", "Q"}, {"assistant", "A"}});
  EXPECT_MESSAGES(ok(R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})", s),
                  {{"user", "Q"}, {"assistant", "A"}});
}

TEST(DataFormat, MetaMathQaAndGsm8k) {
  EXPECT_MESSAGES(ok(R"({"query": "What is 2+2?", "response": "2+2=4. The answer is: 4", "type": "GSM_Rephrased"})",
                     spec("metamath")),
                  {{"user", "What is 2+2?"}, {"assistant", "2+2=4. The answer is: 4"}});
  EXPECT_MESSAGES(ok(R"({"question": "Tom has 3 apples and eats 1. How many are left?", "answer": "3-1=<<3-1=2>>2\n#### 2"})",
                     spec("gsm8k")),
                  {{"user", "Tom has 3 apples and eats 1. How many are left?"}, {"assistant", "3-1=<<3-1=2>>2\n#### 2"}});
  EXPECT_EQ(bad(R"({"question": "Q"})", spec("gsm8k")), "missing field 'answer'");
  EXPECT_EQ(bad(R"({"response": "R"})", spec("metamath")), "missing field 'query'");
}

TEST(DataFormat, DetectsTheFormatFromTheFirstRecord) {
  DatasetSpec d;
  d.name = "x";
  d.path = "x.jsonl";
  auto detect = [&](std::string_view rec) { return detect_dataset_spec(d, rec, "x.jsonl", 1); };
  EXPECT_EQ(detect(R"({"instruction": "", "input": "", "output": ""})").describe(), spec("alpaca").describe());
  EXPECT_EQ(detect(R"({"conversations": [{"from": "human", "value": "q"}]})").describe(), spec("sharegpt").describe());
  EXPECT_EQ(detect(R"({"messages": []})").describe(), spec("openai").describe());
  EXPECT_EQ(detect(R"({"query": "q", "response": "r", "type": "MATH_AnsAug"})").describe(), spec("metamath").describe());
  EXPECT_EQ(detect(R"({"question": "q", "answer": "a"})").describe(), spec("gsm8k").describe());
  // "conversations" holding role/content turns.
  DatasetSpec rc = detect(R"({"conversations": [{"role": "user", "content": "q"}]})");
  EXPECT_EQ(rc.columns.messages, "conversations");
  EXPECT_EQ(rc.tags.role, "role");
  EXPECT_EQ(rc.tags.assistant, "assistant");
  std::string e = error_of([&] { detect(R"({"prompt": "p", "completion": "c"})"); });
  EXPECT_NE(e.find("x.jsonl:1: cannot tell the dataset format from the fields [completion, prompt]"), std::string::npos) << e;
  // An explicit format is kept.
  DatasetSpec g = spec("gsm8k");
  EXPECT_EQ(detect_dataset_spec(g, R"({"instruction": "i"})", "p", 1).describe(), g.describe());
}

TEST(DataFormat, RegistryEntriesMapColumnsAndTags) {
  const std::string src = "data/dataset_info.json";
  // Defaults: alpaca, instruction/input/output, no history or system column.
  DatasetSpec a = parse_dataset_info_entry(nlohmann::json::parse(R"({"file_name": "a.json"})"), "a", "data", src);
  EXPECT_EQ(a.formatting, DataFormatting::alpaca);
  EXPECT_EQ(a.path, "data/a.json");
  EXPECT_EQ(a.columns.history, "");
  EXPECT_MESSAGES(ok(R"({"instruction": "Q", "output": "A", "system": "ignored", "history": [["x", "y"]]})", a),
                  {{"user", "Q"}, {"assistant", "A"}});

  // MetaMathQA through columns; "columns" replaces the defaults wholesale, so "input" is not read.
  DatasetSpec mm = parse_dataset_info_entry(
      nlohmann::json::parse(R"({"file_name": "mm.json", "columns": {"prompt": "query", "response": "response"}})"), "mm",
      "data", src);
  EXPECT_EQ(mm.columns.query, "");
  EXPECT_MESSAGES(ok(R"({"query": "Q", "response": "R", "input": "not used"})", mm), {{"user", "Q"}, {"assistant", "R"}});

  // sharegpt with OpenAI-style tags (LLaMA-Factory's way of reading {"messages": [{role, content}]}).
  DatasetSpec sg = parse_dataset_info_entry(nlohmann::json::parse(R"({
      "file_name": "m.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages", "system": "sys"},
      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
               "system_tag": "system"}})"), "m", "data", src);
  EXPECT_MESSAGES(ok(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                        {"role": "assistant", "content": "A"}]})", sg),
                  {{"system", "S"}, {"user", "Q"}, {"assistant", "A"}});
  EXPECT_MESSAGES(ok(R"({"sys": "S3", "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})", sg),
                  {{"system", "S3"}, {"user", "Q"}, {"assistant", "A"}});
  // Tags given without system_tag: a system turn is then an unknown role, as in LLaMA-Factory.
  DatasetSpec ns = parse_dataset_info_entry(nlohmann::json::parse(R"({
      "file_name": "m.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}})"),
      "m", "data", src);
  EXPECT_EQ(bad(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                   {"role": "assistant", "content": "A"}]})", ns),
            "field 'messages[0].role': unknown role 'system' (expected 'user' or 'assistant')");
  DatasetSpec oa = parse_dataset_info_entry(nlohmann::json::parse(R"({"file_name": "o.jsonl", "formatting": "openai"})"),
                                            "o", "data", src);
  EXPECT_EQ(oa.formatting, DataFormatting::sharegpt);
  EXPECT_EQ(oa.columns.messages, "messages");
  EXPECT_EQ(oa.columns.system, "");  // no system column unless "columns" names one; a system turn still works
  EXPECT_EQ(oa.tags.role, "role");
  EXPECT_EQ(oa.tags.system, "system");
}

TEST(DataFormat, RegistryRefusesWhatItCannotHonour) {
  auto err = [](std::string_view entry) {
    return error_of([&] { parse_dataset_info_entry(nlohmann::json::parse(entry), "d", "data", "info.json"); });
  };
  EXPECT_NE(err(R"({"hf_hub_url": "tatsu-lab/alpaca"})").find("info.json: dataset 'd': \"hf_hub_url\" is not supported"),
            std::string::npos);
  EXPECT_NE(err(R"({"file_name": "a", "ranking": true})").find("preference data"), std::string::npos);
  EXPECT_NE(err(R"({"file_name": "a", "num_samples": 10})").find("num_samples"), std::string::npos);
  EXPECT_NE(err(R"({"file_name": "a", "column": {}})").find("unknown key \"column\""), std::string::npos);
  EXPECT_NE(err(R"({"file_name": "a", "formatting": "sharegpt", "columns": {"tools": "tools"}})").find("column \"tools\" is not supported"),
            std::string::npos);
  EXPECT_NE(err(R"({"file_name": "a", "columns": {"messages": "m"}})").find("does not apply to formatting alpaca"),
            std::string::npos);
  EXPECT_NE(err(R"({"file_name": "a", "formatting": "sharegpt", "tags": {"role_tag": "r"}})").find("must name role_tag"),
            std::string::npos);
  EXPECT_NE(err(R"({"file_name": "a", "formatting": "xml"})").find("formatting 'xml' is not supported"), std::string::npos);
  EXPECT_NE(err(R"({"formatting": "alpaca"})").find("\"file_name\" (a string) is required"), std::string::npos);
}

TEST(DataFormat, ResolvesNamesThroughTheRegistryThenPaths) {
  std::string dir = temp_dir();
  write(dir + "/dataset_info.json", R"({"reg": {"file_name": "reg.json", "columns": {"prompt": "q", "response": "a"}}})");
  write(dir + "/reg.json", "[]");
  write(dir + "/plain.jsonl", "");
  std::vector<DatasetSpec> specs = resolve_datasets(split_dataset_list(" reg , plain.jsonl"), dir);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "reg");
  EXPECT_EQ(specs[0].path, dir + "/reg.json");
  EXPECT_EQ(specs[0].columns.prompt, "q");
  EXPECT_EQ(specs[1].path, dir + "/plain.jsonl");
  EXPECT_EQ(specs[1].formatting, DataFormatting::detect);
  std::string e = error_of([&] { resolve_datasets({"nope"}, dir); });
  EXPECT_NE(e.find("dataset 'nope': not in " + dir + "/dataset_info.json, and no such file (looked at " + dir +
                   "/nope and nope)"), std::string::npos) << e;
  // An absolute path is one place, named once.
  e = error_of([&] { resolve_datasets({dir + "/absent.jsonl"}, dir); });
  EXPECT_EQ(e.find("looked at"), std::string::npos) << e;
  EXPECT_NE(error_of([] { split_dataset_list("a,,b"); }).find("empty name"), std::string::npos);
  // A directory is every .json / .jsonl file in it, by name.
  fs::create_directories(dir + "/many");
  write(dir + "/many/b.jsonl", "");
  write(dir + "/many/a.json", "");
  write(dir + "/many/notes.txt", "");
  DatasetSpec many = resolve_datasets({"many"}, dir)[0];
  EXPECT_EQ(dataset_files(many), (std::vector<std::string>{dir + "/many/a.json", dir + "/many/b.jsonl"}));
}

// A name or a registry's file_name past NAME_MAX (found by fuzz_dataset_info): an lt::Error naming the path, not
// std::filesystem's exception.
TEST(DataFormat, ANameTooLongForTheFileSystemIsAnErrorNamingIt) {
  const std::string dir = temp_dir();
  const std::string name(300, 'q');
  write(dir + "/dataset_info.json", R"({"reg": {"file_name": ")" + name + R"("}})");
  std::string e = error_of([&] { resolve_datasets({name}, dir); });
  EXPECT_NE(e.find(dir + "/" + name + ": cannot look at this path: File name too long"), std::string::npos) << e;
  const DatasetSpec reg = resolve_datasets({"reg"}, dir)[0];
  e = error_of([&] { dataset_files(reg); });
  EXPECT_NE(e.find(dir + "/" + name + ": cannot look at this path"), std::string::npos) << e;
}

TEST(DataFormat, SplitsJsonLinesWithLineNumbers) {
  std::string text = "\xEF\xBB\xBF{\"a\": 1}\r\n\n   \n{\"b\": 2}\n{broken\n";
  std::vector<DataRecord> r = split_records(text, "f.jsonl");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].text, "{\"a\": 1}");
  EXPECT_EQ(r[0].line, 1);
  EXPECT_EQ(r[1].text, "{\"b\": 2}");
  EXPECT_EQ(r[1].line, 4);
  EXPECT_EQ(r[2].text, "{broken");
  EXPECT_EQ(r[2].line, 5);
  EXPECT_TRUE(split_records("", "e.jsonl").empty());
}

TEST(DataFormat, SplitsJsonArraysIntoRecordsWithTheirLines) {
  std::string text =
      "\n[\n"
      "  {\"instruction\": \"a [tricky], {string} \\\" with \\\\\", \"output\": \"x\"},\n"
      "  {\n"
      "    \"instruction\": \"multi\\nline\",\n"
      "    \"output\": [1, {\"k\": \"]\"}]\n"
      "  }\n"
      "  ,{\"x\": 1}\n"
      "]\n";
  std::vector<DataRecord> r = split_records(text, "f.json");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].line, 3);
  EXPECT_EQ(nlohmann::json::parse(r[0].text)["instruction"], "a [tricky], {string} \" with \\");
  EXPECT_EQ(r[1].line, 4);
  EXPECT_EQ(nlohmann::json::parse(r[1].text)["output"][1]["k"], "]");
  EXPECT_EQ(r[2].line, 8);
  EXPECT_TRUE(split_records(" [ ] ", "e.json").empty());
  // A trailing comma leaves an empty element, reported as a bad record, not a broken file.
  std::vector<DataRecord> t = split_records("[{\"a\": 1},\n]", "t.json");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1].text, "");
  EXPECT_EQ(t[1].line, 2);
  EXPECT_EQ(convert_record(t[1].text, t[1].line, spec("alpaca")).error,
            "invalid JSON (an empty array element: a doubled or trailing comma)");
}

TEST(DataFormat, BrokenArrayStructureIsRefusedWithItsLine) {
  EXPECT_NE(error_of([] { split_records("[\n{\"a\": 1},\n{\"a\": \"open", "f.json"); })
                .find("f.json:3: invalid JSON: a string in the record starting here is never closed"),
            std::string::npos);
  EXPECT_NE(error_of([] { split_records("[\n{\"a\": [1, 2}\n, {}]", "f.json"); })
                .find("f.json:2: invalid JSON: the record starting here never ends"),
            std::string::npos);
  EXPECT_NE(error_of([] { split_records("[{\"a\": 1}] x", "f.json"); }).find("f.json:1: invalid JSON: unexpected text after"),
            std::string::npos);
  EXPECT_NE(error_of([] { split_records("[\n\n", "f.json"); }).find("f.json:1: invalid JSON: the array opened here is never closed"),
            std::string::npos);
}

// Every record (text and line) a reader gives, or the error that stopped it after those.
struct ReadAll {
  std::vector<std::pair<std::string, int64_t>> records;
  std::string error;
  bool operator==(const ReadAll&) const = default;
};
ReadAll read_all(RecordReader& reader) {
  ReadAll out;
  out.error = testing::error_of([&] {
    for (DataRecord r; reader.next(r);) out.records.emplace_back(std::string(r.text), r.line);
  });
  return out;
}

TEST(DataFormat, StreamedRecordsEqualTheWholeFileAtEveryChunkSize) {
  // Each input read whole (in place) is the reference; read a chunk at a time every boundary falls somewhere
  // else: inside a BOM, a CRLF, an escape, a multi-line string, a record, the whitespace before the array.
  const std::vector<std::string> inputs = {
      "\xEF\xBB\xBF{\"a\": 1}\r\n\n   \n{\"b\": 2}\n{broken\n",
      "{\"a\": \"no final newline\"}",
      "\n\n  \n",
      "",
      "\xEF\xBB\xBF",
      "\n[\n  {\"instruction\": \"a [tricky], {string} \\\" with \\\\\", \"output\": \"x\"},\n  {\n"
      "    \"instruction\": \"multi\\nline\",\n    \"output\": [1, {\"k\": \"]\"}]\n  }\n  ,{\"x\": 1}\n]\n",
      "\xEF\xBB\xBF \t[ ] \n",
      "[{\"a\": 1},\n]",
      "[{\"s\": \"raw\nnewline \\\\\"}, {\"t\": \"\\\"\"}]",
      // broken: each stops after the records before the break, with the whole-file message
      "[\n{\"a\": 1},\n{\"a\": \"open",
      "[\n{\"a\": [1, 2}\n, {}]",
      "[{\"a\": 1}] x",
      "[\n\n",
      "[{\"a\": 1}, {\"b\": 2}}",
      "[{\"a\": \"ends in a backslash\\",
  };
  const std::string dir = testing::fresh_test_dir("lt_records_");
  for (size_t i = 0; i < inputs.size(); ++i) {
    RecordReader whole(inputs[i], "f.json");
    const ReadAll expected = read_all(whole);
    for (size_t chunk : {1u, 2u, 3u, 5u, 7u, 16u, 64u, 4096u}) {
      RecordReader chunked(inputs[i], "f.json", chunk);
      EXPECT_EQ(read_all(chunked), expected) << "input " << i << ", chunks of " << chunk;
    }
    const std::string path = dir + "/f.json";
    testing::write_text_file(path, inputs[i]);
    for (size_t chunk : {size_t(1), size_t(3), RecordReader::kChunkBytes}) {
      RecordReader file(path, chunk);
      ReadAll got = read_all(file);
      EXPECT_EQ(got.records, expected.records) << "input " << i << " from a file, chunks of " << chunk;
      EXPECT_EQ(got.error.empty(), expected.error.empty()) << got.error;
    }
  }
  EXPECT_NE(testing::error_of([&] { RecordReader r(dir + "/absent.jsonl"); }).find("absent.jsonl: cannot open"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { RecordReader r(dir); }).find("is a directory"), std::string::npos);
}

TEST(DataFormat, InvalidJsonNamesTheLineInsideAMultiLineRecord) {
  ConvertedRecord r = convert_record("{\n  \"instruction\": \"q\",\n  \"output\": tru\n}", 10, spec("alpaca"));
  EXPECT_EQ(r.error_line, 12);
  EXPECT_EQ(r.error.rfind("invalid JSON (syntax error while parsing value - invalid literal", 0), 0u) << r.error;
  EXPECT_EQ(bad(R"(["instruction", "output"])", spec("alpaca")), "expected a JSON object, got array");
  EXPECT_EQ(bad(R"("text")", spec("alpaca")), "expected a JSON object, got string");
}

TEST(DataFormat, AlpacaBadRecordsNameTheField) {
  DatasetSpec s = spec("alpaca");
  EXPECT_EQ(bad(R"({"instruction": "q"})", s), "missing field 'output'");
  EXPECT_EQ(bad(R"({"output": "a"})", s), "missing field 'instruction'");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": 42})", s), "field 'output': expected a string, got number");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": null})", s), "field 'output': expected a string, got null");
  EXPECT_EQ(bad(R"({"instruction": ["q"], "output": "a"})", s), "field 'instruction': expected a string, got array");
  EXPECT_EQ(bad(R"({"instruction": "q", "input": 3, "output": "a"})", s), "field 'input': expected a string, got number");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": "a", "system": {}})", s), "field 'system': expected a string, got object");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": ""})", s), "field 'output': empty response");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": " \n "})", s), "field 'output': empty response");
  EXPECT_EQ(bad(R"({"instruction": "", "input": "", "output": "a"})", s), "fields 'instruction' and 'input': empty prompt");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": "a", "history": "x"})", s),
            "field 'history': expected an array of [query, response] pairs, got string");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": "a", "history": [["q0"]]})", s),
            "field 'history[0]': expected a [query, response] pair of strings, got [\"q0\"]");
  EXPECT_EQ(bad(R"({"instruction": "q", "output": "a", "history": [["q0", "a0"], ["q1", ""]]})", s),
            "field 'history[1][1]': empty response");
}

TEST(DataFormat, ShareGptBadRecordsNameTheTurn) {
  DatasetSpec s = spec("sharegpt");
  EXPECT_EQ(bad(R"({"messages": []})", s), "missing field 'conversations'");
  EXPECT_EQ(bad(R"({"conversations": "hi"})", s), "field 'conversations': expected an array of turns, got string");
  EXPECT_EQ(bad(R"({"conversations": []})", s), "field 'conversations': no user or assistant turns");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "system", "value": "S"}]})", s),
            "field 'conversations': no user or assistant turns");
  EXPECT_EQ(bad(R"({"conversations": ["hi"]})", s), "field 'conversations[0]': expected an object, got string");
  EXPECT_EQ(bad(R"({"conversations": [{"value": "q"}]})", s), "missing field 'conversations[0].from'");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human"}]})", s), "missing field 'conversations[0].value'");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": 1}]})", s),
            "field 'conversations[1].value': expected a string, got number");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": ""}]})", s),
            "field 'conversations[1].value': empty response");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "a"}]})", s),
            "field 'conversations[0].value': empty prompt");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "bot", "value": "a"}]})", s),
            "field 'conversations[1].from': unknown role 'bot' (expected 'human' or 'gpt')");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]})", s),
            "field 'conversations[0].from': expected a user turn ('human') here, got 'gpt' (turns alternate, user first)");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "human", "value": "q"}]})", s),
            "field 'conversations[1].from': expected an assistant turn ('gpt') here, got 'human' (turns alternate, user first)");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                   {"from": "human", "value": "q2"}]})", s),
            "field 'conversations': the last turn is the user's (no response to train on)");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "{}"}]})", s),
            "field 'conversations[1].from': 'function_call' turns (tool use) are not supported by the chat templates");
  EXPECT_EQ(bad(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                   {"from": "system", "value": "S"}, {"from": "gpt", "value": "a"}]})", s),
            "field 'conversations[2].from': a system turn is only allowed first");
  EXPECT_EQ(bad(R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]})", spec("openai")),
            "field 'messages[1].role': 'tool' turns (tool use) are not supported by the chat templates");
}

}  // namespace
}  // namespace lt
