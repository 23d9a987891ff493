// fuzz_dataset_info: a dataset registry (dataset_info.json, LLaMA-Factory's) as `dataset:` names resolve through
// it: every entry it has (its data file made when the entry names a plain file), and a name it lacks.
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "train/data_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = lt::fuzz::as_text(data, size);
  lt::fuzz::write_file("data/dataset_info.json", text);
  lt::fuzz::write_file("data/present.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n");
  const std::string dir = lt::fuzz::scratch_dir() + "/data";
  std::vector<std::string> names = {"absent"};
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_object())
    for (const auto& [k, v] : j.items()) {
      names.insert(names.begin(), k);
      // The entry's data file, when it names a plain file here: so the registry's own checks are what fail.
      if (v.is_object() && v.contains("file_name") && v["file_name"].is_string()) {
        const std::string f = v["file_name"].get<std::string>();
        if (!f.empty() && f.size() <= 64 && f.find('/') == std::string::npos && f.find("..") == std::string::npos)
          lt::fuzz::write_file("data/" + f, "{\"instruction\": \"a\", \"output\": \"b\"}\n");
      }
    }
  for (const std::string& name : names)
    lt::fuzz::expect_clean([&] {
      for (const lt::DatasetSpec& spec : lt::resolve_datasets({name}, dir)) {
        (void)spec.describe();
        (void)lt::dataset_files(spec);
      }
    });
  return 0;
}
