// The kernels on a real GPU (built with nvcc; skipped with the reason when there is no GPU): each native
// kernel against the same kernel under cuda-sim — bit for bit for those whose arithmetic is the CPU op's
// (nvcc's -fmad=false and IEEE division/sqrt promise it), within f32 rounding for attention and the head —
// and every native result bitwise the same when run twice (no atomics, fixed orders, cuBLASLt's algorithm
// cached per shape). The cuBLASLt wrapper against its emulation, and the property the executor's token
// chunks rely on: a row of a GEMM does not depend on how many rows the call has.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#if LT_WITH_CUDA
#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/gemm.h"
#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/layers.h"
#include "cuda/native/cuda_check.h"
#include "ops/embedding.h"
#include "ops/rope.h"

namespace lt::cuda {
namespace {

using testing::random_floats;
using testing::to_bf16;

// Empty when a GPU is usable, else why not.
std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return n > 0 ? std::string() : std::string("no CUDA device");
}

#define SKIP_WITHOUT_GPU()                                     \
  do {                                                         \
    const std::string reason = no_gpu_reason();                \
    if (!reason.empty()) GTEST_SKIP() << "no GPU: " << reason; \
  } while (0)

// A device copy of a host vector (or n uninitialised elements), read back with get().
template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    LT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), "test cudaMalloc");
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    LT_CUDA_CHECK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* p() { return static_cast<T*>(p_); }
  std::vector<T> get() const {
    std::vector<T> h(n_);
    LT_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "test download");
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

// Waits for the GPU and turns a launch or kernel error into a test failure naming `what`.
void sync(const char* what) {
  LT_CUDA_CHECK(cudaGetLastError(), "{}: launch", what);
  LT_CUDA_CHECK(cudaDeviceSynchronize(), "{}: kernel", what);
}

TEST(CudaNative, ElementwiseNormRopeEmbeddingKernelsGiveTheSimulatedBits) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 1031, C = 4099, n = rows * C;  // odd sizes, many blocks
  const auto x = random_floats(static_cast<size_t>(n), 1), w = random_floats(static_cast<size_t>(C), 2, 0.5f, 1.5f);
  const auto g = random_floats(static_cast<size_t>(n), 3), y = random_floats(static_cast<size_t>(n), 4);
  // RMSNorm forward + backward, f32.
  std::vector<float> out(static_cast<size_t>(n)), rstd(static_cast<size_t>(rows)), din(static_cast<size_t>(n)),
      dw(static_cast<size_t>(C), 0.25f);
  std::vector<unsigned char> ws(rmsnorm_backward_workspace_bytes(rows, C));
  sim::rmsnorm_forward(nullptr, out.data(), rstd.data(), x.data(), w.data(), rows, C, 1e-6f);
  sim::rmsnorm_backward(nullptr, din.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), rows, C, ws.data());
  for (int run = 0; run < 2; ++run) {
    Dev<float> dx(x), dwt(w), dg(g), dout(static_cast<size_t>(n)), drstd(static_cast<size_t>(rows)),
        ddin(static_cast<size_t>(n)), ddw(std::vector<float>(static_cast<size_t>(C), 0.25f));
    Dev<unsigned char> dws(ws.size());
    native::rmsnorm_forward(nullptr, dout.p(), drstd.p(), dx.p(), dwt.p(), rows, C, 1e-6f);
    native::rmsnorm_backward(nullptr, ddin.p(), ddw.p(), dg.p(), dx.p(), dwt.p(), drstd.p(), rows, C, dws.p());
    sync("rmsnorm");
    EXPECT_BITWISE_EQ(dout.get(), out);
    EXPECT_BITWISE_EQ(drstd.get(), rstd);
    EXPECT_BITWISE_EQ(ddin.get(), din);
    EXPECT_BITWISE_EQ(ddw.get(), dw);
  }
  // SwiGLU, the residual add and conversions, bf16 storage.
  const auto gb = to_bf16(x), ub = to_bf16(y);
  std::vector<bf16_t> h(static_cast<size_t>(n)), sum(static_cast<size_t>(n));
  std::vector<float> dgate(static_cast<size_t>(n)), dup(static_cast<size_t>(n));
  sim::swiglu_forward(nullptr, h.data(), gb.data(), ub.data(), n);
  sim::swiglu_backward(nullptr, dgate.data(), dup.data(), g.data(), gb.data(), ub.data(), n);
  sim::add(nullptr, sum.data(), gb.data(), ub.data(), n);
  Dev<bf16_t> dgb(gb), dub(ub), dh(static_cast<size_t>(n)), dsum(static_cast<size_t>(n));
  Dev<float> dgrad(g), ddgate(static_cast<size_t>(n)), ddup(static_cast<size_t>(n));
  native::swiglu_forward(nullptr, dh.p(), dgb.p(), dub.p(), n);
  native::swiglu_backward(nullptr, ddgate.p(), ddup.p(), dgrad.p(), dgb.p(), dub.p(), n);
  native::add(nullptr, dsum.p(), dgb.p(), dub.p(), n);
  sync("swiglu, add");
  EXPECT_BITWISE_EQ(dh.get(), h);
  EXPECT_BITWISE_EQ(ddgate.get(), dgate);
  EXPECT_BITWISE_EQ(ddup.get(), dup);
  EXPECT_BITWISE_EQ(dsum.get(), sum);
  // RoPE at D = 128 on packed positions.
  const int64_t N = 777, H = 5, D = 128, P = 512;
  std::vector<float> cos(size_t(P * D / 2)), sin(cos.size());
  rope_table(cos.data(), sin.data(), P, D, 1e6);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) pos[static_cast<size_t>(t)] = int32_t((t * 37) % P);
  auto q = random_floats(size_t(N * H * D), 5);
  std::vector<float> q_sim = q;
  sim::rope_forward(nullptr, q_sim.data(), pos.data(), cos.data(), sin.data(), N, H, D);
  Dev<float> dq(q), dcos(cos), dsin(sin);
  Dev<int32_t> dpos(pos);
  native::rope_forward(nullptr, dq.p(), dpos.p(), dcos.p(), dsin.p(), N, H, D);
  sync("rope");
  EXPECT_BITWISE_EQ(dq.get(), q_sim);
  // Embedding backward over repeated ids.
  const int64_t V = 1000, Ce = 257;
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) ids[static_cast<size_t>(t)] = int32_t((t * t) % V);
  const TokenGroups tg = group_tokens_by_id(ids.data(), N, V);
  const auto de = random_floats(size_t(N * Ce), 6);
  std::vector<float> table = random_floats(size_t(V * Ce), 7), table_sim = table;
  sim::embedding_backward(nullptr, table_sim.data(), de.data(), tg.present.data(), tg.start.data(), tg.order.data(),
                          int64_t(tg.present.size()), Ce);
  Dev<float> dtable(table), dde(de);
  Dev<int32_t> dpresent(tg.present), dstart(tg.start), dorder(tg.order);
  native::embedding_backward(nullptr, dtable.p(), dde.p(), dpresent.p(), dstart.p(), dorder.p(),
                             int64_t(tg.present.size()), Ce);
  sync("embedding backward");
  EXPECT_BITWISE_EQ(dtable.get(), table_sim);
}

