// The Qwen3.5 / Qwen3.6 layer kernels (cuda/kernels/linear_attention.cuh, short_conv.cuh and partial RoPE in
// rope.cuh) under cuda-sim against the CPU ops: on f32 storage bit for bit (each kernel performs its CPU op's
// operations in its order), on bf16 storage equal to the CPU op run on the widened inputs with bf16 outputs
// rounded once — in every thread order, on odd shapes (not multiples of 16 lanes or 256 threads; several gradient
// chunks), packed rows of several documents for the conv, with sentinel guards around every output (and in the
// gaps of strided outputs); parameter gradients accumulate (two calls give the CPU op's two calls); the conv and
// gates backwards also against central finite differences of the forward kernels.
//
// Legend: N tokens (B rows of T), Cc conv channels, K conv width, H heads, D head dimension, Hv value heads,
// dv value head dimension, R rotary dims.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/sim_orders.h"
#include "ops/delta_gates.h"
#include "ops/gated_rmsnorm.h"
#include "ops/l2norm.h"
#include "ops/rope.h"
#include "ops/short_conv.h"
#include "ops/sigmoid_gate.h"

namespace lt::cuda {
namespace {

using testing::central_difference;
using testing::dot;
using testing::for_each_order;
using testing::Guarded;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

constexpr Stream kStream = nullptr;


// The initial contents (sentinel bytes) of a Guarded buffer of n elements: what an output buffer holds where a
// kernel must not write.
template <class T>
std::vector<T> sentinel_values(size_t n) {
  return Guarded<T>(n).values();
}

// ---- short conv ----

struct ConvCase {
  int64_t N, T, Cc, K;
  bool packed;  // doc_ids with several documents per row; else null (each row one document)
};
// N = 70 and 130 give 3 and 5 dweight chunks of 32 tokens; K = 4 is Qwen3.5's, 3 and 1 the edges, 6 the
// backward's 8-slot window, 9 past it (the per-tap kernels); Cc 48 and 16 take eight channels a thread in the
// forward (16-byte loads, short_conv.cuh).
const ConvCase kConvCases[] = {{70, 35, 53, 4, true},  {37, 37, 12, 4, false}, {12, 4, 5, 3, true},
                               {130, 65, 7, 4, true},  {9, 9, 3, 1, false},    {70, 35, 48, 4, true},
                               {37, 37, 16, 3, false}, {82, 41, 13, 6, true},  {46, 23, 16, 9, true}};

// doc_ids [N]: runs of random length inside each row, numbered from 0 in every row (only equality inside a row
// matters).
std::vector<int32_t> packed_doc_ids(int64_t N, int64_t T, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = n % T;
    ids[size_t(n)] = t == 0 ? 0 : ids[size_t(n - 1)] + (rng.below(5) == 0 ? 1 : 0);
  }
  return ids;
}

TEST(CudaSimLinearAttention, ShortConvForwardMatchesCpu) {
  for (const auto [N, T, Cc, K, packed] : kConvCases) {
    SCOPED_TRACE(testing::shape_name({N, T, Cc, K, int64_t(packed)}));
    const auto ids = packed_doc_ids(N, T, uint64_t(N + Cc));
    const int32_t* doc = packed ? ids.data() : nullptr;
    const auto x = random_floats(size_t(N * Cc), 1 + N), w = random_floats(size_t(Cc * K), 2 + Cc, -1.0f, 1.0f);
    std::vector<float> want(x.size());
    short_conv_forward(want.data(), x.data(), w.data(), doc, N, T, Cc, K);
    const auto xb = to_bf16(x);
    std::vector<float> want_b(x.size());
    short_conv_forward(want_b.data(), to_f32(xb).data(), w.data(), doc, N, T, Cc, K);
    for_each_order([&] {
      Guarded<float> out(x.size());
      Guarded<bf16_t> out_b(x.size());
      sim::short_conv_forward(kStream, out.data(), x.data(), w.data(), doc, N, T, Cc, K);
      sim::short_conv_forward(kStream, out_b.data(), xb.data(), w.data(), doc, N, T, Cc, K);
      EXPECT_BITWISE_EQ(out.values(), want);
      EXPECT_BITWISE_EQ(out_b.values(), to_bf16(want_b));
      EXPECT_TRUE(out.guards_intact() && out_b.guards_intact());
    });
  }
}

template <class T>
void check_short_conv_backward(const std::vector<T>& x, const std::vector<float>& x_f32, const ConvCase& c) {
  const auto [N, Tt, Cc, K, packed] = c;
  const auto ids = packed_doc_ids(N, Tt, uint64_t(N + Cc));
  const int32_t* doc = packed ? ids.data() : nullptr;
  const auto w = random_floats(size_t(Cc * K), 3 + Cc, -1.0f, 1.0f), g = random_floats(x.size(), 4 + N);
  const auto dw0 = random_floats(w.size(), 5);  // accumulated onto
  std::vector<float> want_dx(x.size()), want_dw = dw0;
  short_conv_backward(want_dx.data(), want_dw.data(), g.data(), x_f32.data(), w.data(), doc, N, Tt, Cc, K);
  std::vector<float> want_dw2 = want_dw;  // a second call adds again
  short_conv_backward(want_dx.data(), want_dw2.data(), g.data(), x_f32.data(), w.data(), doc, N, Tt, Cc, K);
  for_each_order([&] {
    Guarded<float> dx(x.size()), dw(dw0);
    Guarded<unsigned char> workspace(short_conv_backward_workspace_bytes(N, Cc, K));
    sim::short_conv_backward(kStream, dx.data(), dw.data(), g.data(), x.data(), w.data(), doc, N, Tt, Cc, K,
                             workspace.data());
    EXPECT_BITWISE_EQ(dx.values(), want_dx);
    EXPECT_BITWISE_EQ(dw.values(), want_dw);
    sim::short_conv_backward(kStream, dx.data(), dw.data(), g.data(), x.data(), w.data(), doc, N, Tt, Cc, K,
                             workspace.data());
    EXPECT_BITWISE_EQ(dx.values(), want_dx);
    EXPECT_BITWISE_EQ(dw.values(), want_dw2);
    EXPECT_TRUE(dx.guards_intact() && dw.guards_intact() && workspace.guards_intact());
  });
}

TEST(CudaSimLinearAttention, ShortConvBackwardMatchesCpuBitwise) {
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(testing::shape_name({c.N, c.T, c.Cc, c.K, int64_t(c.packed)}));
    const auto x = random_floats(size_t(c.N * c.Cc), 6 + c.N);
    check_short_conv_backward(x, x, c);
    const auto xb = to_bf16(x);
    check_short_conv_backward(xb, to_f32(xb), c);
  }
}

