// train/data_format.h — dataset files and their formats: which file, which fields, and how one record
// becomes a conversation (a list of chat messages). Nothing here knows about tokens.
//
// Formats follow LLaMA-Factory (data/README.md, parser.py, converter.py):
//   alpaca    {instruction, input, output, system, history: [[q, a], ...]}; the user turn is
//             instruction + "\n" + input (just the one that is non-empty when the other is empty);
//             history pairs become earlier user/assistant turns.
//   sharegpt  {conversations: [{from: human|gpt|system|observation|function_call, value}], system};
//             a first message with the system tag is the system prompt; turns then alternate user
//             (or observation) and assistant (or function_call), and there is an even number of them.
//   openai    {messages: [{role: system|user|assistant, content}]}: sharegpt with column "messages" and
//             tags role/content/user/assistant/system (what LLaMA-Factory users register).
//   MetaMathQA {query, response} and GSM8K {question, answer}: alpaca with the prompt and response
//             columns renamed (the mapping LLaMA-Factory users write in dataset_info.json).
// Tool turns (observation, function_call) are refused: the chat templates (text/chat_template.h) have
// no tool roles yet.
//
// Files: JSON (an array of records) or JSON Lines (one record per line), decided from the content as
// the HF `json` loader does (a first non-blank byte '[' means an array), so a .json file holding lines
// works too; a directory means every *.json / *.jsonl file in it, by name. Files are read as a stream
// (RecordReader), never whole, so a data set larger than memory tokenises. Each record is parsed on its
// own and keeps its line number, so one bad record in a million is reported as "path:line: ..." and can
// be skipped; a file whose array structure is broken (unclosed string or bracket) is refused whole.
//
// A dataset is named in the config (`dataset: a,b`) either by a path, whose format is detected from
// the first record's fields (detect_dataset_spec), or by a name registered in <dataset_dir>/
// dataset_info.json with LLaMA-Factory's keys: {"name": {"file_name", "formatting": alpaca|sharegpt|
// openai, "columns": {...}, "tags": {...}}}. As in LLaMA-Factory, "columns" (and "tags") given in an
// entry replace the defaults wholesale: a column the entry does not list is not used.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/unique_fd.h"
#include "text/chat_template.h"

namespace lt {

enum class DataFormatting { alpaca, sharegpt, detect };

// Record fields (LLaMA-Factory's "columns"). Empty = not used.
struct DatasetColumns {
  std::string prompt = "instruction";  // alpaca: the user's instruction
  std::string query = "input";         // alpaca: appended to the prompt after "\n" when non-empty
  std::string response = "output";     // alpaca: the assistant's answer
  std::string history;                 // alpaca: [[query, response], ...] before this turn
  std::string system;                  // both: the system prompt
  std::string messages = "conversations";  // sharegpt: the list of turns
};

// Keys and role names inside sharegpt turns (LLaMA-Factory's "tags"). Empty = no such role.
struct DatasetTags {
  std::string role = "from", content = "value";
  std::string user = "human", assistant = "gpt", observation = "observation", function = "function_call",
              system = "system";
};

struct DatasetSpec {
  std::string name;  // as the config names it (a registry name, or the path)
  std::string path;  // a file, or a directory of .json / .jsonl files
  DataFormatting formatting = DataFormatting::detect;
  DatasetColumns columns;
  DatasetTags tags;

