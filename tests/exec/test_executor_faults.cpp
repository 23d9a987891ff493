// The NVMe tier under injected I/O errors (io/io_faults.h: a completion with EIO, as a failing drive returns): the
// step fails with an lt::Error naming the cause — no hang, no crash — and the executor and the store stay usable:
// the next step, without the fault, gives the in-memory path's bits.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "io/io_faults.h"
#include "model/model.h"
#include "testing/exec_testing.h"

namespace lt {
namespace {

TEST(ExecutorFaults, NvmeErrorsFailTheStepCleanlyAndTheNextStepIsExact) {
  Rng rng(71);
  ModelConfig cfg = testing::random_config(rng, 1);
  cfg.num_layers = 5;
  ModelSlabs params = testing::random_params(cfg, 71);
  Batch batch = testing::random_batch(cfg, rng, false);
  ModelSlabs ref(cfg);
  const LossResult want = model_forward_backward(ref, params, batch, ComputeType::f32);
  const Plan plan = Plan::every(cfg.num_layers, 2, Tier::nvme);
  ExecOptions o;
  auto dev = make_cpu_device(size_t(256) << 20);
  std::unique_ptr<NvmeStore> nvme = testing::nvme_store_for(cfg, batch, plan, o);
  StreamingExecutor ex(cfg, *dev, o, nvme.get());
  for (const IoOp op : {IoOp::nvme_write, IoOp::nvme_read}) {
    for (int k = 0; k < 2; ++k) {
      const std::string what = fmt::format("{} #{} fails with EIO", io_op_name(op), k);
      int calls = 0;
      set_io_fault_hook([&](IoOp o2, const std::string&) { return o2 == op && calls++ == k ? IoFault{EIO} : IoFault{}; });
      std::string message;
      try {
        ModelSlabs grads(cfg);
        ex.step(grads, params, params, batch, plan);
      } catch (const Error& e) {
        message = e.what();
      }
      set_io_fault_hook({});
      if (std::getenv("LT_SHOW_ERRORS")) std::printf("%s: %s\n", what.c_str(), message.c_str());
      EXPECT_NE(message.find(std::strerror(EIO)), std::string::npos) << what << ": " << message;
      ModelSlabs grads(cfg);
      const StepStats st = ex.step(grads, params, params, batch, plan);
      EXPECT_EQ(st.loss_sum, want.loss_sum) << what;
      testing::expect_bitwise_equal(grads, ref, what + ", then a clean step");
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace lt