TEST(CudaSimLinearAttention, ShortConvBackwardMatchesFiniteDifferencesOfTheForwardKernel) {
  const int64_t N = 22, T = 11, Cc = 5, K = 4;
  const auto ids = packed_doc_ids(N, T, 7);
  const auto x = random_floats(size_t(N * Cc), 8), w = random_floats(size_t(Cc * K), 9, -1.0f, 1.0f);
  const auto g = random_floats(x.size(), 10), vx = random_floats(x.size(), 11), vw = random_floats(w.size(), 12);
  // L(x, w) = Σ g · conv(x; w), the forward on the kernel.
  auto loss = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
    std::vector<float> out(xs.size());
    sim::short_conv_forward(kStream, out.data(), xs.data(), ws.data(), ids.data(), N, T, Cc, K);
    return dot(out, g);
  };
  std::vector<float> dx(x.size()), dw(w.size(), 0.0f);
  std::vector<unsigned char> workspace(short_conv_backward_workspace_bytes(N, Cc, K));
  sim::short_conv_backward(kStream, dx.data(), dw.data(), g.data(), x.data(), w.data(), ids.data(), N, T, Cc, K,
                           workspace.data());
  // f32 forward, eps 1e-2: truncation O(eps²) and rounding ~1e-6/eps, both below 1e-3 relative here.
  const double fd_x = central_difference([&](const auto& xs) { return loss(xs, w); }, x, vx, 1e-2f);
  const double fd_w = central_difference([&](const auto& ws) { return loss(x, ws); }, w, vw, 1e-2f);
  EXPECT_NEAR(dot(dx, vx), fd_x, 2e-3 * std::abs(fd_x) + 1e-4);
  EXPECT_NEAR(dot(dw, vw), fd_w, 2e-3 * std::abs(fd_w) + 1e-4);
}

// The f64 chunk partials make most inputs' sums independent of where the chunks start, so random data cannot
// tell a wrong chunk rule. These inputs can: +B at the first element of chunk 0, −B (the same product negated)
// at the second element of chunk 1 and a small s after it. In the CPU op's chunks s vanishes into −B (ulp(B) in
// f64 is far above s) and B − B cancels across chunks; with any other boundary B − B cancels first and s stays.
constexpr float kHuge = 1e30f;

TEST(CudaSimLinearAttention, ShortConvDweightFollowsTheCpuChunks) {
  const int64_t N = 70, T = 70, Cc = 3, K = 1;  // chunks of 32 tokens: [0, 32), [32, 64), [64, 70)
  auto x = random_floats(size_t(N * Cc), 120), g = random_floats(x.size(), 121);
  const auto w = random_floats(size_t(Cc * K), 122, -1.0f, 1.0f);
  for (int64_t c = 0; c < Cc; ++c) {
    x[size_t(33 * Cc + c)] = x[size_t(c)];
    g[size_t(c)] = kHuge;
    g[size_t(33 * Cc + c)] = -kHuge;
  }
  std::vector<float> want_dx(x.size()), want_dw(w.size(), 0.0f);
  short_conv_backward(want_dx.data(), want_dw.data(), g.data(), x.data(), w.data(), nullptr, N, T, Cc, K);
  Guarded<float> dx(x.size()), dw(std::vector<float>(w.size(), 0.0f));
  Guarded<unsigned char> workspace(short_conv_backward_workspace_bytes(N, Cc, K));
  sim::short_conv_backward(kStream, dx.data(), dw.data(), g.data(), x.data(), w.data(), nullptr, N, T, Cc, K,
                           workspace.data());
  EXPECT_BITWISE_EQ(dx.values(), want_dx);
  EXPECT_BITWISE_EQ(dw.values(), want_dw);
}

// ---- L2 norm ----