  // Every setting that changes how records convert, as one line (part of the cache key).
  std::string describe() const;
};

// Presets for named formats: alpaca | sharegpt | openai | metamath | gsm8k. Throws on other names.
DatasetSpec dataset_spec_for_format(std::string_view format, std::string name, std::string path);

// `dataset: a, b` -> ["a", "b"] (spaces trimmed, empty items refused).
std::vector<std::string> split_dataset_list(std::string_view list);

// Each name: an entry of <dataset_dir>/dataset_info.json when that file exists and has it (file_name
// relative to dataset_dir), otherwise a path (relative to dataset_dir when that holds it, else to the
// working directory) whose format is detected when read. Throws lt::Error for a name that is neither,
// naming both places looked at, and for registry entries we cannot honour (hub URLs, scripts, ranking,
// tools/images columns, num_samples).
std::vector<DatasetSpec> resolve_datasets(const std::vector<std::string>& names, const std::string& dataset_dir);

// One entry of dataset_info.json. `source` names the registry file in errors.
DatasetSpec parse_dataset_info_entry(const nlohmann::json& entry, const std::string& name,
                                     const std::string& dataset_dir, const std::string& source);

// The data files of a spec's path: the file itself, or a directory's *.json / *.jsonl sorted by name.
std::vector<std::string> dataset_files(const DatasetSpec& spec);

// One record of a data file: its JSON text and the 1-based line it starts on.
struct DataRecord {
  std::string_view text;
  int64_t line = 0;
};

// A data file's records one at a time, with memory bounded by the read chunk plus the longest record, so a
// file larger than memory streams (see the file comment for how records are found). A record's text stays
// valid until the next call. Throws lt::Error "path:line: ..." when the array structure itself is broken
// (when the reader gets there: the records before it have been returned); a record that is merely invalid
// JSON is returned, to be reported.
class RecordReader {
 public:
  static constexpr size_t kChunkBytes = size_t(4) << 20;
  // Reads the file at `path` in chunks. Throws lt::Error when it cannot be opened or is a directory.
  explicit RecordReader(const std::string& path, size_t chunk_bytes = kChunkBytes);
  // Reads bytes already in memory: in place by default (records are views of `bytes`, valid as long as it
  // is), or copied chunk by chunk as from a file when chunk_bytes is given (tests, fuzzing).
  RecordReader(std::string_view bytes, std::string path, size_t chunk_bytes = 0);
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // The next record, or false after the last one.
  bool next(DataRecord& record);
  const std::string& path() const { return path_; }

 private:
  enum class Mode { start, lines, array, closed, done };
  std::string_view view() const { return in_place_ ? source_ : std::string_view(buffer_); }
  bool refill();  // appends the next chunk after the unread bytes; false at the end of the input
  void skip_spaces();
  bool next_line(DataRecord& record);
  bool next_element(DataRecord& record);

  std::string path_;
  UniqueFd fd_;                 // a file, or -1 for bytes in memory
  std::string_view source_;     // bytes in memory
  size_t source_pos_ = 0;       // of them, copied into buffer_ so far
  size_t chunk_ = kChunkBytes;
  bool in_place_ = false;       // view() is source_ itself
  std::string buffer_;
  size_t pos_ = 0;              // the first byte of view() not yet consumed
  bool eof_ = false;
  Mode mode_ = Mode::start;
  int64_t line_ = 1;            // the line pos_ is on
  int64_t array_line_ = 0;      // where the array opened
  bool first_ = true;           // no element of the array read yet
};

// Every record of a file's bytes (RecordReader in place).
std::vector<DataRecord> split_records(std::string_view bytes, const std::string& path);

// A spec with formatting `detect` resolved from a record's fields (the first record of the first file).
// Throws lt::Error "path:line: cannot tell the format ..." listing the fields and the known formats.
DatasetSpec detect_dataset_spec(const DatasetSpec& spec, std::string_view record_text, const std::string& path,
                                int64_t line);

// A record converted to messages (system first when there is one), or why it is bad, as a phrase
// without the location: "invalid JSON (...)", "missing field 'output'", "field 'output': expected a
// string, got number", "field 'output': empty response", ... `line` places JSON syntax errors of
// multi-line records on the right line (the error then names it).
struct ConvertedRecord {
  std::vector<ChatMessage> messages;
  std::string error;  // empty when the record is good
  int64_t error_line = 0;
};
ConvertedRecord convert_record(std::string_view text, int64_t line, const DatasetSpec& spec);

}  // namespace lt
