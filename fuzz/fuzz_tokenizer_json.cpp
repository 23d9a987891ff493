// fuzz_tokenizer_json: a model's tokenizer.json (model, pre-tokenizer, added tokens) beside a real
// tokenizer_config.json: loaded, then text with special tokens, bytes and digits encoded and decoded.

#include "fuzz_common.h"
#include "fuzz_data_common.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = lt::fuzz::dir_with_real("tok", "tokenizer_config.json");
  lt::fuzz::write_file("tok/tokenizer.json", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::Tokenizer tok = lt::Tokenizer::load(dir);
    for (const char* text : {"Hello, world! 12 + 345 = 357", "<|im_start|>user\nhi<|im_end|>", "\xc3\xa9\xe2\x82\xac \xff"}) {
      std::vector<int32_t> ids = tok.encode(text);
      (void)tok.decode(ids);
    }
  });
  return 0;
}
