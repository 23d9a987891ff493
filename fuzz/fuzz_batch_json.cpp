// fuzz_batch_json: a batch file (`lazytrain grad --batch`): input_ids, labels, positions, doc_ids.
#include "fuzz_common.h"
#include "model/batch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = lt::fuzz::write_file("batch.json", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::Batch b = lt::Batch::load(path, 384);
    (void)lt::StepTokens::make(b);
  });
  return 0;
}
