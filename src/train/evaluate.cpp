#include "train/evaluate.h"

#include <cctype>

#include "core/error.h"
#include "io/json_file.h"
#include "model/generate.h"

namespace lt {
namespace {

// The numbers (digits with optional sign, commas and a decimal point) in `s`, commas removed; the first
// or the last of them.
std::string number_in(std::string_view s, bool first) {
  std::string best;
  size_t i = 0;
  while (i < s.size()) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      size_t start = i;
      if (start > 0 && s[start - 1] == '-') --start;
      std::string num;
      while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == ',' ||
                              (s[i] == '.' && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))))) {
        if (s[i] != ',') num += s[i];
        ++i;
      }
      best = (start < i && s[start] == '-' ? "-" : "") + num;
      if (first) return best;
    } else {
      ++i;
    }
  }
  return best;
}

}  // namespace

std::string extract_answer(std::string_view text) {
  for (std::string_view marker : {std::string_view("####"), std::string_view("The answer is:"),
                                  std::string_view("The answer is")}) {
    size_t at = text.rfind(marker);
    if (at != std::string_view::npos) {
      std::string n = number_in(text.substr(at + marker.size()), true);
      if (!n.empty()) return n;
    }
  }
  return number_in(text, false);
}

nlohmann::json EvalResult::to_json(bool with_predictions) const {
  nlohmann::json j = {{"total", total}, {"correct", correct}, {"exact_match", exact_match()}, {"samples", samples}};
  if (with_predictions) j["predictions"] = predictions;
  return j;
}

EvalResult evaluate_exact_match(const ModelSlabs& params, const Tokenizer& tok, const ChatTemplate& tpl,
                                const std::vector<DatasetSpec>& datasets, const EvalOptions& o) {
  EvalResult r;
  GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  const SpecialTokenIds& sp = tok.special_ids();
  for (const auto& id : {sp.eos, sp.im_end})
    if (id) g.stop_ids.push_back(*id);
  for (const DatasetSpec& spec0 : datasets) {
    for (const std::string& file : dataset_files(spec0)) {
      const std::string bytes = read_file(file);
      std::vector<DataRecord> records = split_records(bytes, file);
      DatasetSpec spec = spec0;
      if (!records.empty()) spec = detect_dataset_spec(spec0, records[0].text, file, records[0].line);
      for (const DataRecord& rec : records) {
        if (o.limit > 0 && r.total >= o.limit) return r;
        ConvertedRecord c = convert_record(rec.text, rec.line, spec);
        LT_CHECK(c.error.empty(), "{}:{}: {}", file, c.error_line ? c.error_line : rec.line, c.error);
        LT_CHECK(!c.messages.empty() && c.messages.back().role == "assistant",
                 "{}:{}: an evaluation record must end with the assistant's reference answer", file, rec.line);
        const std::string reference = c.messages.back().content;
        c.messages.pop_back();
        const std::string prompt = tpl.render(c.messages, GenerationPrompt::yes);
        std::vector<int32_t> ids = tok.encode(prompt);
        std::vector<int32_t> out = generate_greedy(params, ids, g);
        const std::string text = tok.decode(out, DecodeSpecial::skip);
        const std::string want = extract_answer(reference), got = extract_answer(text);
        const bool ok = !want.empty() && want == got;
        r.total += 1;
        r.correct += ok;
        nlohmann::json p = {{"prompt", c.messages.back().content}, {"reference", want}, {"generated", text},
                            {"answer", got}, {"correct", ok}};
        if (r.samples.size() < 5) r.samples.push_back(p);
        r.predictions.push_back(std::move(p));
      }
    }
  }
  return r;
}

}  // namespace lt