TEST(CudaNative, AttentionIsDeterministicAndMatchesTheSimulation) {
  SKIP_WITHOUT_GPU();
  for (const int64_t D : {64, 128, 256}) {
    const AttentionShape s{2, 301, 8, 2, D};
    SCOPED_TRACE("D=" + std::to_string(D));
    const size_t nq = size_t(s.B * s.T * s.Hq * D), nk = size_t(s.B * s.T * s.Hkv * D), nl = size_t(s.B * s.Hq * s.T);
    const auto q = to_bf16(random_floats(nq, 11)), k = to_bf16(random_floats(nk, 12)),
               v = to_bf16(random_floats(nk, 13));
    const auto dout = random_floats(nq, 14);
    std::vector<bf16_t> out(nq);
    std::vector<float> lse(nl), dq(nq), dk(nk), dv(nk);
    std::vector<unsigned char> ws(attention_backward_workspace_bytes(s));
    sim::attention_forward(nullptr, out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, s);
    sim::attention_backward(nullptr, dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                            k.data(), v.data(), nullptr, s, ws.data());
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; ++run) {
      Dev<bf16_t> dq_in(q), dk_in(k), dv_in(v), dout_b(nq);
      Dev<float> ddout(dout), dlse(nl), ddq(nq), ddk(nk), ddv(nk);
      Dev<unsigned char> dws(ws.size());
      native::attention_forward(nullptr, dout_b.p(), dlse.p(), dq_in.p(), dk_in.p(), dv_in.p(), nullptr, s);
      native::attention_backward(nullptr, ddq.p(), ddk.p(), ddv.p(), ddout.p(), dout_b.p(), dlse.p(), dq_in.p(),
                                 dk_in.p(), dv_in.p(), nullptr, s, dws.p());
      sync("attention");
      const std::vector<std::vector<float>> now{dlse.get(), ddq.get(), ddk.get(), ddv.get()};
      if (run == 0) {
        // GPU expf and the sim's differ by an ulp or two: f32-level agreement.
        const std::vector<std::vector<float>> want{lse, dq, dk, dv};
        for (size_t i = 0; i < now.size(); ++i) {
          double scale = 1.0;
          for (float x : want[i]) scale = std::max(scale, double(std::abs(x)));
          for (size_t j = 0; j < now[i].size(); ++j)
            ASSERT_NEAR(now[i][j], want[i][j], 1e-4 * scale) << "output " << i << " element " << j;
        }
        first = now;
      } else {
        for (size_t i = 0; i < now.size(); ++i) EXPECT_BITWISE_EQ(now[i], first[i]);
      }
    }
  }
}

