#include "train/data_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/json_file.h"
#include "io/paths.h"

namespace lt {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool blank(std::string_view s) { return trim(s).empty(); }

int64_t count_newlines(std::string_view s) { return int64_t(std::count(s.begin(), s.end(), '\n')); }

// A bad record, thrown inside the converters and turned into ConvertedRecord::error.
struct BadRecord {
  std::string what;
};

[[noreturn]] void bad(std::string what) { throw BadRecord{std::move(what)}; }

// j[key], or nullptr when absent or null (optional fields may be written either way).
const json* optional_field(const json& j, const std::string& key) {
  if (key.empty()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// `label` names the field in messages: "output", "conversations[3].value".
std::string string_of(const json& v, const std::string& label) {
  if (!v.is_string()) bad(fmt::format("field '{}': expected a string, got {}", label, v.type_name()));
  return v.get<std::string>();
}

std::string required_string(const json& j, const std::string& key, const std::string& label) {
  auto it = j.find(key);
  if (it == j.end()) bad(fmt::format("missing field '{}'", label));
  if (it->is_null()) bad(fmt::format("field '{}': expected a string, got null", label));
  return string_of(*it, label);
}

std::string optional_string(const json& j, const std::string& key) {
  const json* v = optional_field(j, key);
  return v ? string_of(*v, key) : std::string();
}

void push_system(std::vector<ChatMessage>& out, std::string system) {
  // An empty system prompt is no system message, so a template's default applies (LLaMA-Factory's
  // `system or default_system`).
  if (!system.empty()) out.push_back({"system", std::move(system)});
}

void check_response(const std::string& text, const std::string& label) {
  if (blank(text)) bad(fmt::format("field '{}': empty response", label));
}

std::vector<ChatMessage> convert_alpaca(const json& j, const DatasetColumns& c) {
  std::vector<ChatMessage> out;
  push_system(out, optional_string(j, c.system));
  if (const json* h = optional_field(j, c.history)) {
    if (!h->is_array()) bad(fmt::format("field '{}': expected an array of [query, response] pairs, got {}", c.history, h->type_name()));
    for (size_t i = 0; i < h->size(); ++i) {
      const json& pair = (*h)[i];
      std::string label = fmt::format("{}[{}]", c.history, i);
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
        bad(fmt::format("field '{}': expected a [query, response] pair of strings, got {}", label, pair.dump()));
      std::string q = pair[0].get<std::string>(), a = pair[1].get<std::string>();
      if (blank(q)) bad(fmt::format("field '{}[0]': empty prompt", label));
      check_response(a, label + "[1]");
      out.push_back({"user", std::move(q)});
      out.push_back({"assistant", std::move(a)});
    }
  }
  std::string prompt = c.prompt.empty() ? std::string() : required_string(j, c.prompt, c.prompt);
  std::string query = optional_string(j, c.query);
  std::string user = prompt.empty() ? query : query.empty() ? prompt : prompt + "\n" + query;
  if (blank(user)) {
    bad(c.query.empty() ? fmt::format("field '{}': empty prompt", c.prompt)
                        : fmt::format("fields '{}' and '{}': empty prompt", c.prompt, c.query));
  }
  std::string response = required_string(j, c.response, c.response);
  check_response(response, c.response);
  out.push_back({"user", std::move(user)});
  out.push_back({"assistant", std::move(response)});
  return out;
}

std::vector<ChatMessage> convert_sharegpt(const json& j, const DatasetColumns& c, const DatasetTags& t) {
  auto it = j.find(c.messages);
  if (it == j.end()) bad(fmt::format("missing field '{}'", c.messages));
  const json& turns = *it;
  if (!turns.is_array()) bad(fmt::format("field '{}': expected an array of turns, got {}", c.messages, turns.type_name()));

  struct Turn {
    std::string role, content, label;
  };
  std::vector<Turn> list;
  for (size_t i = 0; i < turns.size(); ++i) {
    std::string label = fmt::format("{}[{}]", c.messages, i);
    const json& m = turns[i];
    if (!m.is_object()) bad(fmt::format("field '{}': expected an object, got {}", label, m.type_name()));
    std::string role = required_string(m, t.role, label + "." + t.role);
    std::string content = required_string(m, t.content, label + "." + t.content);
    list.push_back({std::move(role), std::move(content), std::move(label)});
  }

  std::vector<ChatMessage> out;
  size_t first = 0;
  if (!t.system.empty() && !list.empty() && list[0].role == t.system) {
    push_system(out, list[0].content);
    first = 1;
  } else {
    push_system(out, optional_string(j, c.system));
  }
  if (first == list.size()) bad(fmt::format("field '{}': no user or assistant turns", c.messages));

  for (size_t i = first; i < list.size(); ++i) {
    const Turn& turn = list[i];
    bool user_expected = (i - first) % 2 == 0;
    std::string where = turn.label + "." + t.role;
    bool is_user = !t.user.empty() && turn.role == t.user;
    bool is_assistant = !t.assistant.empty() && turn.role == t.assistant;
    if (!is_user && !is_assistant) {
      if ((!t.observation.empty() && turn.role == t.observation) || (!t.function.empty() && turn.role == t.function))
        bad(fmt::format("field '{}': '{}' turns (tool use) are not supported by the chat templates", where, turn.role));
      if (!t.system.empty() && turn.role == t.system)
        bad(fmt::format("field '{}': a system turn is only allowed first", where));
      bad(fmt::format("field '{}': unknown role '{}' (expected '{}' or '{}')", where, turn.role, t.user, t.assistant));
    }
    if (is_user != user_expected) {
      bad(fmt::format("field '{}': expected {} turn ('{}') here, got '{}' (turns alternate, user first)", where,
                      user_expected ? "a user" : "an assistant", user_expected ? t.user : t.assistant, turn.role));
    }
    std::string content_label = turn.label + "." + t.content;
    if (is_assistant) {
      check_response(turn.content, content_label);
    } else if (blank(turn.content)) {
      bad(fmt::format("field '{}': empty prompt", content_label));
    }
    out.push_back({is_user ? "user" : "assistant", turn.content});
  }
  if ((list.size() - first) % 2 != 0)
    bad(fmt::format("field '{}': the last turn is the user's (no response to train on)", c.messages));
  return out;
}

// Column names must be strings (null: not used).
std::string column_value(const json& v, const std::string& key, const std::string& where) {
  if (v.is_null()) return "";
  LT_CHECK(v.is_string(), "{}: \"{}\" must be a string (a field name), got {}", where, key, v.type_name());
  return v.get<std::string>();
}

// ", "-joined (fmt::join over strings trips a GCC 12 -Wstringop-overflow false positive in fmt 9).
std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool has_data_extension(const fs::path& p) { return p.extension() == ".json" || p.extension() == ".jsonl"; }

}  // namespace

std::string DatasetSpec::describe() const {
  const char* f = formatting == DataFormatting::alpaca ? "alpaca" : formatting == DataFormatting::sharegpt ? "sharegpt" : "detect";
  const DatasetColumns& c = columns;
  const DatasetTags& t = tags;
  return fmt::format(
      "formatting={} prompt={} query={} response={} history={} system={} messages={} role={} content={} user={} "
      "assistant={} observation={} function={} system_tag={}",
      f, c.prompt, c.query, c.response, c.history, c.system, c.messages, t.role, t.content, t.user, t.assistant,
      t.observation, t.function, t.system);
}

DatasetSpec dataset_spec_for_format(std::string_view format, std::string name, std::string path) {
  DatasetSpec s;
  s.name = std::move(name);
  s.path = std::move(path);
  if (format == "alpaca") {
    s.formatting = DataFormatting::alpaca;
    s.columns.history = "history";
    s.columns.system = "system";
  } else if (format == "sharegpt") {
    s.formatting = DataFormatting::sharegpt;
    s.columns.system = "system";
  } else if (format == "openai") {
    s.formatting = DataFormatting::sharegpt;
    s.columns.messages = "messages";
    s.columns.system = "system";
    s.tags = DatasetTags{"role", "content", "user", "assistant", "tool", "", "system"};
  } else if (format == "metamath" || format == "gsm8k") {
    s.formatting = DataFormatting::alpaca;
    bool mm = format == "metamath";
    s.columns = DatasetColumns{};
    s.columns.prompt = mm ? "query" : "question";
    s.columns.query = "";
    s.columns.response = mm ? "response" : "answer";
  } else {
    LT_FAIL("unknown dataset format '{}' (supported: alpaca, sharegpt, openai, metamath, gsm8k)", format);
  }
  return s;
}

std::vector<std::string> split_dataset_list(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = list.find(',', start);
    std::string_view item = trim(list.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    LT_CHECK(!item.empty(), "dataset: '{}' has an empty name (expected names or paths separated by commas)", list);
    out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

DatasetSpec parse_dataset_info_entry(const json& entry, const std::string& name, const std::string& dataset_dir,
                                     const std::string& source) {
  std::string where = fmt::format("{}: dataset '{}'", source, name);
  LT_CHECK(entry.is_object(), "{}: expected an object with \"file_name\", got {}", where, entry.type_name());
  for (const char* hub : {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"}) {
    LT_CHECK(!entry.contains(hub), "{}: \"{}\" is not supported (LazyTrain reads local files: download the data and give "
             "\"file_name\")", where, hub);
  }
  static const std::vector<std::string> kKeys = {"file_name", "formatting", "columns", "tags", "ranking",
                                                 "split", "subset", "folder", "file_sha1", "num_samples"};
  for (const auto& [key, value] : entry.items()) {
    LT_CHECK(std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end(), "{}: unknown key \"{}\" (known: {})", where, key,
             join(kKeys));
  }
  LT_CHECK(entry.contains("file_name") && entry["file_name"].is_string(), "{}: \"file_name\" (a string) is required",
           where);
  LT_CHECK(!entry.contains("ranking") || entry["ranking"] == false,
           "{}: preference data (\"ranking\": true) is not supported", where);
  LT_CHECK(!entry.contains("num_samples"), "{}: \"num_samples\" is not supported (LLaMA-Factory draws them with an "
           "unseeded permutation); cut the file instead", where);

  std::string formatting = "alpaca";
  if (entry.contains("formatting")) {
    LT_CHECK(entry["formatting"].is_string(), "{}: \"formatting\" must be a string", where);
    formatting = entry["formatting"].get<std::string>();
    LT_CHECK(formatting == "alpaca" || formatting == "sharegpt" || formatting == "openai",
             "{}: formatting '{}' is not supported (alpaca, sharegpt, openai)", where, formatting);
  }
  fs::path file = fs::path(dataset_dir) / entry["file_name"].get<std::string>();
  // LLaMA-Factory's defaults: alpaca uses instruction/input/output and no history or system column
  // unless "columns" names them; sharegpt uses "conversations" and the default tags.
  DatasetSpec s;
  s.name = name;
  s.path = file.string();
  s.formatting = formatting == "alpaca" ? DataFormatting::alpaca : DataFormatting::sharegpt;
  if (formatting == "openai") {
    s.columns.messages = "messages";
    s.tags = DatasetTags{"role", "content", "user", "assistant", "tool", "", "system"};
  }
  bool alpaca = s.formatting == DataFormatting::alpaca;

  if (entry.contains("columns")) {
    const json& cols = entry["columns"];
    LT_CHECK(cols.is_object(), "{}: \"columns\" must be an object", where);
    DatasetColumns c{"", "", "", "", "", ""};
    for (const auto& [key, value] : cols.items()) {
      std::string field = column_value(value, key, where + " columns");
      if (key == "system") {
        c.system = field;
      } else if (alpaca && key == "prompt") {
        c.prompt = field;
      } else if (alpaca && key == "query") {
        c.query = field;
      } else if (alpaca && key == "response") {
        c.response = field;
      } else if (alpaca && key == "history") {
        c.history = field;
      } else if (!alpaca && key == "messages") {
        c.messages = field;
      } else if (key == "tools" || key == "images" || key == "videos" || key == "audios" || key == "chosen" ||
                 key == "rejected" || key == "kto_tag") {
        LT_CHECK(field.empty(), "{}: column \"{}\" is not supported (text SFT only: no tools, media or preferences)",
                 where, key);
      } else {
        LT_FAIL("{}: column \"{}\" does not apply to formatting {} (known: {})", where, key, formatting,
                alpaca ? "prompt, query, response, history, system" : "messages, system");
      }
    }
    s.columns = c;
    LT_CHECK(!alpaca || !c.response.empty(), "{}: columns must name \"response\"", where);
    LT_CHECK(!alpaca || !c.prompt.empty() || !c.query.empty(), "{}: columns must name \"prompt\" or \"query\"", where);
    LT_CHECK(alpaca || !c.messages.empty(), "{}: columns must name \"messages\"", where);
  }
  if (!alpaca && entry.contains("tags")) {
    const json& tags = entry["tags"];
    LT_CHECK(tags.is_object(), "{}: \"tags\" must be an object", where);
    DatasetTags t{"", "", "", "", "", "", ""};
    for (const auto& [key, value] : tags.items()) {
      std::string v = column_value(value, key, where + " tags");
      if (key == "role_tag") t.role = v;
      else if (key == "content_tag") t.content = v;
      else if (key == "user_tag") t.user = v;
      else if (key == "assistant_tag") t.assistant = v;
      else if (key == "observation_tag") t.observation = v;
      else if (key == "function_tag") t.function = v;
      else if (key == "system_tag") t.system = v;
      else LT_FAIL("{}: unknown tag \"{}\" (known: role_tag, content_tag, user_tag, assistant_tag, observation_tag, "
                   "function_tag, system_tag)", where, key);
    }
    LT_CHECK(!t.role.empty() && !t.content.empty() && !t.user.empty() && !t.assistant.empty(),
             "{}: \"tags\" replace the defaults, so they must name role_tag, content_tag, user_tag and assistant_tag",
             where);
    s.tags = t;
  }
  return s;
}

std::vector<DatasetSpec> resolve_datasets(const std::vector<std::string>& names, const std::string& dataset_dir) {
  LT_CHECK(!names.empty(), "no dataset given (dataset: a name in dataset_info.json, or a path)");
  json registry;
  std::string registry_path;
  if (!dataset_dir.empty()) {
    registry_path = (fs::path(dataset_dir) / "dataset_info.json").string();
    if (path_exists(registry_path)) {
      registry = read_json_file(registry_path);
      LT_CHECK(registry.is_object(), "{}: expected an object mapping dataset names to their files", registry_path);
    }
  }
  std::vector<DatasetSpec> out;
  for (const std::string& name : names) {
    if (registry.is_object() && registry.contains(name)) {
      out.push_back(with_json_errors(
          registry_path, [&] { return parse_dataset_info_entry(registry[name], name, dataset_dir, registry_path); }));
      continue;
    }
    std::string in_dir = dataset_dir.empty() ? "" : (fs::path(dataset_dir) / name).string();
    std::string path = !in_dir.empty() && path_exists(in_dir) ? in_dir : name;
    if (!path_exists(path)) {
      std::string looked = registry.is_object() ? fmt::format("not in {}, and ", registry_path) : "";
      LT_FAIL("dataset '{}': {}no such file{}", name, looked,
              in_dir.empty() || in_dir == name ? std::string() : fmt::format(" (looked at {} and {})", in_dir, name));
    }
    DatasetSpec s;
    s.name = name;
    s.path = path;
    s.formatting = DataFormatting::detect;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> dataset_files(const DatasetSpec& spec) {
  LT_CHECK(path_exists(spec.path), "dataset '{}': {}: no such file or directory", spec.name, spec.path);
  if (!is_directory_path(spec.path)) return {spec.path};
  std::vector<std::string> files;
  for (const fs::path& e : directory_entries(spec.path))
    if (has_data_extension(e) && is_file_path(e)) files.push_back(e.string());
  std::sort(files.begin(), files.end());
  LT_CHECK(!files.empty(), "dataset '{}': directory {} holds no .json or .jsonl file", spec.name, spec.path);
  return files;
}

RecordReader::RecordReader(const std::string& path, size_t chunk_bytes)
    : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), chunk_(std::max<size_t>(chunk_bytes, 1)) {
  LT_CHECK(fd_.get() >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  LT_CHECK(::fstat(fd_.get(), &st) == 0, "{}: cannot stat: {}", path, std::strerror(errno));
  LT_CHECK(!S_ISDIR(st.st_mode), "{}: is a directory, expected a file", path);
  ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
}

RecordReader::RecordReader(std::string_view bytes, std::string path, size_t chunk_bytes)
    : path_(std::move(path)), source_(bytes), chunk_(chunk_bytes), in_place_(chunk_bytes == 0), eof_(in_place_) {}

bool RecordReader::refill() {
  if (eof_) return false;
  buffer_.erase(0, pos_);  // the consumed bytes; a record being scanned starts at pos_ and stays
  pos_ = 0;
  const size_t old = buffer_.size();
  size_t got = 0;
  if (fd_.get() >= 0) {
    buffer_.resize(old + chunk_);
    ssize_t n;
    do n = ::read(fd_.get(), buffer_.data() + old, chunk_);
    while (n < 0 && errno == EINTR);
    LT_CHECK(n >= 0, "{}: read failed: {}", path_, std::strerror(errno));
    got = size_t(n);
    buffer_.resize(old + got);
  } else {
    got = std::min(chunk_, source_.size() - source_pos_);
    buffer_.append(source_.substr(source_pos_, got));
    source_pos_ += got;
  }
  eof_ = got == 0;
  return !eof_;
}

void RecordReader::skip_spaces() {
  do {
    const std::string_view v = view();
    while (pos_ < v.size() && is_space(v[pos_])) line_ += v[pos_++] == '\n';
  } while (pos_ == view().size() && refill());
}

bool RecordReader::next(DataRecord& record) {
  if (mode_ == Mode::start) {
    while (view().size() - pos_ < 3 && refill()) {
    }
    if (view().substr(pos_, 3) == "\xEF\xBB\xBF") pos_ += 3;  // a UTF-8 byte-order mark
    // The first non-blank byte decides. (JSON Lines skips blank lines anyway; line_ has counted them.)
    skip_spaces();
    if (pos_ < view().size() && view()[pos_] == '[') {
      mode_ = Mode::array;
      array_line_ = line_;
      ++pos_;
    } else {
      mode_ = Mode::lines;
    }
  }
  if (mode_ == Mode::lines) return next_line(record);
  return next_element(record);
}

bool RecordReader::next_line(DataRecord& record) {
  size_t searched = 0;  // bytes after pos_ known to hold no newline
  for (;;) {
    std::string_view v = view();
    size_t end = v.find('\n', pos_ + searched);
    if (end == std::string_view::npos) {
      searched = v.size() - pos_;
      if (refill()) continue;
      v = view();
      if (pos_ == v.size()) {
        mode_ = Mode::done;
        return false;
      }
      end = v.size();  // the last line has no newline
    }
    const std::string_view text = v.substr(pos_, end - pos_);
    const int64_t line = line_++;
    pos_ = std::min(end + 1, v.size());
    searched = 0;
    if (blank(text)) continue;
    record = {trim(text), line};
    return true;
  }
}

// A JSON array: each element's extent by bracket depth outside strings; each is parsed later.
bool RecordReader::next_element(DataRecord& record) {
  if (mode_ == Mode::closed) {
    skip_spaces();
    LT_CHECK(pos_ == view().size(), "{}:{}: invalid JSON: unexpected text after the array's closing ']'", path_, line_);
    mode_ = Mode::done;
  }
  if (mode_ == Mode::done) return false;
  skip_spaces();
  LT_CHECK(pos_ < view().size(), "{}:{}: invalid JSON: the array opened here is never closed", path_, array_line_);
  if (first_ && view()[pos_] == ']') {
    ++pos_;
    mode_ = Mode::closed;
    return next_element(record);
  }
  first_ = false;
  const int64_t start_line = line_;
  // Scanned bytes past pos_ (pos_ stays at the element's start while the buffer grows), and the scan's state.
  size_t k = 0;
  int64_t depth = 0, line = line_;
  bool in_string = false, escaped = false;
  for (;;) {
    const std::string_view v = view();
    const char* p = v.data() + pos_;
    const size_t n = v.size() - pos_;
    for (; k < n; ++k) {
      const char c = p[k];
      if (c == '\n') ++line;
      if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') in_string = false;
        continue;
      }
      if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (depth == 0) {
          LT_CHECK(c == ']', "{}:{}: invalid JSON: unbalanced '}}'", path_, line);
          break;
        }
        --depth;
      } else if (c == ',' && depth == 0) {
        break;
      }
    }
    if (k < n) break;
    if (refill()) continue;
    LT_CHECK(!in_string, "{}:{}: invalid JSON: a string in the record starting here is never closed", path_,
             start_line);
    LT_FAIL("{}:{}: invalid JSON: the record starting here never ends (unbalanced brackets?), so the array is not "
            "closed", path_, start_line);
  }
  const std::string_view v = view();
  record = {trim(v.substr(pos_, k)), start_line};
  line_ = line;
  if (v[pos_ + k] == ']') mode_ = Mode::closed;
  pos_ += k + 1;
  return true;
}

std::vector<DataRecord> split_records(std::string_view bytes, const std::string& path) {
  std::vector<DataRecord> out;
  RecordReader reader(bytes, path);
  for (DataRecord r; reader.next(r);) out.push_back(r);
  return out;
}

DatasetSpec detect_dataset_spec(const DatasetSpec& spec, std::string_view record_text, const std::string& path,
                                int64_t line) {
  if (spec.formatting != DataFormatting::detect) return spec;
  json j = json::parse(record_text, nullptr, /*allow_exceptions=*/false);
  LT_CHECK(j.is_object(), "{}:{}: cannot tell the dataset format: the first record is not a JSON object", path, line);
  auto has = [&](const char* k) { return j.contains(k); };
  std::string format;
  if (has("conversations") || has("messages")) {
    const json& turns = has("conversations") ? j["conversations"] : j["messages"];
    bool role_content = turns.is_array() && !turns.empty() && turns[0].is_object() && turns[0].contains("role");
    format = has("conversations") && !role_content ? "sharegpt" : "openai";
  } else if (has("instruction")) {
    format = "alpaca";
  } else if (has("query") && has("response")) {
    format = "metamath";
  } else if (has("question") && has("answer")) {
    format = "gsm8k";
  } else {
    std::vector<std::string> keys;
    for (const auto& [k, v] : j.items()) keys.push_back(k);
    LT_FAIL("{}:{}: cannot tell the dataset format from the fields [{}] (known: alpaca {{instruction, input, output}}, "
            "sharegpt {{conversations}}, openai {{messages}}, MetaMathQA {{query, response}}, GSM8K {{question, "
            "answer}}); register it in dataset_info.json with \"columns\"", path, line, join(keys));
  }
  DatasetSpec out = dataset_spec_for_format(format, spec.name, spec.path);
  if (format == "openai" && has("conversations")) out.columns.messages = "conversations";
  return out;
}

ConvertedRecord convert_record(std::string_view text, int64_t line, const DatasetSpec& spec) {
  ConvertedRecord r;
  json j;
  try {
    if (text.empty()) bad("invalid JSON (an empty array element: a doubled or trailing comma)");
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      // nlohmann's text is "[json.exception.parse_error.101] parse error at line 1, column 5: <reason>".
      std::string_view what = e.what();
      size_t colon = what.find(": ");
      std::string_view reason = colon == std::string_view::npos ? what : what.substr(colon + 2);
      size_t byte = std::min(e.byte > 0 ? e.byte - 1 : 0, text.size());
      r.error_line = line + count_newlines(text.substr(0, byte));
      r.error = fmt::format("invalid JSON ({})", reason);
      return r;
    } catch (const json::exception& e) {  // a number out of range ("1e309"): no position (found by fuzzing)
      std::string_view what = e.what();
      const size_t bracket = what.find("] ");
      r.error_line = line;
      r.error = fmt::format("invalid JSON ({})", bracket == std::string_view::npos ? what : what.substr(bracket + 2));
      return r;
    }
    if (!j.is_object()) bad(fmt::format("expected a JSON object, got {}", j.type_name()));
    switch (spec.formatting) {
      case DataFormatting::alpaca: r.messages = convert_alpaca(j, spec.columns); break;
      case DataFormatting::sharegpt: r.messages = convert_sharegpt(j, spec.columns, spec.tags); break;
      case DataFormatting::detect: LT_FAIL("dataset '{}': convert_record needs a detected format", spec.name);
    }
  } catch (const BadRecord& b) {
    r.messages.clear();
    r.error = b.what;
    r.error_line = line;
  }
  return r;
}

}  // namespace lt
