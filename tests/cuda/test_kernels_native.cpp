// The kernels on a real GPU (built with nvcc; skipped with the reason when there is no GPU): each native
// kernel against the same kernel under cuda-sim — bit for bit for those whose arithmetic is the CPU op's
// (nvcc's -fmad=false and IEEE division/sqrt promise it), within f32 rounding for attention, the head and the
// delta-rule gates (expf / log1pf), within a bf16 rounding for the tensor-core attention — and every native
// result bitwise the same when run twice (no atomics, fixed orders, cuBLASLt's algorithm cached per shape). The
// tensor core's fragment layout against the emulation cuda-sim runs; the cuBLASLt wrapper against its
// emulation, and the property the executor's token chunks rely on: a row of a GEMM does not depend on how many
// rows the call has.
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
#include "model/lora_mask.h"
#include "ops/embedding.h"
#include "ops/rope.h"

namespace lt::cuda {
namespace {

using testing::random_floats;
using testing::rel_l2;
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
  // RMSNorm forward + backward, f32: C odd (one element a lane) and the 7B's hidden 3584 (16-byte packs).
  for (const int64_t Cn : {C, int64_t(3584)}) {
    SCOPED_TRACE("C " + std::to_string(Cn));
    const int64_t nn = rows * Cn;
    std::vector<float> out(static_cast<size_t>(nn)), rstd(static_cast<size_t>(rows)), din(static_cast<size_t>(nn)),
        dw(static_cast<size_t>(Cn), 0.25f);
    std::vector<unsigned char> ws(rmsnorm_backward_workspace_bytes(rows, Cn));
    sim::rmsnorm_forward(nullptr, out.data(), rstd.data(), x.data(), w.data(), rows, Cn, 1e-6f);
    sim::rmsnorm_backward(nullptr, din.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), rows, Cn,
                          ws.data());
    for (int run = 0; run < 2; ++run) {
      Dev<float> dx(x), dwt(w), dg(g), dout(static_cast<size_t>(nn)), drstd(static_cast<size_t>(rows)),
          ddin(static_cast<size_t>(nn)), ddw(std::vector<float>(static_cast<size_t>(Cn), 0.25f));
      Dev<unsigned char> dws(ws.size());
      native::rmsnorm_forward(nullptr, dout.p(), drstd.p(), dx.p(), dwt.p(), rows, Cn, 1e-6f);
      native::rmsnorm_backward(nullptr, ddin.p(), ddw.p(), dg.p(), dx.p(), dwt.p(), drstd.p(), rows, Cn, dws.p());
      sync("rmsnorm");
      EXPECT_BITWISE_EQ(dout.get(), out);
      EXPECT_BITWISE_EQ(drstd.get(), rstd);
      EXPECT_BITWISE_EQ(ddin.get(), din);
      EXPECT_BITWISE_EQ(ddw.get(), dw);
    }
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
  // RoPE on packed positions at D = 128 (16-byte packs) and D = 10 (a pair a thread).
  const int64_t N = 777, H = 5, P = 512;
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) pos[static_cast<size_t>(t)] = int32_t((t * 37) % P);
  Dev<int32_t> dpos(pos);
  for (const int64_t D : {128, 10}) {
    SCOPED_TRACE("D " + std::to_string(D));
    std::vector<float> cos(size_t(P * D / 2)), sin(cos.size());
    rope_table(cos.data(), sin.data(), P, D, 1e6);
    auto q = random_floats(size_t(N * H * D), 5);
    std::vector<float> q_sim = q;
    sim::rope_forward(nullptr, q_sim.data(), pos.data(), cos.data(), sin.data(), N, H, D);
    Dev<float> dq(q), dcos(cos), dsin(sin);
    native::rope_forward(nullptr, dq.p(), dpos.p(), dcos.p(), dsin.p(), N, H, D);
    sync("rope");
    EXPECT_BITWISE_EQ(dq.get(), q_sim);
  }
  // The embedding backward's rows over repeated ids: C 257 the scalar path, 264 the packed one.
  const int64_t V = 1000;
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) ids[static_cast<size_t>(t)] = int32_t((t * t) % V);
  const TokenGroups tg = group_tokens_by_id(ids.data(), N, V);
  const int64_t Pe = int64_t(tg.present.size());  // ids present
  for (const int64_t Ce : {int64_t(257), int64_t(264)}) {
    const auto de = random_floats(size_t(N * Ce), 6);
    std::vector<float> rows_sim(size_t(Pe * Ce));
    sim::embedding_grad_rows(nullptr, rows_sim.data(), de.data(), tg.start.data(), tg.order.data(), Pe, Ce);
    Dev<float> drows(std::vector<float>(size_t(Pe * Ce), 0.0f)), dde(de);
    Dev<int32_t> dstart(tg.start), dorder(tg.order);
    native::embedding_grad_rows(nullptr, drows.p(), dde.p(), dstart.p(), dorder.p(), Pe, Ce);
    sync("embedding rows");
    SCOPED_TRACE("C " + std::to_string(Ce));
    EXPECT_BITWISE_EQ(drows.get(), rows_sim);
  }
}

