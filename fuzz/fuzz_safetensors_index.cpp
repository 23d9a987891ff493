// fuzz_safetensors_index: a sharded model directory's model.safetensors.index.json, beside two small valid shards
// (written once) — the index's structure, its weight map against the shards, and every tensor read.
#include <vector>

#include "fuzz_common.h"
#include "io/safetensors.h"

namespace {

// Two shards of one tensor each: a [2, 3] f32 and a [4] bf16.
void write_shards(const std::string& dir) {
  static bool done = false;
  if (done) return;
  std::vector<float> a(6, 1.5f);
  std::vector<uint16_t> b(4, 0x3f80);
  lt::NamedTensors one, two;
  one["a.weight"] = lt::TensorView::contiguous(a.data(), lt::DType::f32, {2, 3});
  two["b.weight"] = lt::TensorView::contiguous(b.data(), lt::DType::bf16, {4});
  lt::write_safetensors(dir + "/model-00001-of-00002.safetensors", one);
  lt::write_safetensors(dir + "/model-00002-of-00002.safetensors", two);
  done = true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = lt::fuzz::scratch_dir() + "/sharded";
  lt::fuzz::write_file("sharded/model.safetensors.index.json", lt::fuzz::as_text(data, size));
  write_shards(dir);
  lt::fuzz::expect_clean([&] {
    lt::SafetensorsModel m = lt::SafetensorsModel::open_dir(dir);
    for (const std::string& name : m.names()) {
      const lt::SafetensorsTensorInfo& info = m.info(name);
      std::vector<float> out(size_t(lt::shape_numel(info.shape)));
      m.read_f32(name, out.data(), info.shape);
    }
  });
  return 0;
}
