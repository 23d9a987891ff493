// fuzz_safetensors: one safetensors file, header and body — open (the header's checks), then every tensor's info,
// view and f32 copy at its own shape.
#include <vector>

#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = lt::fuzz::write_file("model.safetensors", lt::fuzz::as_text(data, size));
  lt::fuzz::expect_clean([&] {
    lt::SafetensorsFile f = lt::SafetensorsFile::open(path);
    for (const std::string& name : f.names()) {
      const lt::SafetensorsTensorInfo& info = f.info(name);
      lt::TensorView v = f.view(name);
      if (v.numel() > (int64_t(1) << 20)) continue;  // the header's sizes are checked against the file already
      std::vector<float> out(size_t(v.numel()));
      f.read_f32(name, out.data(), info.shape);
    }
  });
  return 0;
}
