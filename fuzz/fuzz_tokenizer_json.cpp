// fuzz_tokenizer_json: a model's tokenizer.json (model, pre-tokenizer, added tokens) beside a real
// tokenizer_config.json: loaded, then text with special tokens, bytes and digits encoded and decoded.
#include <filesystem>

#include "fuzz_common.h"
#include "fuzz_data_common.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = lt::fuzz::scratch_dir() + "/tok";
    std::filesystem::create_directories(d);
    std::filesystem::copy_file(lt::fuzz::data_dir() + "/model/tokenizer_config.json", d + "/tokenizer_config.json",
                               std::filesystem::copy_options::overwrite_existing);
    return d;
  }();
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