struct L2Case {
  int64_t N, H, D, pad;  // the input's row stride is 2·H·D + pad
};
// D below, between and above the 16 lanes; N·H not a multiple of the 8 rows of a block; D and the strides
// multiples of 8 (the 16-byte packs, rmsnorm.cuh), at Qwen3.5's D = 128 too.
const L2Case kL2Cases[] = {{37, 3, 12, 7}, {5, 2, 16, 7}, {11, 1, 33, 7}, {70, 2, 10, 7}, {13, 3, 16, 8},
                           {9, 2, 128, 8}};

// Rows at a gated-delta-like layout: in is the conv output [N, ld_in] (q | k | v with ld_in > 2·H·D), out the
// [N, 2·H·D] q̂ | k̂ buffer, so both are strided and the gaps must stay untouched.
TEST(CudaSimLinearAttention, L2NormForwardMatchesCpu) {
  for (const auto [N, H, D, pad] : kL2Cases) {
    SCOPED_TRACE(testing::shape_name({N, H, D, pad}));
    const int64_t ld_in = 2 * H * D + pad, ld_out = 2 * H * D;
    const auto x = random_floats(size_t(N * ld_in), 20 + D);
    const auto xb = to_bf16(x);
    const auto init = sentinel_values<float>(size_t(N * ld_out));
    std::vector<float> want = init, want_rn(size_t(N * H)), want_b = init, want_rn_b(want_rn.size());
    l2norm_forward(want.data() + H * D, want_rn.data(), x.data() + H * D, N, H, D, ld_out, ld_in, 1e-6f);
    l2norm_forward(want_b.data() + H * D, want_rn_b.data(), to_f32(xb).data() + H * D, N, H, D, ld_out, ld_in,
                   1e-6f);
    // The bf16 output: each written element the CPU's value rounded once; the gaps keep the sentinel.
    auto want_bf16 = sentinel_values<bf16_t>(size_t(N * ld_out));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * D; ++i) {
        const size_t e = size_t(n * ld_out + H * D + i);
        want_bf16[e] = f32_to_bf16(want_b[e]);
      }
    for_each_order([&] {
      Guarded<float> out(init.size()), rn(want_rn.size()), rn_b(want_rn.size());
      Guarded<bf16_t> out_b(init.size());
      sim::l2norm_forward(kStream, out.data() + H * D, rn.data(), x.data() + H * D, N, H, D, ld_out, ld_in, 1e-6f);
      sim::l2norm_forward(kStream, out_b.data() + H * D, rn_b.data(), xb.data() + H * D, N, H, D, ld_out, ld_in,
                          1e-6f);
      EXPECT_BITWISE_EQ(out.values(), want);
      EXPECT_BITWISE_EQ(rn.values(), want_rn);
      EXPECT_BITWISE_EQ(out_b.values(), want_bf16);
      EXPECT_BITWISE_EQ(rn_b.values(), want_rn_b);
      EXPECT_TRUE(out.guards_intact() && rn.guards_intact() && out_b.guards_intact() && rn_b.guards_intact());
    });
  }
}

template <class T>
void check_l2norm_backward(const std::vector<T>& x, const std::vector<float>& x_f32, const L2Case& c) {
  const auto [N, H, D, pad] = c;
  const int64_t ld_in = 2 * H * D + pad, ld_dout = 2 * H * D, ld_din = ld_in;
  std::vector<float> y(size_t(N * ld_dout)), rn(size_t(N * H));
  l2norm_forward(y.data(), rn.data(), x_f32.data(), N, H, D, ld_dout, ld_in, 1e-6f);
  const auto g = random_floats(size_t(N * ld_dout), 30 + N);
  const auto init = sentinel_values<float>(size_t(N * ld_din));
  std::vector<float> want = init;
  l2norm_backward(want.data(), g.data(), x_f32.data(), rn.data(), N, H, D, ld_din, ld_dout, ld_in);
  // din may be dout (same ld): the dot is taken before the row is written.
  std::vector<float> want_alias = g;
  l2norm_backward(want_alias.data(), want_alias.data(), x_f32.data(), rn.data(), N, H, D, ld_dout, ld_dout, ld_in);
  for_each_order([&] {
    Guarded<float> din(init.size()), alias(g);
    sim::l2norm_backward(kStream, din.data(), g.data(), x.data(), rn.data(), N, H, D, ld_din, ld_dout, ld_in);
    sim::l2norm_backward(kStream, alias.data(), alias.data(), x.data(), rn.data(), N, H, D, ld_dout, ld_dout, ld_in);
    EXPECT_BITWISE_EQ(din.values(), want);
    EXPECT_BITWISE_EQ(alias.values(), want_alias);
    EXPECT_TRUE(din.guards_intact() && alias.guards_intact());
  });
}

TEST(CudaSimLinearAttention, L2NormBackwardMatchesCpuBitwise) {
  for (const L2Case& c : kL2Cases) {
    SCOPED_TRACE(testing::shape_name({c.N, c.H, c.D, c.pad}));
    const auto x = random_floats(size_t(c.N * (2 * c.H * c.D + c.pad)), 40 + c.D);
    check_l2norm_backward(x, x, c);
    const auto xb = to_bf16(x);
    check_l2norm_backward(xb, to_f32(xb), c);
  }
}

// ---- β and log-decay gates ----

struct GatesCase {
  int64_t N, Hv;
};
// N = 600 gives 3 chunks of 256 tokens for the parameter gradients.
const GatesCase kGatesCases[] = {{37, 3}, {600, 5}, {1, 1}};

