// Gated DeltaNet's fused conv + q/k L2 norm kernels (cuda/kernels/conv_l2norm.cuh) under cuda-sim against the
// separate kernels the CUDA layer ran before (convert, short_conv_forward, l2norm_forward of q and of k;
// l2norm_backward of q and of k, short_conv_backward — each tested against its CPU op in
// test_kernels_linear_attention.cpp): bit for bit in every thread order, on the packed (16-byte) and the
// one-channel paths, rows of several documents, a head longer than the norms' 256-element stage, sentinel guards
// around every output; dout's v channels are left as they were; dweight accumulates into what it held and is not
// made when frozen (null).
//
// Legend: N tokens (B rows of T), Hk key heads of dk, Hv value heads of dv, Cc = 2·Hk·dk + Hv·dv, K conv width.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/sim_orders.h"

namespace lt::cuda {
namespace {

using testing::for_each_order;
using testing::Guarded;
using testing::random_floats;

constexpr Stream kStream = nullptr;
constexpr float kEps = 1e-6f;

struct FusedCase {
  int64_t N, T, Hk, dk, Hv, dv, K;
  bool packed_docs;  // doc_ids with several documents per row; else null
  int64_t Cc() const { return 2 * Hk * dk + Hv * dv; }
  int64_t KD() const { return Hk * dk; }
};
// dk 16, 8, 128 and 264 (past one 256-element stage) take 16-byte packs; dk 5 and 7 one channel a lane; N 70 and
// 130 several dweight chunks; K 3 and 1 the edges.
const FusedCase kCases[] = {{70, 35, 2, 16, 3, 16, 4, true},  {37, 37, 1, 5, 2, 3, 4, false},
                            {130, 65, 3, 8, 1, 24, 3, true},  {12, 4, 2, 128, 1, 128, 4, true},
                            {9, 9, 1, 7, 1, 5, 1, false},     {33, 11, 1, 264, 1, 8, 4, true}};

std::vector<int32_t> doc_ids(const FusedCase& c, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(c.N));
  for (int64_t n = 0; n < c.N; ++n)
    ids[size_t(n)] = n % c.T == 0 ? 0 : ids[size_t(n - 1)] + (rng.below(4) == 0 ? 1 : 0);
  return ids;
}

struct Forward {
  std::vector<bf16_t> pre, out, qk_hat;
  std::vector<float> q_rnorm, k_rnorm;
};

// The separate kernels' forward: what the layer ran before the fusion.
Forward separate_forward(const FusedCase& c, const std::vector<float>& p, const std::vector<float>& w,
                         const int32_t* doc) {
  const int64_t N = c.N, Cc = c.Cc(), KD = c.KD();
  Forward f{std::vector<bf16_t>(p.size()), std::vector<bf16_t>(p.size()), std::vector<bf16_t>(size_t(N * 2 * KD)),
            std::vector<float>(size_t(N * c.Hk)), std::vector<float>(size_t(N * c.Hk))};
  sim::convert(kStream, f.pre.data(), p.data(), N * Cc);
  sim::short_conv_forward(kStream, f.out.data(), f.pre.data(), w.data(), doc, N, c.T, Cc, c.K);
  sim::l2norm_forward(kStream, f.qk_hat.data(), f.q_rnorm.data(), f.out.data(), N, c.Hk, c.dk, 2 * KD, Cc, kEps);
  sim::l2norm_forward(kStream, f.qk_hat.data() + KD, f.k_rnorm.data(), f.out.data() + KD, N, c.Hk, c.dk, 2 * KD, Cc,
                      kEps);
  return f;
}

TEST(CudaSimConvL2Norm, ForwardIsTheSeparateKernelsBitwise) {
  for (const FusedCase& c : kCases) {
    SCOPED_TRACE(testing::shape_name({c.N, c.T, c.Hk, c.dk, c.Hv, c.dv, c.K}));
    const int64_t N = c.N, Cc = c.Cc();
    const auto p = random_floats(size_t(N * Cc), 3 + c.dk);
    const auto w = random_floats(size_t(Cc * c.K), 5 + c.dk, -1.0f, 1.0f);
    const auto ids = doc_ids(c, 7);
    const int32_t* doc = c.packed_docs ? ids.data() : nullptr;
    const Forward want = separate_forward(c, p, w, doc);
    for_each_order([&] {
      Guarded<bf16_t> pre(want.pre.size()), out(want.out.size()), qk_hat(want.qk_hat.size());
      Guarded<float> q_rnorm(want.q_rnorm.size()), k_rnorm(want.k_rnorm.size());
      sim::conv_l2norm_forward(kStream, pre.data(), out.data(), qk_hat.data(), q_rnorm.data(), k_rnorm.data(),
                               p.data(), w.data(), doc, N, c.T, Cc, c.K, c.Hk, c.dk, kEps);
      EXPECT_BITWISE_EQ(pre.values(), want.pre);
      EXPECT_BITWISE_EQ(out.values(), want.out);
      EXPECT_BITWISE_EQ(qk_hat.values(), want.qk_hat);
      EXPECT_BITWISE_EQ(q_rnorm.values(), want.q_rnorm);
      EXPECT_BITWISE_EQ(k_rnorm.values(), want.k_rnorm);
      EXPECT_TRUE(pre.guards_intact() && out.guards_intact() && qk_hat.guards_intact() && q_rnorm.guards_intact() &&
                  k_rnorm.guards_intact());
    });
  }
}

TEST(CudaSimConvL2Norm, BackwardIsTheSeparateKernelsBitwise) {
  for (const FusedCase& c : kCases) {
    SCOPED_TRACE(testing::shape_name({c.N, c.T, c.Hk, c.dk, c.Hv, c.dv, c.K}));
    const int64_t N = c.N, Cc = c.Cc(), KD = c.KD();
    const auto p = random_floats(size_t(N * Cc), 13 + c.dk);
    const auto w = random_floats(size_t(Cc * c.K), 15 + c.dk, -1.0f, 1.0f);
    const auto ids = doc_ids(c, 17);
    const int32_t* doc = c.packed_docs ? ids.data() : nullptr;
    const Forward f = separate_forward(c, p, w, doc);
    const auto dqk = random_floats(size_t(N * 2 * KD), 19 + c.dk);
    // The conv output's gradient: q and k from the norms' backward, v as the delta rule leaves it.
    const auto dv = random_floats(size_t(N * Cc), 21 + c.dk);
    const auto dweight0 = random_floats(w.size(), 23, -0.5f, 0.5f);
    std::vector<float> dout = dv, want_dx(dv.size()), want_dw = dweight0;
    sim::l2norm_backward(kStream, dout.data(), dqk.data(), f.out.data(), f.q_rnorm.data(), N, c.Hk, c.dk, Cc, 2 * KD,
                         Cc);
    sim::l2norm_backward(kStream, dout.data() + KD, dqk.data() + KD, f.out.data() + KD, f.k_rnorm.data(), N, c.Hk,
                         c.dk, Cc, 2 * KD, Cc);
    std::vector<unsigned char> ws(short_conv_backward_workspace_bytes(N, Cc, c.K));
    sim::short_conv_backward(kStream, want_dx.data(), want_dw.data(), dout.data(), f.pre.data(), w.data(), doc, N, c.T,
                             Cc, c.K, ws.data());
    for_each_order([&] {
      Guarded<float> dx(want_dx.size()), dw(dweight0), dout_fused(dv), dx_frozen(want_dx.size()), dout_frozen(dv);
      Guarded<unsigned char> workspace(ws.size());
      sim::conv_l2norm_backward(kStream, dx.data(), dw.data(), dout_fused.data(), dqk.data(), f.pre.data(),
                                f.q_rnorm.data(), f.k_rnorm.data(), w.data(), doc, N, c.T, Cc, c.K, c.Hk, c.dk,
                                workspace.data());
      EXPECT_BITWISE_EQ(dx.values(), want_dx);
      EXPECT_BITWISE_EQ(dw.values(), want_dw);
      sim::conv_l2norm_backward(kStream, dx_frozen.data(), nullptr, dout_frozen.data(), dqk.data(), f.pre.data(),
                                f.q_rnorm.data(), f.k_rnorm.data(), w.data(), doc, N, c.T, Cc, c.K, c.Hk, c.dk,
                                workspace.data());
      EXPECT_BITWISE_EQ(dx_frozen.values(), want_dx);
      // dout's q and k channels are scratch; its v channels (dv) are read, not written.
      const auto left = dout_fused.values();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t ch = 2 * KD; ch < Cc; ++ch) ASSERT_EQ(left[size_t(n * Cc + ch)], dv[size_t(n * Cc + ch)]);
      EXPECT_TRUE(dx.guards_intact() && dw.guards_intact() && dout_fused.guards_intact() && dx_frozen.guards_intact() &&
                  dout_frozen.guards_intact() && workspace.guards_intact());
    });
  }
}

}  // namespace
}  // namespace lt::cuda