// LoRA dropout (cuda/kernels/lora.cuh): the mask is model/lora_mask.h's 64-bit hash on the device too — the dropped
// operand (bf16 and f32, from bf16 and f32 inputs), an expert's grouped rows (each row's token through `gather`) and
// the masked input gradient give cuda-sim's bits, which are the CPU block's mask; a frozen norm's null dweight skips
// the reduction and leaves din's bits.
TEST(CudaNative, LoraDropoutAndFrozenNormKernelsGiveTheSimulatedBits) {
  SKIP_WITHOUT_GPU();
  const int64_t N = 1031, in_f = 777, n = N * in_f, row0 = 4096;
  const uint64_t key = 0x9e3779b97f4a7c15ull;
  const float p = 0.3f;
  const auto x = random_floats(static_cast<size_t>(n), 11), dx = random_floats(static_cast<size_t>(n), 12);
  const auto xb = to_bf16(x);
  std::vector<bf16_t> out_b(static_cast<size_t>(n));
  std::vector<float> out_f(static_cast<size_t>(n)), din = random_floats(static_cast<size_t>(n), 13);
  const std::vector<float> din0 = din;
  // Grouped rows: row r holds assignment gather[r] = t·k + j of token row0 + t (k = 3).
  std::vector<int32_t> gather(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) gather[size_t(r)] = int32_t((r * 389) % (3 * N));
  std::vector<float> out_g(static_cast<size_t>(n));
  sim::lora_dropout(nullptr, out_b.data(), xb.data(), key, row0, nullptr, 1, N, in_f, p);
  sim::lora_dropout(nullptr, out_f.data(), x.data(), key, row0, nullptr, 1, N, in_f, p);
  sim::lora_dropout(nullptr, out_g.data(), x.data(), key, row0, gather.data(), 3, N, in_f, p);
  sim::lora_dropout_backward(nullptr, din.data(), dx.data(), key, row0, nullptr, 1, N, in_f, p);
  for (int64_t r : {int64_t(0), int64_t(517), N - 1})
    for (int64_t i : {int64_t(0), in_f - 1}) {
      const uint64_t token = uint64_t(row0 + gather[size_t(r)] / 3);
      EXPECT_EQ(out_g[size_t(r * in_f + i)] != 0.0f, lora_keep(key, token * uint64_t(in_f) + uint64_t(i), p));
    }
  int64_t kept = 0;
  for (int64_t e = 0; e < n; ++e) kept += lora_keep(key, uint64_t(row0 * in_f + e), p) ? 1 : 0;
  EXPECT_NEAR(double(kept) / double(n), 1.0 - p, 0.01);
  for (int run = 0; run < 2; ++run) {
    Dev<bf16_t> dxb(xb), dout_b(static_cast<size_t>(n));
    Dev<float> dxf(x), dout_f(static_cast<size_t>(n)), dout_g(static_cast<size_t>(n)), ddx(dx), ddin(din0);
    Dev<int32_t> dgather(gather);
    native::lora_dropout(nullptr, dout_b.p(), dxb.p(), key, row0, nullptr, 1, N, in_f, p);
    native::lora_dropout(nullptr, dout_f.p(), dxf.p(), key, row0, nullptr, 1, N, in_f, p);
    native::lora_dropout(nullptr, dout_g.p(), dxf.p(), key, row0, dgather.p(), 3, N, in_f, p);
    native::lora_dropout_backward(nullptr, ddin.p(), ddx.p(), key, row0, nullptr, 1, N, in_f, p);
    sync("lora dropout");
    EXPECT_BITWISE_EQ(dout_b.get(), out_b);
    EXPECT_BITWISE_EQ(dout_f.get(), out_f);
    EXPECT_BITWISE_EQ(dout_g.get(), out_g);
    EXPECT_BITWISE_EQ(ddin.get(), din);
  }
  const int64_t rows = 513, C = 1027;
  const auto rx = random_floats(static_cast<size_t>(rows * C), 14), rg = random_floats(static_cast<size_t>(rows * C), 15);
  const auto rw = random_floats(static_cast<size_t>(C), 16, 0.5f, 1.5f);
  std::vector<float> rout(rx.size()), rstd(static_cast<size_t>(rows)), rdin(rx.size());
  std::vector<unsigned char> ws(rmsnorm_backward_workspace_bytes(rows, C));
  sim::rmsnorm_forward(nullptr, rout.data(), rstd.data(), rx.data(), rw.data(), rows, C, 1e-6f);
  sim::rmsnorm_backward(nullptr, rdin.data(), nullptr, rg.data(), rx.data(), rw.data(), rstd.data(), rows, C, ws.data());
  Dev<float> drx(rx), drg(rg), drw(rw), drstd(rstd), drdin(rx.size());
  Dev<unsigned char> dws(ws.size());
  native::rmsnorm_backward(nullptr, drdin.p(), nullptr, drg.p(), drx.p(), drw.p(), drstd.p(), rows, C, dws.p());
  sync("rmsnorm backward, frozen weight");
  EXPECT_BITWISE_EQ(drdin.get(), rdin);
}