struct GatesInputs {
  std::vector<float> b, a, A_log, dt_bias;
};
GatesInputs gates_inputs(int64_t N, int64_t Hv, uint64_t seed) {
  // a spans softplus's threshold of 20 on both sides; A_log, dt_bias as trained values can be.
  return {random_floats(size_t(N * Hv), seed, -8.0f, 8.0f), random_floats(size_t(N * Hv), seed + 1, -26.0f, 26.0f),
          random_floats(size_t(Hv), seed + 2, -1.5f, 1.5f), random_floats(size_t(Hv), seed + 3, -1.0f, 1.0f)};
}

// expf / log1pf under cuda-sim are the host's, the CPU op's functions, so the gates match bit for bit here (on a
// GPU they are within 2 ulp: kernels_api.inc).
TEST(CudaSimLinearAttention, DeltaGatesForwardMatchesCpuBitwise) {
  for (const auto [N, Hv] : kGatesCases) {
    SCOPED_TRACE(testing::shape_name({N, Hv}));
    const GatesInputs in = gates_inputs(N, Hv, uint64_t(50 + N));
    std::vector<float> want_beta(in.b.size()), want_g(in.b.size());
    delta_gates_forward(want_beta.data(), want_g.data(), in.b.data(), in.a.data(), in.A_log.data(),
                        in.dt_bias.data(), N, Hv);
    for_each_order([&] {
      Guarded<float> beta(in.b.size()), g(in.b.size());
      sim::delta_gates_forward(kStream, beta.data(), g.data(), in.b.data(), in.a.data(), in.A_log.data(),
                               in.dt_bias.data(), N, Hv);
      EXPECT_BITWISE_EQ(beta.values(), want_beta);
      EXPECT_BITWISE_EQ(g.values(), want_g);
      EXPECT_TRUE(beta.guards_intact() && g.guards_intact());
    });
  }
}

TEST(CudaSimLinearAttention, DeltaGatesBackwardMatchesCpuBitwise) {
  for (const auto [N, Hv] : kGatesCases) {
    SCOPED_TRACE(testing::shape_name({N, Hv}));
    const GatesInputs in = gates_inputs(N, Hv, uint64_t(60 + N));
    const auto dbeta = random_floats(in.b.size(), 70), dg = random_floats(in.b.size(), 71);
    const auto dA0 = random_floats(size_t(Hv), 72), ddt0 = random_floats(size_t(Hv), 73);  // accumulated onto
    std::vector<float> want_db(in.b.size()), want_da(in.b.size()), want_dA = dA0, want_ddt = ddt0;
    delta_gates_backward(want_db.data(), want_da.data(), want_dA.data(), want_ddt.data(), dbeta.data(), dg.data(),
                         in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv);
    std::vector<float> want_dA2 = want_dA, want_ddt2 = want_ddt;  // a second call adds again
    delta_gates_backward(want_db.data(), want_da.data(), want_dA2.data(), want_ddt2.data(), dbeta.data(), dg.data(),
                         in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv);
    for_each_order([&] {
      Guarded<float> db(in.b.size()), da(in.b.size()), dA(dA0), ddt(ddt0);
      Guarded<unsigned char> workspace(delta_gates_backward_workspace_bytes(N, Hv));
      sim::delta_gates_backward(kStream, db.data(), da.data(), dA.data(), ddt.data(), dbeta.data(), dg.data(),
                                in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv,
                                workspace.data());
      EXPECT_BITWISE_EQ(db.values(), want_db);
      EXPECT_BITWISE_EQ(da.values(), want_da);
      EXPECT_BITWISE_EQ(dA.values(), want_dA);
      EXPECT_BITWISE_EQ(ddt.values(), want_ddt);
      // In place (db = dbeta, da = dg), as the header allows: the same bits, the sums taken before dg is gone.
      Guarded<float> db_in(dbeta), da_in(dg);
      sim::delta_gates_backward(kStream, db_in.data(), da_in.data(), dA.data(), ddt.data(), db_in.data(),
                                da_in.data(), in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv,
                                workspace.data());
      EXPECT_BITWISE_EQ(db_in.values(), want_db);
      EXPECT_BITWISE_EQ(da_in.values(), want_da);
      EXPECT_BITWISE_EQ(dA.values(), want_dA2);
      EXPECT_BITWISE_EQ(ddt.values(), want_ddt2);
      EXPECT_TRUE(db.guards_intact() && da.guards_intact() && dA.guards_intact() && ddt.guards_intact() &&
                  db_in.guards_intact() && da_in.guards_intact() && workspace.guards_intact());
    });
  }
}

