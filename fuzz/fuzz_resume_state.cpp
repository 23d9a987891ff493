// fuzz_resume_state: a checkpoint's resume/state.json — the step, the data cursor and the saved config a resumed
// run checks its own against.
#include "fuzz_common.h"
#include "io/json_file.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = lt::fuzz::write_file("resume/state.json", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::ResumeState st = lt::parse_resume_state(lt::read_json_file(path), path);
    (void)st.cursor.to_json().dump();
    for (const auto& [k, v] : st.config.items()) (void)v.dump();
  });
  return 0;
}
