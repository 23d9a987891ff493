#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <regex>

#include "core/error.h"
#include "io/json_file.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/peft.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;

namespace lt {
namespace {

// Every file under dir, then every directory bottom-up: all of it is on disk before the rename.
void fsync_tree(const fs::path& dir) {
  std::vector<fs::path> dirs{dir};
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_directory()) dirs.push_back(e.path());
    else fsync_path(e.path().string(), false);
  }
  std::reverse(dirs.begin(), dirs.end());
  for (const auto& d : dirs) fsync_path(d.string(), true);
}

// The checkpoint's files, written into `tmp` (not yet a checkpoint: its name starts with a dot).
void write_checkpoint_files(const CheckpointWriter& w, const fs::path& tmp, int64_t step, const ModelSlabs& params,
                            const HybridAdamW& optimizer, const nlohmann::json& state, const SavedExtras& extras,
                            const ModelSlabs* frozen) {
  fs::create_directories(tmp / "resume");
  const Finetune* ft = params.config().finetune.get();
  if (ft && ft->kind == FinetuneKind::lora) save_peft_adapter(params, tmp.string(), w.base_model);
  else save_hf_model(params, tmp.string(), dtype_parse(w.save_dtype), w.max_shard_bytes, extras, frozen);
  if (!w.tokenizer_dir.empty()) copy_tokenizer_files(w.tokenizer_dir, tmp.string());
  save_safetensors(params, (tmp / "resume" / "params.safetensors").string(), DType::f32);
  optimizer.save_state((tmp / "resume" / "optimizer.safetensors").string());
  nlohmann::json st = state;
  st["step"] = step;
  write_json_file((tmp / "resume" / "state.json").string(), st);
  fsync_tree(tmp);
}

int64_t checkpoint_step(const std::string& name) {
  static const std::regex re("checkpoint-([0-9]+)");
  std::smatch m;
  return std::regex_match(name, m, re) ? std::stoll(m[1].str()) : -1;
}

}  // namespace

std::string save_checkpoint(const CheckpointWriter& w, int64_t step, const ModelSlabs& params,
                            const HybridAdamW& optimizer, const nlohmann::json& state, const SavedExtras& extras,
                            const ModelSlabs* frozen) {
  const fs::path out(w.output_dir);
  make_directories(out, "output_dir");
  for (const auto& e : fs::directory_iterator(out))  // torn leftovers of a killed save
    if (e.path().filename().string().ends_with(".partial")) fs::remove_all(e.path());

  const std::string name = fmt::format("checkpoint-{}", step);
  const fs::path tmp = out / ("." + name + ".partial");
  const fs::path final_dir = out / name;
  // A failure (a full disk, an I/O error) leaves the previous checkpoints and `latest` as they were and removes
  // what it wrote: nothing half-written is ever named like a checkpoint.
  try {
    write_checkpoint_files(w, tmp, step, params, optimizer, state, extras, frozen);
    if (path_exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step after a resume
    rename_path(tmp.string(), final_dir.string());
  } catch (const std::exception& e) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    LT_FAIL("saving {} failed, the previous checkpoints are untouched: {}", final_dir.string(), e.what());
  }
  fsync_path(out.string(), true);
  write_file_atomic((out / "latest").string(), name + "\n");

  if (w.keep > 0) {  // prune the oldest complete checkpoints beyond the limit
    std::vector<std::pair<int64_t, fs::path>> all;
    for (const auto& e : fs::directory_iterator(out))
      if (e.is_directory() && checkpoint_step(e.path().filename().string()) >= 0)
        all.push_back({checkpoint_step(e.path().filename().string()), e.path()});
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + size_t(w.keep) < all.size(); ++i) fs::remove_all(all[i].second);
  }
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& output_dir) {
  const fs::path p = fs::path(output_dir) / "latest";
  if (!path_exists(p)) return "";
  std::string name = read_file(p.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const fs::path dir = fs::path(output_dir) / name;
  LT_CHECK(checkpoint_step(name) >= 0 && is_directory_path(dir), "{}: names '{}', which is not a checkpoint in {}",
           p.string(), name, output_dir);
  return dir.string();
}

nlohmann::json load_checkpoint(const std::string& dir, ModelSlabs& params, HybridAdamW& optimizer,
                               const TensorRanges* only) {
  const fs::path resume = fs::path(dir) / "resume";
  for (const char* f : {"params.safetensors", "optimizer.safetensors", "state.json"})
    LT_CHECK(path_exists(resume / f), "{}: not a resumable checkpoint (missing resume/{})", dir, f);
  SafetensorsFile file = SafetensorsFile::open((resume / "params.safetensors").string());
  for (const auto& t : params.named_tensors()) {
    LT_CHECK(file.contains(t.hf_name), "{}: resume/params.safetensors has no {}", dir, t.hf_name);
    file.read_f32(t.hf_name, t.view.ptr<float>(), t.view.shape, range_of(only, t.hf_name));
  }
  optimizer.load_state((resume / "optimizer.safetensors").string());
  return read_json_file((resume / "state.json").string());
}

ResumeState parse_resume_state(const nlohmann::json& st, const std::string& source) {
  return with_json_errors(source, [&] {
    LT_CHECK(st.is_object(), "{}: the resume state is a JSON object, got {}", source, st.type_name());
    LT_CHECK(st.contains("step") && st["step"].is_number_integer() && st["step"].get<int64_t>() >= 0,
             "{}: \"step\" must be a non-negative integer", source);
    LT_CHECK(st.contains("config") && st["config"].is_object(), "{}: \"config\" must be an object (the run's config)",
             source);
    LT_CHECK(st.contains("cursor"), "{}: \"cursor\" (the data position) is missing", source);
    ResumeState r;
    r.step = st["step"].get<int64_t>();
    r.cursor = Cursor::from_json(st["cursor"], source);
    r.config = st["config"];
    return r;
  });
}

}  // namespace lt