TEST(CudaSimLinearAttention, DeltaGatesBackwardMatchesFiniteDifferencesOfTheForwardKernel) {
  const int64_t N = 13, Hv = 3;
  GatesInputs in = gates_inputs(N, Hv, 80);
  for (auto& v : in.a) v *= 0.2f;  // away from softplus's kink at 20, where a difference quotient straddles it
  const auto dbeta = random_floats(in.b.size(), 81), dg = random_floats(in.b.size(), 82);
  const auto vb = random_floats(in.b.size(), 83), va = random_floats(in.b.size(), 84);
  const auto vA = random_floats(size_t(Hv), 85), vdt = random_floats(size_t(Hv), 86);
  // L = Σ dbeta · β + Σ dg · g, the forward on the kernel.
  auto loss = [&](const std::vector<float>& b, const std::vector<float>& a, const std::vector<float>& A_log,
                  const std::vector<float>& dt_bias) {
    std::vector<float> beta(b.size()), g(b.size());
    sim::delta_gates_forward(kStream, beta.data(), g.data(), b.data(), a.data(), A_log.data(), dt_bias.data(), N, Hv);
    return dot(beta, dbeta) + dot(g, dg);
  };
  std::vector<float> db(in.b.size()), da(in.b.size()), dA(size_t(Hv), 0.0f), ddt(size_t(Hv), 0.0f);
  std::vector<unsigned char> workspace(delta_gates_backward_workspace_bytes(N, Hv));
  sim::delta_gates_backward(kStream, db.data(), da.data(), dA.data(), ddt.data(), dbeta.data(), dg.data(),
                            in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv, workspace.data());
  // f32 forward, eps 1e-2: truncation O(eps²) and rounding ~1e-6/eps, both below 1e-3 relative here.
  const double fd_b = central_difference([&](const auto& b) { return loss(b, in.a, in.A_log, in.dt_bias); }, in.b,
                                         vb, 1e-2f);
  const double fd_a = central_difference([&](const auto& a) { return loss(in.b, a, in.A_log, in.dt_bias); }, in.a,
                                         va, 1e-2f);
  const double fd_A = central_difference([&](const auto& A) { return loss(in.b, in.a, A, in.dt_bias); }, in.A_log,
                                         vA, 1e-2f);
  const double fd_dt = central_difference([&](const auto& dt) { return loss(in.b, in.a, in.A_log, dt); },
                                          in.dt_bias, vdt, 1e-2f);
  EXPECT_NEAR(dot(db, vb), fd_b, 2e-3 * std::abs(fd_b) + 1e-4);
  EXPECT_NEAR(dot(da, va), fd_a, 2e-3 * std::abs(fd_a) + 1e-4);
  EXPECT_NEAR(dot(dA, vA), fd_A, 2e-3 * std::abs(fd_A) + 1e-4);
  EXPECT_NEAR(dot(ddt, vdt), fd_dt, 2e-3 * std::abs(fd_dt) + 1e-4);
}

TEST(CudaSimLinearAttention, DeltaGatesParameterGradientsFollowTheCpuChunks) {
  const int64_t N = 600, Hv = 2;  // chunks of 256 tokens: [0, 256), [256, 512), [512, 600)
  GatesInputs in = gates_inputs(N, Hv, 123);
  auto dg = random_floats(in.b.size(), 124);
  const auto dbeta = random_floats(in.b.size(), 125);
  for (int64_t h = 0; h < Hv; ++h) {
    in.a[size_t(257 * Hv + h)] = in.a[size_t(h)];
    dg[size_t(h)] = kHuge;
    dg[size_t(257 * Hv + h)] = -kHuge;
  }
  std::vector<float> want_db(in.b.size()), want_da(in.b.size()), want_dA(size_t(Hv), 0.0f), want_ddt = want_dA;
  delta_gates_backward(want_db.data(), want_da.data(), want_dA.data(), want_ddt.data(), dbeta.data(), dg.data(),
                       in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv);
  Guarded<float> db(in.b.size()), da(in.b.size()), dA(want_dA.size()), ddt(want_dA.size());
  std::memset(dA.data(), 0, dA.size() * sizeof(float));
  std::memset(ddt.data(), 0, ddt.size() * sizeof(float));
  Guarded<unsigned char> workspace(delta_gates_backward_workspace_bytes(N, Hv));
  sim::delta_gates_backward(kStream, db.data(), da.data(), dA.data(), ddt.data(), dbeta.data(), dg.data(),
                            in.b.data(), in.a.data(), in.A_log.data(), in.dt_bias.data(), N, Hv, workspace.data());
  EXPECT_BITWISE_EQ(da.values(), want_da);
  EXPECT_BITWISE_EQ(dA.values(), want_dA);
  EXPECT_BITWISE_EQ(ddt.values(), want_ddt);
}

// ---- gated RMSNorm ----

struct GatedNormCase {
  int64_t rows, dv;
};
// rows = N·Hv; 111 and 70 rows give 4 and 3 dweight chunks of 32 rows; dv 16 and Qwen3.5's 128 take the 16-byte
// packs (rmsnorm.cuh).
const GatedNormCase kGatedNormCases[] = {{111, 10}, {70, 33}, {7, 16}, {1, 5}, {13, 128}};