// The tensor core's m16n8k16 product against mma.cuh's shuffle emulation (the fragment layout every tensor-core
// kernel's cuda-sim run assumes): a wrong layout moves results by O(1); the two sum 16 exact products in
// different orders, so they agree to f32 rounding of a sum of size ≲ 16.
TEST(CudaNative, MmaFragmentLayoutIsTheEmulations) {
  SKIP_WITHOUT_GPU();
  const auto av = to_bf16(random_floats(32 * 8, 41)), bv = to_bf16(random_floats(32 * 4, 42));
  std::vector<uint32_t> a(32 * 4), b(32 * 2);
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint32_t(av[2 * i]) | (uint32_t(av[2 * i + 1]) << 16);
  for (size_t i = 0; i < b.size(); ++i) b[i] = uint32_t(bv[2 * i]) | (uint32_t(bv[2 * i + 1]) << 16);
  Dev<uint32_t> da(a), db(b);
  Dev<float> dc(random_floats(32 * 4, 43)), hw(32 * 4), emu(32 * 4);
  native::mma_layout_check(nullptr, hw.p(), emu.p(), da.p(), db.p(), dc.p());
  sync("mma_layout_check");
  const auto h = hw.get(), e = emu.get();
  for (size_t i = 0; i < h.size(); ++i) ASSERT_NEAR(h[i], e[i], 1e-5 * (16 + std::abs(e[i]))) << "lane " << i / 4;
}

// ldmatrix (plain and transposed) against mma.cuh's emulation: pure data movement, so bit for bit.
TEST(CudaNative, LdmatrixLayoutIsTheEmulations) {
  SKIP_WITHOUT_GPU();
  Dev<bf16_t> tile(to_bf16(random_floats(32 * 8, 44)));
  Dev<uint32_t> out(4 * 32 * 4);
  native::ldmatrix_layout_check(nullptr, out.p(), tile.p());
  sync("ldmatrix_layout_check");
  const auto r = out.get();
  for (int form = 0; form < 2; ++form)
    for (int i = 0; i < 32 * 4; ++i)
      ASSERT_EQ(r[size_t((2 * form) * 128 + i)], r[size_t((2 * form + 1) * 128 + i)])
          << (form ? "transposed" : "plain") << ", lane " << i / 4 << ", matrix " << i % 4;
}

TEST(CudaNative, AttentionIsDeterministicAndMatchesTheSimulation) {
  SKIP_WITHOUT_GPU();
  for (const int64_t D : {64, 128, 256}) {
    const AttentionShape s{2, 157, 8, 2, D};  // odd T over 3 tiles; the emulated mma makes the sim side slow
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
        // GPU expf and the sim's differ by an ulp or two: f32-level agreement. At D 64, 128 and 256 the tensor-core
        // kernels round P and dS to bf16 from f32 values that differ at that level, so a value can land one bf16
        // ulp (2^-8 relative) apart: gradients within 2e-3 of their size there.
        const double tol = attention_on_tensor_cores(D) ? 2e-3 : 1e-4;
        const std::vector<std::vector<float>> want{lse, dq, dk, dv};
        for (size_t i = 0; i < now.size(); ++i) {
          double scale = 1.0;
          for (float x : want[i]) scale = std::max(scale, double(std::abs(x)));
          for (size_t j = 0; j < now[i].size(); ++j)
            ASSERT_NEAR(now[i][j], want[i][j], (i == 0 ? 1e-4 : tol) * scale) << "output " << i << " element " << j;
        }
        first = now;
      } else {
        for (size_t i = 0; i < now.size(); ++i) EXPECT_BITWISE_EQ(now[i], first[i]);
      }
    }
  }
}

