// fuzz_plan_file: a plan file (`lazytrain plan --out`, `--policy FILE`, `plan:` in a training config) for a
// 4-layer model: boundaries, internals, MLP chunk and transfer windows, then the executor's window checks.
#include "exec/plan.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = lt::fuzz::write_file("plan.json", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::Plan p = lt::Plan::parse(path, 4);
    p.validate(4);
    p.validate_windows(4, 3);
    (void)p.to_json().dump();
  });
  return 0;
}