TEST(CudaNative, CublasLtMatchesItsEmulationIsDeterministicAndRowsDoNotDependOnM) {
  SKIP_WITHOUT_GPU();
  native::CublasLt lt;
  Dev<unsigned char> workspace(lt.workspace_bytes());
  const int64_t M = 4096 + 300, K = 1536, N = 1000;  // dW over two token slices
  const auto x = to_bf16(random_floats(size_t(M * K), 21)), w = to_bf16(random_floats(size_t(N * K), 22));
  const auto bias = random_floats(static_cast<size_t>(N), 23);
  Dev<bf16_t> dx(x), dw(w);
  Dev<float> dbias(bias), dy(size_t(M * N)), dy2(size_t(M * N)), dpart(size_t(1000 * N));
  lt.run(linear_forward_matmul(dy.p(), MatType::f32, dx.p(), dw.p(), MatType::bf16, dbias.p(), M, N, K), nullptr,
         workspace.p());
  lt.run(linear_forward_matmul(dy2.p(), MatType::f32, dx.p(), dw.p(), MatType::bf16, dbias.p(), M, N, K), nullptr,
         workspace.p());
  // Rows [1000, 2000) on their own: the executor's token chunks need the same bits.
  lt.run(
      linear_forward_matmul(dpart.p(), MatType::f32, dx.p() + 1000 * K, dw.p(), MatType::bf16, dbias.p(), 1000, N, K),
      nullptr, workspace.p());
  sync("cuBLASLt linear forward");
  const auto y = dy.get();
  EXPECT_BITWISE_EQ(dy2.get(), y);
  const auto part = dpart.get();
  EXPECT_BITWISE_EQ(part, std::vector<float>(y.begin() + 1000 * N, y.begin() + 2000 * N));
  std::vector<float> want(size_t(M * N));
  emulate_matmul(
      linear_forward_matmul(want.data(), MatType::f32, x.data(), w.data(), MatType::bf16, bias.data(), M, N, K));
  for (size_t i = 0; i < y.size(); i += 997) ASSERT_NEAR(y[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << i;
}

TEST(CudaNative, HeadIsDeterministicAndMatchesTheSimulation) {
  SKIP_WITHOUT_GPU();
  const HeadShape shape{1000, 512, 5003, 1e-6f, 256};
  const auto x = random_floats(size_t(shape.N * shape.C), 31), norm_w = random_floats(size_t(shape.C), 32, 0.5f, 1.5f);
  const auto lm = to_bf16(random_floats(size_t(shape.V * shape.C), 33, -0.1f, 0.1f));
  std::vector<int32_t> targets(size_t(shape.N));
  for (int64_t t = 0; t < shape.N; ++t)
    targets[static_cast<size_t>(t)] = t % 17 == 0 ? kIgnoreIndex : int32_t((t * 131) % shape.V);
  auto run_head = [&](auto&& head, GemmContext gemm, float* dx, float* dnorm, float* dlm, double* loss, const float* xp,
                      const int32_t* tp, const float* nw, const void* lmp, void* ws) {
    HeadArgs a;
    a.dx = dx, a.dnorm_w = dnorm, a.dlm_w = dlm, a.loss = loss, a.x = xp, a.targets = tp, a.norm_w = nw;
    a.lm_w = lmp, a.lm_type = DType::bf16, a.grad_scale = 1.0f / 900.0f, a.shape = shape, a.workspace = ws;
    head(gemm, nullptr, a);
  };
  std::vector<float> dx(x.size()), dnorm(norm_w.size()), dlm(lm.size());
  double loss = 0;
  std::vector<unsigned char> ws(head_workspace_bytes(shape, DType::bf16));
  run_head([](auto&&... a) { sim::head_forward_backward(a...); }, GemmContext{}, dx.data(), dnorm.data(), dlm.data(),
           &loss, x.data(), targets.data(), norm_w.data(), lm.data(), ws.data());
  native::CublasLt lt;
  Dev<unsigned char> gemm_ws(lt.workspace_bytes()), dws(ws.size());
  std::vector<float> first_dx;
  double first_loss = 0;
  for (int run = 0; run < 2; ++run) {
    Dev<float> ddx(x.size()), ddnorm(std::vector<float>(norm_w.size(), 0.0f)),
        ddlm(std::vector<float>(lm.size(), 0.0f));
    Dev<double> dloss(std::vector<double>{0.0});
    Dev<float> dxin(x), dnw(norm_w);
    Dev<int32_t> dt(targets);
    Dev<bf16_t> dlmw(lm);
    run_head([](auto&&... a) { native::head_forward_backward(a...); }, GemmContext{&lt, gemm_ws.p()}, ddx.p(),
             ddnorm.p(), ddlm.p(), dloss.p(), dxin.p(), dt.p(), dnw.p(), dlmw.p(), dws.p());
    sync("head");
    const double got = dloss.get()[0];
    if (run == 0) {
      EXPECT_NEAR(got, loss, 1e-4 * loss);
      first_loss = got, first_dx = ddx.get();
    } else {
      EXPECT_EQ(got, first_loss);
      EXPECT_BITWISE_EQ(ddx.get(), first_dx);
    }
  }
}

}  // namespace
}  // namespace lt::cuda

#else

TEST(CudaNative, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (no nvcc was found)"; }

#endif
