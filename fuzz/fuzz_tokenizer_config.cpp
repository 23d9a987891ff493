// fuzz_tokenizer_config: a model's tokenizer_config.json (special tokens, EOS, added tokens) beside a real
// tokenizer.json: loaded, then a conversation rendered with every chat template and tokenised.
#include <vector>

#include "fuzz_common.h"
#include "fuzz_data_common.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = lt::fuzz::dir_with_real("tokcfg", "tokenizer.json");
  lt::fuzz::write_file("tokcfg/tokenizer_config.json", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::Tokenizer tok = lt::Tokenizer::load(dir);
    const std::vector<lt::ChatMessage> chat = {{"system", "be brief"}, {"user", "1 + 2"}, {"assistant", "3"}};
    for (const char* kind : {"qwen2_5", "qwen3", "qwen3_5", "plain"}) {
      lt::fuzz::expect_clean([&] {
        lt::ChatTemplate tpl(lt::parse_chat_template_kind(kind), tok);
        (void)lt::tokenize_chat(tok, tpl.render_segments(chat));
      });
    }
  });
  return 0;
}
