// Checkpoints under injected I/O faults (io/io_faults.h: the real calls, their result replaced): a full disk or an
// I/O error at any write, fsync or rename of a save ends in an lt::Error naming the path and the cause, leaves the
// previous checkpoint and `latest` byte for byte as they were and nothing named like a checkpoint that is not
// whole; short writes are continued, not mistaken for failures.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/io_faults.h"
#include "io/json_file.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "testing/model_testing.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace lt {
namespace {

// Every file under dir (relative path -> bytes).
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  return files;
}

struct Fixture {
  ModelConfig cfg = testing::small_model_config(ModelType::qwen3, {.tied = true, .max_positions = 64});
  ModelSlabs params{cfg}, grads{cfg};
  std::unique_ptr<HybridAdamW> opt;
  Fixture() {
    init_random(params, 3, 0.1f);
    init_random(grads, 4, 0.01f);
    AdamWConfig o;
    o.min_q8_numel = 256;
    opt = std::make_unique<HybridAdamW>(params, grads, o);
    opt->update(SlabKind::layer, 0, StepArgs{1, 1e-3, 1.0f});
  }
};

// Counts the calls of each kind a save makes, and fails the `fail_at`-th call of kind `op` with `error`.
struct Injector {
  std::map<IoOp, int> calls;
  IoOp op = IoOp::write;
  int fail_at = -1;
  int error = 0;
  size_t short_bytes = SIZE_MAX;  // instead of failing: a short write of at most this many bytes
  Injector() {
    set_io_fault_hook([this](IoOp o, const std::string&) {
      const int k = calls[o]++;
      if (o != op || k != fail_at) return IoFault{};
      return error ? IoFault{error} : IoFault{0, short_bytes};
    });
  }
  ~Injector() { set_io_fault_hook({}); }
};

TEST(CheckpointFaults, EveryFailedWriteFsyncOrRenameLeavesThePreviousCheckpointWhole) {
  Fixture f;
  const std::string out = ::testing::TempDir() + "lt_ckpt_faults";
  fs::remove_all(out);
  const CheckpointWriter w{out, 3, "bf16"};
  save_checkpoint(w, 1, f.params, *f.opt, {{"cursor", 1}});
  const auto before = snapshot(out);
  std::map<IoOp, int> per_save;
  {
    Injector count;
    save_checkpoint(CheckpointWriter{out + "_count", 3, "bf16"}, 2, f.params, *f.opt, {{"cursor", 2}});
    per_save = count.calls;
  }
  ASSERT_GT(per_save[IoOp::write], 5);
  ASSERT_GT(per_save[IoOp::fsync], 5);
  ASSERT_GE(per_save[IoOp::rename], 5);  // each file's rename, the directory's, `latest`'s

  int failures = 0;
  for (const auto& [op, err] : {std::pair{IoOp::write, ENOSPC}, {IoOp::write, EIO}, {IoOp::fsync, EIO},
                                {IoOp::rename, EIO}}) {
    for (int k = 0; k < per_save[op]; ++k) {
      const std::string what = fmt::format("{} #{} fails with {}", io_op_name(op), k, std::strerror(err));
      Injector inject;
      inject.op = op, inject.fail_at = k, inject.error = err;
      std::string message;
      try {
        save_checkpoint(w, 2, f.params, *f.opt, {{"cursor", 2}});
      } catch (const Error& e) {
        message = e.what();
      }
      ASSERT_FALSE(message.empty()) << what << ": the save reported success";
      ++failures;
      EXPECT_NE(message.find(std::strerror(err)), std::string::npos) << what << ": " << message;
      EXPECT_NE(message.find(out), std::string::npos) << what << ": the message names no path: " << message;
      // Nothing that is not whole carries a checkpoint's name; a temporary may not be left either.
      for (const auto& e : fs::directory_iterator(out)) {
        const std::string name = e.path().filename().string();
        EXPECT_EQ(name.find(".partial"), std::string::npos) << what << ": left " << name;
        EXPECT_EQ(name.find(".tmp."), std::string::npos) << what << ": left " << name;
      }
      auto after = snapshot(out);
      const bool saved_whole = fs::exists(out + "/checkpoint-2");  // the failure came after the directory's rename
      if (saved_whole) {  // then it is complete: it loads and gives the parameters back
        ModelSlabs loaded(f.cfg);
        HybridAdamW opt2(loaded, f.grads, AdamWConfig{.min_q8_numel = 256});
        load_checkpoint(out + "/checkpoint-2", loaded, opt2);
        EXPECT_EQ(0, std::memcmp(loaded.slab(SlabKind::layer, 0), f.params.slab(SlabKind::layer, 0),
                                 f.params.layout(SlabKind::layer).bytes()))
            << what;
        fs::remove_all(out + "/checkpoint-2");
        write_file_atomic(out + "/latest", std::string("checkpoint-1\n"));
        after = snapshot(out);
      }
      EXPECT_EQ(after, before) << what << ": the previous checkpoint or `latest` changed";
      EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-1") << what;
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(failures, 20);
}

TEST(CheckpointFaults, ShortWritesAreContinued) {
  Fixture f;
  const std::string a = ::testing::TempDir() + "lt_ckpt_short_a", b = ::testing::TempDir() + "lt_ckpt_short_b";
  fs::remove_all(a);
  fs::remove_all(b);
  save_checkpoint(CheckpointWriter{a, 3, "bf16"}, 1, f.params, *f.opt, {{"cursor", 1}});
  for (int k = 0; k < 6; ++k) {  // the k-th write moves 7 bytes only
    Injector inject;
    inject.op = IoOp::write, inject.fail_at = k, inject.short_bytes = 7;
    fs::remove_all(b);
    save_checkpoint(CheckpointWriter{b, 3, "bf16"}, 1, f.params, *f.opt, {{"cursor", 1}});
    EXPECT_EQ(snapshot(b), snapshot(a)) << "short write #" << k;
  }
}

}  // namespace
}  // namespace lt
