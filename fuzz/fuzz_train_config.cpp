// fuzz_train_config: the YAML training config with key=value overrides (`lazytrain train cfg.yaml k=v ...`). The
// input is the YAML, then after a line "---" one override per line.
#include <vector>

#include "fuzz_common.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = lt::fuzz::as_text(data, size);
  const size_t cut = text.find("\n---\n");
  const std::string_view yaml = text.substr(0, cut);
  std::vector<std::string> overrides;
  if (cut != std::string_view::npos) {
    std::string_view rest = text.substr(cut + 5);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }
  const std::string path = lt::fuzz::write_file("train.yaml", yaml);
  lt::fuzz::expect_clean([&] {
    lt::TrainConfig c = lt::load_train_config(path, overrides);
    (void)c;
  });
  return 0;
}