// The forward's 32-row warps (two m-tiles, Q from shared memory) against its 16-row ones, on the GPU: the same bits,
// as under cuda-sim (CudaSimAttention.ForwardWarpsOf32RowsGiveTheBitsOf16).
TEST(CudaNative, AttentionForwardWarpsOf32RowsGiveTheBitsOf16) {
  SKIP_WITHOUT_GPU();
  for (const int64_t D : {64, 128}) {
    const AttentionShape s{2, 301, 8, 2, D};  // three 128-row blocks, the last one partial
    SCOPED_TRACE("D=" + std::to_string(D));
    const size_t nq = size_t(s.B * s.T * s.Hq * D), nk = size_t(s.B * s.T * s.Hkv * D), nl = size_t(s.B * s.Hq * s.T);
    Dev<bf16_t> q(to_bf16(random_floats(nq, 21))), k(to_bf16(random_floats(nk, 22))), v(to_bf16(random_floats(nk, 23)));
    auto forward = [&](int rows) {
      const AttentionForwardWarpRows setting(rows);
      Dev<bf16_t> out(nq);
      Dev<float> lse(nl);
      native::attention_forward(nullptr, out.p(), lse.p(), q.p(), k.p(), v.p(), nullptr, s);
      sync("attention_forward");
      return std::vector<std::vector<float>>{testing::to_f32(out.get()), lse.get()};
    };
    const auto sixteen = forward(16), thirty_two = forward(32);
    for (size_t i = 0; i < sixteen.size(); ++i) EXPECT_BITWISE_EQ(thirty_two[i], sixteen[i]);
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
  // V = 5003: the cross-entropy an element at a time; 5008: in packs of eight (16-byte loads and stores).
  for (const int64_t V : {int64_t(5003), int64_t(5008)}) {
    SCOPED_TRACE("V = " + std::to_string(V));
    const HeadShape shape{1000, 512, V, 1e-6f, 256};
    const auto x = random_floats(size_t(shape.N * shape.C), 31);
    const auto norm_w = random_floats(size_t(shape.C), 32, 0.5f, 1.5f);
    const auto lm = to_bf16(random_floats(size_t(shape.V * shape.C), 33, -0.1f, 0.1f));
    std::vector<int32_t> targets(size_t(shape.N));
    for (int64_t t = 0; t < shape.N; ++t)
      targets[static_cast<size_t>(t)] = t % 17 == 0 ? kIgnoreIndex : int32_t((t * 131) % shape.V);
    auto run_head = [&](auto&& head, GemmContext gemm, float* dx, float* dnorm, float* dlm, double* loss,
                        const float* xp, const int32_t* tp, const float* nw, const void* lmp, void* ws) {
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
}

// The Qwen3.5 / Qwen3.6 layer kernels at a layer's sizes, bf16 storage where the block stores bf16: the simulated
// bits, and the same bits on a second run. delta_gates' expf / log1pf are the GPU's (within 2 ulp, not libm's):
// its g and da within 8e-6 relative (a few ulp through exp, log1p, one product and a division), dA_log and
// ddt_bias within 8e-6 of Σ|terms|; β and db use our own sigmoid, so bitwise.
TEST(CudaNative, Qwen35LayerKernelsGiveTheSimulatedBits) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, T = 1031, N = B * T, Hk = 3, dk = 128, Hv = 5, dv = 128, K = 4;
  const int64_t KD = Hk * dk, Cc = 2 * KD + Hv * dv;
  std::vector<int32_t> doc(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) doc[size_t(n)] = int32_t((n % T) / 300);  // four documents per row
  const auto xb = to_bf16(random_floats(size_t(N * Cc), 11));
  const auto cw = random_floats(size_t(Cc * K), 12, -1.0f, 1.0f), gc = random_floats(size_t(N * Cc), 13);
  // Short conv forward (bf16) and backward.
  std::vector<bf16_t> conv(xb.size());
  std::vector<float> cdx(xb.size()), cdw(cw.size(), 0.5f);
  std::vector<unsigned char> cws(short_conv_backward_workspace_bytes(N, Cc, K));
  sim::short_conv_forward(nullptr, conv.data(), xb.data(), cw.data(), doc.data(), N, T, Cc, K);
  sim::short_conv_backward(nullptr, cdx.data(), cdw.data(), gc.data(), xb.data(), cw.data(), doc.data(), N, T, Cc, K,
                           cws.data());
  // L2 norm of q and k (strided in the conv output), forward into [N, 2·KD] and backward.
  std::vector<bf16_t> qk(size_t(N * 2 * KD));
  std::vector<float> rn(size_t(N * Hk)), l2dx(size_t(N * Cc), 0.0f);
  const auto gqk = random_floats(qk.size(), 14);
  sim::l2norm_forward(nullptr, qk.data(), rn.data(), conv.data(), N, Hk, dk, 2 * KD, Cc, 1e-6f);
  sim::l2norm_backward(nullptr, l2dx.data(), gqk.data(), conv.data(), rn.data(), N, Hk, dk, Cc, 2 * KD, Cc);
  // Gated RMSNorm, bf16 o and z.
  const int64_t rows = N * Hv;
  const auto ob = to_bf16(random_floats(size_t(rows * dv), 15)), zb = to_bf16(random_floats(size_t(rows * dv), 16));
  const auto nw = random_floats(static_cast<size_t>(dv), 17, 0.5f, 1.5f), gy = random_floats(size_t(rows * dv), 18);
  std::vector<bf16_t> y(ob.size());
  std::vector<float> rstd(static_cast<size_t>(rows)), gdx(ob.size()), gdz(ob.size()), gdw(nw.size(), 0.5f);
  std::vector<unsigned char> gws(rmsnorm_backward_workspace_bytes(rows, dv));
  sim::gated_rmsnorm_forward(nullptr, y.data(), rstd.data(), ob.data(), zb.data(), nw.data(), rows, dv, 1e-6f);
  sim::gated_rmsnorm_backward(nullptr, gdx.data(), gdz.data(), gdw.data(), gy.data(), ob.data(), zb.data(), nw.data(),
                              rstd.data(), rows, dv, gws.data());
  // The σ output gate on q_proj's rows [N, Hq, 2D], and partial RoPE (R = D/4) on the gathered queries.
  const int64_t Hq = 5, D = 256, R = D / 4, P = 512;
  const auto qraw = to_bf16(random_floats(size_t(N * Hq * 2 * D), 19));
  const auto att = to_bf16(random_floats(size_t(N * Hq * D), 20));
  const auto gatt = random_floats(att.size(), 21);
  std::vector<bf16_t> gated(att.size()), q(att.size());
  std::vector<float> sdx(att.size()), sdq(qraw.size(), 0.0f);
  std::vector<float> cos(size_t(P * R / 2)), sin(cos.size());
  rope_table(cos.data(), sin.data(), P, R, 1e7);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) pos[size_t(n)] = int32_t((n * 37) % P);
  sim::sigmoid_gate_forward(nullptr, gated.data(), att.data(), qraw.data() + D, N, Hq, D, Hq * 2 * D, 2 * D);
  sim::sigmoid_gate_backward(nullptr, sdx.data(), sdq.data() + D, gatt.data(), att.data(), qraw.data() + D, N, Hq, D,
                             Hq * 2 * D, 2 * D);
  sim::gather_queries(nullptr, q.data(), qraw.data(), N * Hq, D);
  sim::rope_partial_forward(nullptr, q.data(), pos.data(), cos.data(), sin.data(), N, Hq, D, R);
  for (int run = 0; run < 2; ++run) {
    Dev<bf16_t> dxb(xb), dconv(conv.size()), dqk(qk.size()), dob(ob), dzb(zb), dy(y.size()), dqraw(qraw), datt(att),
        dgated(gated.size()), dq(q.size());
    Dev<float> dcw(cw), dgc(gc), dcdx(cdx.size()), dcdw(std::vector<float>(cw.size(), 0.5f)), drn(rn.size()),
        dgqk(gqk), dl2dx(std::vector<float>(l2dx.size(), 0.0f)), dnw(nw), dgy(gy), drstd(rstd.size()),
        dgdx(gdx.size()), dgdz(gdz.size()), dgdw(std::vector<float>(nw.size(), 0.5f)), dgatt(gatt),
        dsdx(sdx.size()), dsdq(std::vector<float>(sdq.size(), 0.0f)), dcos(cos), dsin(sin);
    Dev<int32_t> ddoc(doc), dpos(pos);
    Dev<unsigned char> dcws(cws.size()), dgws(gws.size());
    native::short_conv_forward(nullptr, dconv.p(), dxb.p(), dcw.p(), ddoc.p(), N, T, Cc, K);
    native::short_conv_backward(nullptr, dcdx.p(), dcdw.p(), dgc.p(), dxb.p(), dcw.p(), ddoc.p(), N, T, Cc, K,
                                dcws.p());
    native::l2norm_forward(nullptr, dqk.p(), drn.p(), dconv.p(), N, Hk, dk, 2 * KD, Cc, 1e-6f);
    native::l2norm_backward(nullptr, dl2dx.p(), dgqk.p(), dconv.p(), drn.p(), N, Hk, dk, Cc, 2 * KD, Cc);
    native::gated_rmsnorm_forward(nullptr, dy.p(), drstd.p(), dob.p(), dzb.p(), dnw.p(), rows, dv, 1e-6f);
    native::gated_rmsnorm_backward(nullptr, dgdx.p(), dgdz.p(), dgdw.p(), dgy.p(), dob.p(), dzb.p(), dnw.p(),
                                   drstd.p(), rows, dv, dgws.p());
    native::sigmoid_gate_forward(nullptr, dgated.p(), datt.p(), dqraw.p() + D, N, Hq, D, Hq * 2 * D, 2 * D);
    native::sigmoid_gate_backward(nullptr, dsdx.p(), dsdq.p() + D, dgatt.p(), datt.p(), dqraw.p() + D, N, Hq, D,
                                  Hq * 2 * D, 2 * D);
    native::gather_queries(nullptr, dq.p(), dqraw.p(), N * Hq, D);
    native::rope_partial_forward(nullptr, dq.p(), dpos.p(), dcos.p(), dsin.p(), N, Hq, D, R);
    sync("qwen3.5 layer kernels");
    EXPECT_BITWISE_EQ(dconv.get(), conv);
    EXPECT_BITWISE_EQ(dcdx.get(), cdx);
    EXPECT_BITWISE_EQ(dcdw.get(), cdw);
    EXPECT_BITWISE_EQ(dqk.get(), qk);
    EXPECT_BITWISE_EQ(drn.get(), rn);
    EXPECT_BITWISE_EQ(dl2dx.get(), l2dx);
    EXPECT_BITWISE_EQ(dy.get(), y);
    EXPECT_BITWISE_EQ(drstd.get(), rstd);
    EXPECT_BITWISE_EQ(dgdx.get(), gdx);
    EXPECT_BITWISE_EQ(dgdz.get(), gdz);
    EXPECT_BITWISE_EQ(dgdw.get(), gdw);
    EXPECT_BITWISE_EQ(dgated.get(), gated);
    EXPECT_BITWISE_EQ(dsdx.get(), sdx);
    EXPECT_BITWISE_EQ(dsdq.get(), sdq);
    EXPECT_BITWISE_EQ(dq.get(), q);
  }
  // The gates, f32.
  const auto b = random_floats(size_t(N * Hv), 22, -8.0f, 8.0f), a = random_floats(size_t(N * Hv), 23, -26.0f, 26.0f);
  const auto A_log = random_floats(static_cast<size_t>(Hv), 24, -1.5f, 1.5f);
  const auto dt_bias = random_floats(static_cast<size_t>(Hv), 25, -1.0f, 1.0f);
  const auto dbeta = random_floats(b.size(), 26), dgg = random_floats(b.size(), 27);
  std::vector<float> beta(b.size()), gg(b.size()), db(b.size()), da(b.size()), dA(A_log.size(), 0.0f),
      ddt(A_log.size(), 0.0f);
  std::vector<unsigned char> dws(delta_gates_backward_workspace_bytes(N, Hv));
  sim::delta_gates_forward(nullptr, beta.data(), gg.data(), b.data(), a.data(), A_log.data(), dt_bias.data(), N, Hv);
  sim::delta_gates_backward(nullptr, db.data(), da.data(), dA.data(), ddt.data(), dbeta.data(), dgg.data(), b.data(),
                            a.data(), A_log.data(), dt_bias.data(), N, Hv, dws.data());
  std::vector<double> abs_dA(A_log.size(), 0.0), abs_ddt(A_log.size(), 0.0);  // Σ|terms| per head
  for (int64_t i = 0; i < N * Hv; ++i) {
    abs_dA[size_t(i % Hv)] += std::abs(double(dgg[size_t(i)]) * double(gg[size_t(i)]));
    abs_ddt[size_t(i % Hv)] += std::abs(double(da[size_t(i)]));
  }
  std::vector<float> first_g, first_da, first_dA, first_ddt;
  for (int run = 0; run < 2; ++run) {
    Dev<float> d_b(b), d_a(a), d_A(A_log), d_dt(dt_bias), d_beta(b.size()), d_g(b.size()), d_dbeta(dbeta),
        d_dg(dgg), d_db(b.size()), d_da(b.size()), d_dA(std::vector<float>(A_log.size(), 0.0f)),
        d_ddt(std::vector<float>(A_log.size(), 0.0f));
    Dev<unsigned char> d_ws(dws.size());
    native::delta_gates_forward(nullptr, d_beta.p(), d_g.p(), d_b.p(), d_a.p(), d_A.p(), d_dt.p(), N, Hv);
    native::delta_gates_backward(nullptr, d_db.p(), d_da.p(), d_dA.p(), d_ddt.p(), d_dbeta.p(), d_dg.p(), d_b.p(),
                                 d_a.p(), d_A.p(), d_dt.p(), N, Hv, d_ws.p());
    sync("delta gates");
    EXPECT_BITWISE_EQ(d_beta.get(), beta);
    EXPECT_BITWISE_EQ(d_db.get(), db);
    const auto g_got = d_g.get(), da_got = d_da.get(), dA_got = d_dA.get(), ddt_got = d_ddt.get();
    for (size_t i = 0; i < gg.size(); ++i) {
      ASSERT_NEAR(g_got[i], gg[i], 8e-6 * std::abs(gg[i])) << "g at " << i;
      ASSERT_NEAR(da_got[i], da[i], 8e-6 * std::abs(da[i])) << "da at " << i;
    }
    for (size_t h = 0; h < A_log.size(); ++h) {
      EXPECT_NEAR(dA_got[h], dA[h], 8e-6 * abs_dA[h]) << "dA_log at " << h;
      EXPECT_NEAR(ddt_got[h], ddt[h], 8e-6 * abs_ddt[h]) << "ddt_bias at " << h;
    }
    if (run == 0) {
      first_g = g_got, first_da = da_got, first_dA = dA_got, first_ddt = ddt_got;
    } else {
      EXPECT_BITWISE_EQ(g_got, first_g);
      EXPECT_BITWISE_EQ(da_got, first_da);
      EXPECT_BITWISE_EQ(dA_got, first_dA);
      EXPECT_BITWISE_EQ(ddt_got, first_ddt);
    }
  }
}

// The fused conv + q/k L2 norm (conv_l2norm.cuh) at a Qwen3.6 layer's head sizes, rows of four documents: the
// simulated bits (forward's stored tensors and norms, backward's dx and dweight), and the same bits on a second run.
TEST(CudaNative, ConvL2NormGivesTheSimulatedBits) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, T = 1031, N = B * T, Hk = 3, dk = 128, Hv = 5, dv = 128, K = 4;
  const int64_t KD = Hk * dk, Cc = 2 * KD + Hv * dv;
  std::vector<int32_t> doc(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) doc[size_t(n)] = int32_t((n % T) / 300);
  const auto p = random_floats(size_t(N * Cc), 31), cw = random_floats(size_t(Cc * K), 32, -1.0f, 1.0f);
  const auto dqk = random_floats(size_t(N * 2 * KD), 33), dv_in = random_floats(size_t(N * Cc), 34);
  std::vector<bf16_t> pre(p.size()), out(p.size()), qk(dqk.size());
  std::vector<float> qrn(size_t(N * Hk)), krn(qrn.size()), dx(p.size()), dw(cw.size(), 0.5f), dout = dv_in;
  std::vector<unsigned char> ws(short_conv_backward_workspace_bytes(N, Cc, K));
  sim::conv_l2norm_forward(nullptr, pre.data(), out.data(), qk.data(), qrn.data(), krn.data(), p.data(), cw.data(),
                           doc.data(), N, T, Cc, K, Hk, dk, 1e-6f);
  sim::conv_l2norm_backward(nullptr, dx.data(), dw.data(), dout.data(), dqk.data(), pre.data(), qrn.data(),
                            krn.data(), cw.data(), doc.data(), N, T, Cc, K, Hk, dk, ws.data());
  for (int run = 0; run < 2; ++run) {
    Dev<bf16_t> dpre_b(pre.size()), dconv(out.size()), dqkh(qk.size());
    Dev<float> dp(p), dcw(cw), dqrn(qrn.size()), dkrn(krn.size()), ddqk(dqk), ddx(dx.size()),
        ddw(std::vector<float>(cw.size(), 0.5f)), ddout(dv_in);
    Dev<int32_t> ddoc(doc);
    Dev<unsigned char> dws(ws.size());
    native::conv_l2norm_forward(nullptr, dpre_b.p(), dconv.p(), dqkh.p(), dqrn.p(), dkrn.p(), dp.p(), dcw.p(),
                                ddoc.p(), N, T, Cc, K, Hk, dk, 1e-6f);
    native::conv_l2norm_backward(nullptr, ddx.p(), ddw.p(), ddout.p(), ddqk.p(), dpre_b.p(), dqrn.p(), dkrn.p(),
                                 dcw.p(), ddoc.p(), N, T, Cc, K, Hk, dk, dws.p());
    sync("conv + l2norm");
    EXPECT_BITWISE_EQ(dpre_b.get(), pre);
    EXPECT_BITWISE_EQ(dconv.get(), out);
    EXPECT_BITWISE_EQ(dqkh.get(), qk);
    EXPECT_BITWISE_EQ(dqrn.get(), qrn);
    EXPECT_BITWISE_EQ(dkrn.get(), krn);
    EXPECT_BITWISE_EQ(ddx.get(), dx);
    EXPECT_BITWISE_EQ(ddw.get(), dw);
  }
}