TEST(CudaSimLinearAttention, GatedRmsnormForwardMatchesCpu) {
  for (const auto [rows, dv] : kGatedNormCases) {
    SCOPED_TRACE(testing::shape_name({rows, dv}));
    const auto x = random_floats(size_t(rows * dv), 90 + rows), z = random_floats(x.size(), 91 + dv, -6.0f, 6.0f);
    const auto w = random_floats(size_t(dv), 92, 0.5f, 1.5f);
    std::vector<float> want(x.size()), want_rstd(static_cast<size_t>(rows));
    gated_rmsnorm_forward(want.data(), want_rstd.data(), x.data(), z.data(), w.data(), rows, dv, 1e-6f);
    const auto xb = to_bf16(x), zb = to_bf16(z);
    std::vector<float> want_b(x.size()), want_rstd_b(static_cast<size_t>(rows));
    gated_rmsnorm_forward(want_b.data(), want_rstd_b.data(), to_f32(xb).data(), to_f32(zb).data(), w.data(), rows,
                          dv, 1e-6f);
    for_each_order([&] {
      Guarded<float> out(x.size()), rstd(static_cast<size_t>(rows)), rstd_b(static_cast<size_t>(rows));
      Guarded<bf16_t> out_b(x.size());
      sim::gated_rmsnorm_forward(kStream, out.data(), rstd.data(), x.data(), z.data(), w.data(), rows, dv, 1e-6f);
      sim::gated_rmsnorm_forward(kStream, out_b.data(), rstd_b.data(), xb.data(), zb.data(), w.data(), rows, dv,
                                 1e-6f);
      EXPECT_BITWISE_EQ(out.values(), want);
      EXPECT_BITWISE_EQ(rstd.values(), want_rstd);
      EXPECT_BITWISE_EQ(out_b.values(), to_bf16(want_b));
      EXPECT_BITWISE_EQ(rstd_b.values(), want_rstd_b);
      EXPECT_TRUE(out.guards_intact() && rstd.guards_intact() && out_b.guards_intact() && rstd_b.guards_intact());
    });
  }
}

template <class T>
void check_gated_rmsnorm_backward(const std::vector<T>& x, const std::vector<float>& x_f32, const std::vector<T>& z,
                                  const std::vector<float>& z_f32, int64_t rows, int64_t dv) {
  const auto w = random_floats(size_t(dv), 93, 0.5f, 1.5f), g = random_floats(x.size(), 94 + rows);
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows));
  gated_rmsnorm_forward(y.data(), rstd.data(), x_f32.data(), z_f32.data(), w.data(), rows, dv, 1e-6f);
  const auto dw0 = random_floats(size_t(dv), 95);  // accumulated onto
  std::vector<float> want_dx(x.size()), want_dz(x.size()), want_dw = dw0;
  gated_rmsnorm_backward(want_dx.data(), want_dz.data(), want_dw.data(), g.data(), x_f32.data(), z_f32.data(),
                         w.data(), rstd.data(), rows, dv);
  std::vector<float> want_dw2 = want_dw;  // a second call adds again
  gated_rmsnorm_backward(want_dx.data(), want_dz.data(), want_dw2.data(), g.data(), x_f32.data(), z_f32.data(),
                         w.data(), rstd.data(), rows, dv);
  for_each_order([&] {
    Guarded<float> dx(x.size()), dz(x.size()), dw(dw0);
    Guarded<unsigned char> workspace(rmsnorm_backward_workspace_bytes(rows, dv));
    sim::gated_rmsnorm_backward(kStream, dx.data(), dz.data(), dw.data(), g.data(), x.data(), z.data(), w.data(),
                                rstd.data(), rows, dv, workspace.data());
    EXPECT_BITWISE_EQ(dx.values(), want_dx);
    EXPECT_BITWISE_EQ(dz.values(), want_dz);
    EXPECT_BITWISE_EQ(dw.values(), want_dw);
    sim::gated_rmsnorm_backward(kStream, dx.data(), dz.data(), dw.data(), g.data(), x.data(), z.data(), w.data(),
                                rstd.data(), rows, dv, workspace.data());
    EXPECT_BITWISE_EQ(dw.values(), want_dw2);
    EXPECT_TRUE(dx.guards_intact() && dz.guards_intact() && dw.guards_intact() && workspace.guards_intact());
  });
}

TEST(CudaSimLinearAttention, GatedRmsnormBackwardMatchesCpuBitwise) {
  for (const auto [rows, dv] : kGatedNormCases) {
    SCOPED_TRACE(testing::shape_name({rows, dv}));
    const auto x = random_floats(size_t(rows * dv), 96 + rows), z = random_floats(x.size(), 97 + dv, -6.0f, 6.0f);
    check_gated_rmsnorm_backward(x, x, z, z, rows, dv);
    const auto xb = to_bf16(x), zb = to_bf16(z);
    check_gated_rmsnorm_backward(xb, to_f32(xb), zb, to_f32(zb), rows, dv);
  }
}

TEST(CudaSimLinearAttention, GatedRmsnormDweightFollowsTheCpuChunks) {
  const int64_t rows = 70, dv = 5;  // chunks of 32 rows: [0, 32), [32, 64), [64, 70)
  auto x = random_floats(size_t(rows * dv), 126), g = random_floats(x.size(), 127);
  auto z = random_floats(x.size(), 128, -6.0f, 6.0f);
  const auto w = random_floats(static_cast<size_t>(dv), 129, 0.5f, 1.5f);
  for (int64_t d = 0; d < dv; ++d) {
    x[size_t(33 * dv + d)] = x[size_t(d)];
    z[size_t(33 * dv + d)] = z[size_t(d)];
    g[size_t(d)] *= kHuge;
    g[size_t(33 * dv + d)] = -g[size_t(d)];
  }
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows));
  gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, dv, 1e-6f);
  std::vector<float> want_dx(x.size()), want_dz(x.size()), want_dw(static_cast<size_t>(dv), 0.0f);
  gated_rmsnorm_backward(want_dx.data(), want_dz.data(), want_dw.data(), g.data(), x.data(), z.data(), w.data(),
                         rstd.data(), rows, dv);
  Guarded<float> dx(x.size()), dz(x.size()), dw(std::vector<float>(static_cast<size_t>(dv), 0.0f));
  Guarded<unsigned char> workspace(rmsnorm_backward_workspace_bytes(rows, dv));
  sim::gated_rmsnorm_backward(kStream, dx.data(), dz.data(), dw.data(), g.data(), x.data(), z.data(), w.data(),
                              rstd.data(), rows, dv, workspace.data());
  EXPECT_BITWISE_EQ(dx.values(), want_dx);
  EXPECT_BITWISE_EQ(dw.values(), want_dw);
}

