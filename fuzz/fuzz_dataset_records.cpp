// fuzz_dataset_records: a dataset file's bytes (JSON Lines, or one JSON array when the input starts with '['),
// split into records (read whole, and as a stream in small chunks: the same records or the same error), the format
// detected from the first, every record converted under each named format, and the good ones rendered with the
// Qwen3 chat template, tokenised (examples/arith's tokenizer) and cut to a length.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "fuzz_data_common.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/data_format.h"
#include "train/data_tokenize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lt::Tokenizer tok = lt::Tokenizer::load(lt::fuzz::data_dir() + "/model");
  static const lt::ChatTemplate tpl(lt::ChatTemplateKind::qwen3, tok);
  const std::string_view text = lt::fuzz::as_text(data, size);
  const std::string path = !text.empty() && text[0] == '[' ? "data.json" : "data.jsonl";
  lt::fuzz::expect_clean([&] {
    // Read as a stream in chunks of 1..17 bytes (the input picks), records and any error are those of the
    // input read whole: the reader's refills may fall anywhere.
    std::vector<std::pair<std::string, int64_t>> streamed;
    std::string stream_error;
    try {
      lt::RecordReader reader(text, path, 1 + (size ? data[size - 1] % 17 : 0));
      for (lt::DataRecord r; reader.next(r);) streamed.emplace_back(std::string(r.text), r.line);
    } catch (const lt::Error& e) {
      stream_error = e.what();
    }
    std::vector<lt::DataRecord> records;
    try {
      records = lt::split_records(text, path);
    } catch (const lt::Error& e) {
      if (stream_error != e.what()) std::abort();  // the same error
      throw;
    }
    if (!stream_error.empty() || streamed.size() != records.size()) std::abort();
    for (size_t i = 0; i < records.size(); ++i)
      if (streamed[i].first != records[i].text || streamed[i].second != records[i].line) std::abort();
    if (records.empty()) return;
    std::vector<lt::DatasetSpec> specs;
    lt::fuzz::expect_clean([&] {
      lt::DatasetSpec detect;
      detect.name = "x", detect.path = path;
      specs.push_back(lt::detect_dataset_spec(detect, records[0].text, path, records[0].line));
    });
    for (const char* format : {"alpaca", "sharegpt", "openai", "metamath", "gsm8k"})
      specs.push_back(lt::dataset_spec_for_format(format, "x", path));
    size_t n = 0;
    for (const lt::DataRecord& r : records) {
      if (++n > 64) break;
      for (const lt::DatasetSpec& spec : specs) {
        lt::ConvertedRecord c = lt::convert_record(r.text, r.line, spec);
        if (!c.error.empty()) continue;
        lt::fuzz::expect_clean([&] {
          lt::TokenizedChat t = lt::tokenize_conversation(tok, tpl, c.messages);
          (void)lt::apply_cutoff(t, 16, lt::Overlong::truncate);
        });
      }
    }
  });
  return 0;
}
