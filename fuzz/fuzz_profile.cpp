// fuzz_profile: a profile file (`lazytrain profile --out`, `plan --hardware FILE`): loaded, validated for its
// layer count, rescaled to another shape, and applied to the executor's options.
#include "fuzz_common.h"
#include "plan/hardware.h"
#include "plan/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = lt::fuzz::write_file("profile.json", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::Profile p = lt::Profile::load(path);
    p.validate(p.num_layers());
    lt::ExecOptions e;
    p.apply_to(e, "auto", "--activation-dtype");
    (void)lt::scale_profile(p, 2, 64).to_json().dump();
  });
  return 0;
}