// The gated delta rule at Qwen3.6's head dims, bf16 storage, packed rows, on tensor cores (gated_delta_mma*.cuh):
// the tensor core sums in another order than the emulation and the GPU's expf is within 2 ulp of libm's, so a bf16
// rounding of S₀, V', dS₁, dV' … may land one ulp (2⁻⁸) apart: within 4e-3 of the simulated kernels (as if every
// element were one ulp off; the kernels' own distance to the f64 recurrence is ~4e-3); the same bits on a second run.
TEST(CudaNative, GatedDeltaRuleIsDeterministicAndMatchesTheSimulation) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, T = 300, N = B * T, Hk = 2, Hv = 4, dk = 128, dv = 128, ld = 2 * Hk * dk + Hv * dv;
  const DeltaShape s{B, T, Hk, Hv, dk, dv, float(1.0 / std::sqrt(double(dk))), ld, ld, ld};
  auto qkv32 = random_floats(size_t(N * ld), 31, -1.0f, 1.0f);
  for (float& x : qkv32) x *= 0.15f;  // q and k rows of norm ~1, as after the layer's L2 norm
  const auto qkv = to_bf16(qkv32);
  const auto beta = random_floats(size_t(N * Hv), 32, 0.02f, 0.98f), dout = random_floats(size_t(N * Hv * dv), 33);
  auto g = random_floats(beta.size(), 34, -7.0f, 1.0f);
  for (float& x : g) x = -std::exp(x);
  std::vector<int32_t> doc(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) doc[size_t(n)] = int32_t((n % T) / 100);  // three documents per row
  const int64_t kq = Hk * dk, vq = 2 * Hk * dk;
  std::vector<bf16_t> o(size_t(N * Hv * dv));
  std::vector<float> dqkv(qkv.size(), 0.0f), dbeta(beta.size()), dg(g.size());
  std::vector<unsigned char> fws(gated_delta_forward_workspace_bytes(s)), bws(gated_delta_backward_workspace_bytes(s));
  sim::gated_delta_forward(nullptr, o.data(), qkv.data(), qkv.data() + kq, qkv.data() + vq, beta.data(), g.data(),
                           doc.data(), s, fws.data());
  sim::gated_delta_backward(nullptr, dqkv.data(), dqkv.data() + kq, dqkv.data() + vq, dbeta.data(), dg.data(),
                            dout.data(), qkv.data(), qkv.data() + kq, qkv.data() + vq, beta.data(), g.data(),
                            doc.data(), s, bws.data());
  std::vector<bf16_t> first_o;
  std::vector<float> first_dqkv, first_dg;
  for (int run = 0; run < 2; ++run) {
    Dev<bf16_t> d_qkv(qkv), d_o(o.size());
    Dev<float> d_beta(beta), d_g(g), d_dout(dout), d_dqkv(dqkv.size()), d_dbeta(beta.size()), d_dg(g.size());
    Dev<int32_t> d_doc(doc);
    Dev<unsigned char> d_fws(fws.size()), d_bws(bws.size());
    native::gated_delta_forward(nullptr, d_o.p(), d_qkv.p(), d_qkv.p() + kq, d_qkv.p() + vq, d_beta.p(), d_g.p(),
                                d_doc.p(), s, d_fws.p());
    native::gated_delta_backward(nullptr, d_dqkv.p(), d_dqkv.p() + kq, d_dqkv.p() + vq, d_dbeta.p(), d_dg.p(),
                                 d_dout.p(), d_qkv.p(), d_qkv.p() + kq, d_qkv.p() + vq, d_beta.p(), d_g.p(), d_doc.p(),
                                 s, d_bws.p());
    sync("gated delta rule");
    const auto o_got = d_o.get();
    const auto dqkv_got = d_dqkv.get(), dbeta_got = d_dbeta.get(), dg_got = d_dg.get();
    EXPECT_LT(rel_l2(testing::to_f32(o_got), testing::to_f32(o)), 4e-3);
    EXPECT_LT(rel_l2(dqkv_got, dqkv), 4e-3);
    EXPECT_LT(rel_l2(dbeta_got, dbeta), 4e-3);
    EXPECT_LT(rel_l2(dg_got, dg), 4e-3);
    if (run == 0) {
      first_o = o_got, first_dqkv = dqkv_got, first_dg = dg_got;
    } else {
      EXPECT_BITWISE_EQ(o_got, first_o);
      EXPECT_BITWISE_EQ(dqkv_got, first_dqkv);
      EXPECT_BITWISE_EQ(dg_got, first_dg);
    }
  }
}

}  // namespace
}  // namespace lt::cuda

#else

TEST(CudaNative, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (no nvcc was found)"; }

#endif