// ---- the output σ gate, gather / scatter of the query halves ----

struct GateCase {
  int64_t N, H, D;
};
// D 16 and 256 (Qwen3.5 / 3.6's gated attention) take eight elements a thread (16-byte loads).
const GateCase kGateCases[] = {{37, 3, 10}, {5, 2, 12}, {70, 1, 7}, {13, 3, 16}, {3, 2, 256}};

// q_raw [N, H, 2D] as q_proj writes it: [query D | gate D] per head; the gate is q_raw + D.
TEST(CudaSimLinearAttention, SigmoidGateForwardMatchesCpu) {
  for (const auto [N, H, D] : kGateCases) {
    SCOPED_TRACE(testing::shape_name({N, H, D}));
    const int64_t ld_token = H * 2 * D, ld_head = 2 * D;
    const auto x = random_floats(size_t(N * H * D), 100 + N), q_raw = random_floats(size_t(N * ld_token), 101, -9, 9);
    std::vector<float> want(x.size());
    sigmoid_gate_forward(want.data(), x.data(), q_raw.data() + D, N, H, D, ld_token, ld_head);
    const auto xb = to_bf16(x), qb = to_bf16(q_raw);
    std::vector<float> want_b(x.size());
    sigmoid_gate_forward(want_b.data(), to_f32(xb).data(), to_f32(qb).data() + D, N, H, D, ld_token, ld_head);
    for_each_order([&] {
      Guarded<float> out(x.size());
      Guarded<bf16_t> out_b(x.size());
      sim::sigmoid_gate_forward(kStream, out.data(), x.data(), q_raw.data() + D, N, H, D, ld_token, ld_head);
      sim::sigmoid_gate_forward(kStream, out_b.data(), xb.data(), qb.data() + D, N, H, D, ld_token, ld_head);
      EXPECT_BITWISE_EQ(out.values(), want);
      EXPECT_BITWISE_EQ(out_b.values(), to_bf16(want_b));
      EXPECT_TRUE(out.guards_intact() && out_b.guards_intact());
    });
  }
}

template <class T>
void check_sigmoid_gate_backward(const std::vector<T>& x, const std::vector<float>& x_f32, const std::vector<T>& q,
                                 const std::vector<float>& q_f32, const GateCase& c) {
  const auto [N, H, D] = c;
  const int64_t ld_token = H * 2 * D, ld_head = 2 * D;
  const auto g = random_floats(x.size(), 102 + N);
  // dgate fills the gate halves of dq_raw [N, H, 2D]; the query halves keep what they held.
  const auto init = sentinel_values<float>(q.size());
  std::vector<float> want_dx(x.size()), want_dq = init;
  sigmoid_gate_backward(want_dx.data(), want_dq.data() + D, g.data(), x_f32.data(), q_f32.data() + D, N, H, D,
                        ld_token, ld_head);
  for_each_order([&] {
    Guarded<float> dx(x.size()), dq(q.size()), dx_in_place(g);
    sim::sigmoid_gate_backward(kStream, dx.data(), dq.data() + D, g.data(), x.data(), q.data() + D, N, H, D,
                               ld_token, ld_head);
    EXPECT_BITWISE_EQ(dx.values(), want_dx);
    EXPECT_BITWISE_EQ(dq.values(), want_dq);
    // dx may be dout.
    sim::sigmoid_gate_backward(kStream, dx_in_place.data(), dq.data() + D, dx_in_place.data(), x.data(),
                               q.data() + D, N, H, D, ld_token, ld_head);
    EXPECT_BITWISE_EQ(dx_in_place.values(), want_dx);
    EXPECT_TRUE(dx.guards_intact() && dq.guards_intact() && dx_in_place.guards_intact());
  });
}

TEST(CudaSimLinearAttention, SigmoidGateBackwardMatchesCpuBitwise) {
  for (const GateCase& c : kGateCases) {
    SCOPED_TRACE(testing::shape_name({c.N, c.H, c.D}));
    const auto x = random_floats(size_t(c.N * c.H * c.D), 103), q = random_floats(2 * x.size(), 104, -9, 9);
    check_sigmoid_gate_backward(x, x, q, q, c);
    const auto xb = to_bf16(x), qb = to_bf16(q);
    check_sigmoid_gate_backward(xb, to_f32(xb), qb, to_f32(qb), c);
  }
}

