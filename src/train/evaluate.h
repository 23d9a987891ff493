// train/evaluate.h — exact-match accuracy on a held-out split by greedy decoding (model/generate.h).
//
// Each record's last assistant message is the reference; the conversation before it is the prompt,
// rendered by the chat template with the generation prompt. The final answer is extracted from the
// reference and from the generation the same way: after GSM8K's "#### ", else after "The answer is:"
// (MetaMathQA), else the last number in the text; commas in numbers are stripped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/data_format.h"

namespace lt {

std::string extract_answer(std::string_view text);  // "" when the text has no answer

struct EvalOptions {
  int64_t max_new_tokens = 64;
  int64_t limit = 0;  // evaluate at most this many records (0: all)
};

struct EvalResult {
  int64_t total = 0, correct = 0;
  double exact_match() const { return total ? double(correct) / double(total) : 0.0; }
  std::vector<nlohmann::json> samples;      // the first few: prompt, reference, generation, answers
  std::vector<nlohmann::json> predictions;  // every record, the same fields
  nlohmann::json to_json(bool with_predictions = false) const;
};

EvalResult evaluate_exact_match(const ModelSlabs& params, const Tokenizer& tok, const ChatTemplate& tpl,
                                const std::vector<DatasetSpec>& datasets, const EvalOptions& options);

}  // namespace lt