// model/block.cpp's gather_queries / scatter_queries: row r's query half is q_proj[r·2D .. r·2D + D).
TEST(CudaSimLinearAttention, GatherAndScatterQueriesCopyTheQueryHalves) {
  for (const auto [N, H, D] : kGateCases) {
    SCOPED_TRACE(testing::shape_name({N, H, D}));
    const int64_t rows = N * H;
    const auto q_proj = random_floats(size_t(rows * 2 * D), 105), q = random_floats(size_t(rows * D), 106);
    const auto qb_proj = to_bf16(q_proj);
    std::vector<float> want_q(q.size()), want_proj = sentinel_values<float>(q_proj.size());
    std::vector<bf16_t> want_qb(q.size());
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(want_q.data() + r * D, q_proj.data() + r * 2 * D, size_t(D) * sizeof(float));
      std::memcpy(want_qb.data() + r * D, qb_proj.data() + r * 2 * D, size_t(D) * sizeof(bf16_t));
      std::memcpy(want_proj.data() + r * 2 * D, q.data() + r * D, size_t(D) * sizeof(float));
    }
    for_each_order([&] {
      Guarded<float> gq(q.size()), proj(q_proj.size());
      Guarded<bf16_t> gqb(q.size());
      sim::gather_queries(kStream, gq.data(), q_proj.data(), rows, D);
      sim::gather_queries(kStream, gqb.data(), qb_proj.data(), rows, D);
      sim::scatter_queries(kStream, proj.data(), q.data(), rows, D);
      EXPECT_BITWISE_EQ(gq.values(), want_q);
      EXPECT_BITWISE_EQ(gqb.values(), want_qb);
      EXPECT_BITWISE_EQ(proj.values(), want_proj);
      EXPECT_TRUE(gq.guards_intact() && gqb.guards_intact() && proj.guards_intact());
    });
  }
}

// model/block.cpp's NormWeights: 1 + w in f32.
TEST(CudaSimLinearAttention, NormWeightOnePlusIsTheCpuBlocksShift) {
  const auto w = random_floats(53, 107, -0.3f, 0.3f);
  std::vector<float> want(w.size());
  for (size_t i = 0; i < w.size(); ++i) want[i] = 1.0f + w[i];
  for_each_order([&] {
    Guarded<float> out(w.size());
    sim::norm_weight_one_plus(kStream, out.data(), w.data(), int64_t(w.size()));
    EXPECT_BITWISE_EQ(out.values(), want);
    EXPECT_TRUE(out.guards_intact());
  });
}

// ---- partial RoPE ----

struct RopeCase {
  int64_t N, H, D, R;
};
// R = D/4 (Qwen3.5's partial_rotary_factor 0.25), another R < D, and R = D (the full rope's bits); R/2 = 8 and
// Qwen3.5's own head (D 256, R 64) take the packed kernel (rope.cuh).
const RopeCase kRopeCases[] = {{37, 3, 12, 4}, {9, 2, 10, 6}, {5, 4, 16, 16}, {70, 1, 8, 2}, {6, 3, 256, 64}};
constexpr int64_t kPositions = 50;

std::vector<int32_t> packed_positions(int64_t N, uint64_t seed) {  // not monotonic: packed documents
  Rng rng(seed);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (auto& p : pos) p = int32_t(rng.below(kPositions));
  return pos;
}

TEST(CudaSimLinearAttention, PartialRopeMatchesCpuBitwise) {
  for (const auto [N, H, D, R] : kRopeCases) {
    SCOPED_TRACE(testing::shape_name({N, H, D, R}));
    std::vector<float> cos(size_t(kPositions * R / 2)), sin(cos.size());
    rope_table(cos.data(), sin.data(), kPositions, R, 1e7);
    const auto pos = packed_positions(N, uint64_t(N + R));
    const auto x = random_floats(size_t(N * H * D), 110 + D);
    std::vector<float> want_fwd = x, want_bwd = x;
    rope_partial_forward(want_fwd.data(), pos.data(), N, H, D, R, 1e7);
    rope_partial_backward(want_bwd.data(), pos.data(), N, H, D, R, 1e7);
    const auto xb = to_bf16(x);
    std::vector<float> want_fwd_b = to_f32(xb);
    rope_partial_forward(want_fwd_b.data(), pos.data(), N, H, D, R, 1e7);
    for_each_order([&] {
      Guarded<float> fwd(x), bwd(x);
      Guarded<bf16_t> fwd_b(xb);
      sim::rope_partial_forward(kStream, fwd.data(), pos.data(), cos.data(), sin.data(), N, H, D, R);
      sim::rope_partial_backward(kStream, bwd.data(), pos.data(), cos.data(), sin.data(), N, H, D, R);
      sim::rope_partial_forward(kStream, fwd_b.data(), pos.data(), cos.data(), sin.data(), N, H, D, R);
      EXPECT_BITWISE_EQ(fwd.values(), want_fwd);
      EXPECT_BITWISE_EQ(bwd.values(), want_bwd);
      EXPECT_BITWISE_EQ(fwd_b.values(), to_bf16(want_fwd_b));  // dims R..D-1: x's bf16 bits untouched
      EXPECT_TRUE(fwd.guards_intact() && bwd.guards_intact() && fwd_b.guards_intact());
    });
    if (R == D) {  // the full rope's launchers: the same bits
      std::vector<float> full = x;
      sim::rope_forward(kStream, full.data(), pos.data(), cos.data(), sin.data(), N, H, D);
      EXPECT_BITWISE_EQ(full, want_fwd);
    }
  }
}

}  // namespace
}  // namespace lt::cuda
