// The layer kernels (RMSNorm, RoPE, SwiGLU, residual add, accumulation, conversions, embedding) under
// cuda-sim against the CPU ops, where the op table (tests/ops/test_op_harness.cpp: f32, through the ops' own entry
// points, bit for bit in every thread order) does not reach: bf16 storage, equal to the CPU op on the widened inputs
// rounded once to bf16; the kernels' own workspaces; the backward kernels against central finite differences of the
// forward kernels — in every thread order, on odd shapes, with sentinel guards around every output.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <numeric>

#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/sim_orders.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

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


// ---- RMSNorm ----

struct NormShape {
  int64_t rows, C;
};
// Odd shapes: a partial block of rows, C below, between and above the 16 lanes, and enough rows for several
// dweight chunks (rmsnorm_dweight_chunk_rows: 32 rows per chunk up to 2048 rows); C % 8 == 0 for the packed
// kernels, past one 256-element stage by a pack and by four stages and a pack.
const NormShape kNormShapes[] = {{1, 1}, {7, 5}, {9, 33}, {37, 100}, {130, 17}, {13, 264}, {3, 1032}};

// RMSNorm's f32 forward on the kernel, bit for bit the CPU op's in every thread order: the op table
// (tests/ops/test_op_harness.cpp). Here: bf16 storage, the backward with its workspace, finite differences.

TEST(CudaSimKernels, RmsnormForwardBf16IsTheCpuOpRoundedOnce) {
  for (const auto& [rows, C] : kNormShapes) {
    SCOPED_TRACE(testing::shape_name({rows, C}));
    const auto x = to_bf16(random_floats(size_t(rows * C), 3 + rows));
    const auto w = random_floats(static_cast<size_t>(C), 4 + C, 0.5f, 1.5f);
    std::vector<float> want(x.size()), want_rstd(static_cast<size_t>(rows));
    rmsnorm_forward(want.data(), want_rstd.data(), to_f32(x).data(), w.data(), rows, C, 1e-5f);
    for_each_order([&] {
      Guarded<bf16_t> out(x.size());
      Guarded<float> rstd(static_cast<size_t>(rows));
      sim::rmsnorm_forward(kStream, out.data(), rstd.data(), x.data(), w.data(), rows, C, 1e-5f);
      EXPECT_BITWISE_EQ(out.values(), to_bf16(want));
      EXPECT_BITWISE_EQ(rstd.values(), want_rstd);
      EXPECT_TRUE(out.guards_intact() && rstd.guards_intact());
    });
  }
}

template <class T>
void check_rmsnorm_backward(const std::vector<T>& x, const std::vector<float>& x_f32, int64_t rows, int64_t C) {
  const auto w = random_floats(static_cast<size_t>(C), 6 + C, 0.5f, 1.5f), g = random_floats(x.size(), 7 + rows);
  std::vector<float> n(x.size()), rstd(static_cast<size_t>(rows));
  rmsnorm_forward(n.data(), rstd.data(), x_f32.data(), w.data(), rows, C, 1e-6f);
  std::vector<float> want_din(x.size()), want_dw = random_floats(static_cast<size_t>(C), 8);  // accumulated onto
  const std::vector<float> dw0 = want_dw;
  rmsnorm_backward(want_din.data(), want_dw.data(), g.data(), x_f32.data(), w.data(), rstd.data(), rows, C);
  for_each_order([&] {
    Guarded<float> din(x.size()), dw(dw0);
    Guarded<unsigned char> workspace(rmsnorm_backward_workspace_bytes(rows, C));
    sim::rmsnorm_backward(kStream, din.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), rows, C,
                          workspace.data());
    EXPECT_BITWISE_EQ(din.values(), want_din);
    EXPECT_BITWISE_EQ(dw.values(), want_dw);
    EXPECT_TRUE(din.guards_intact() && dw.guards_intact() && workspace.guards_intact());
  });
}

TEST(CudaSimKernels, RmsnormBackwardMatchesCpuBitwise) {
  for (const auto& [rows, C] : kNormShapes) {
    SCOPED_TRACE(testing::shape_name({rows, C}));
    const auto x = random_floats(size_t(rows * C), 5 + rows);
    check_rmsnorm_backward(x, x, rows, C);
    const auto xb = to_bf16(x);
    check_rmsnorm_backward(xb, to_f32(xb), rows, C);
  }
}

TEST(CudaSimKernels, RmsnormBackwardMatchesFiniteDifferencesOfTheForwardKernel) {
  const int64_t rows = 5, C = 19;
  const auto x = random_floats(size_t(rows * C), 21), w = random_floats(static_cast<size_t>(C), 22, 0.5f, 1.5f);
  const auto g = random_floats(x.size(), 23), vx = random_floats(x.size(), 24),
             vw = random_floats(static_cast<size_t>(C), 25);
  // L(x, w) = Σ g · rmsnorm(x; w), the forward on the kernel.
  auto loss = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
    std::vector<float> out(xs.size()), rstd(static_cast<size_t>(rows));
    sim::rmsnorm_forward(kStream, out.data(), rstd.data(), xs.data(), ws.data(), rows, C, 1e-6f);
    return dot(out, g);
  };
  std::vector<float> n(x.size()), rstd(static_cast<size_t>(rows)), din(x.size()), dw(static_cast<size_t>(C), 0.0f);
  sim::rmsnorm_forward(kStream, n.data(), rstd.data(), x.data(), w.data(), rows, C, 1e-6f);
  std::vector<unsigned char> workspace(rmsnorm_backward_workspace_bytes(rows, C));
  sim::rmsnorm_backward(kStream, din.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), rows, C,
                        workspace.data());
  // f32 forward, eps 1e-2: truncation O(eps²) and rounding ~1e-6/eps, both below 1e-3 relative here.
  const double fd_x = central_difference([&](const auto& xs) { return loss(xs, w); }, x, vx, 1e-2f);
  const double fd_w = central_difference([&](const auto& ws) { return loss(x, ws); }, w, vw, 1e-2f);
  EXPECT_NEAR(dot(din, vx), fd_x, 2e-3 * std::abs(fd_x) + 1e-4);
  EXPECT_NEAR(dot(dw, vw), fd_w, 2e-3 * std::abs(fd_w) + 1e-4);
}

// ---- RoPE ----

struct RopeCase {
  int64_t N, H, D;
};
const RopeCase kRopeCases[] = {{1, 1, 2}, {13, 3, 6}, {7, 5, 64}, {3, 2, 256}};
constexpr int64_t kPositions = 50;

std::vector<int32_t> packed_positions(int64_t N, uint64_t seed) {  // not monotonic: packed documents
  Rng rng(seed);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (auto& p : pos) p = int32_t(rng.below(kPositions));
  return pos;
}

// RoPE in f32, forward and backward, bit for bit the CPU op's: the op table (tests/ops/test_op_harness.cpp). Here the
// kernel on a bf16 row: the CPU op's result on the widened row, rounded once.
TEST(CudaSimKernels, RopeBf16IsTheCpuOpRoundedOnce) {
  for (const auto& [N, H, D] : kRopeCases) {
    SCOPED_TRACE(testing::shape_name({N, H, D}));
    std::vector<float> cos(size_t(kPositions * D / 2)), sin(cos.size());
    rope_table(cos.data(), sin.data(), kPositions, D, 1e6);
    const auto pos = packed_positions(N, uint64_t(N + D));
    const auto xb = to_bf16(random_floats(size_t(N * H * D), 31 + D));
    std::vector<float> want_fwd_bf16 = to_f32(xb);
    rope_forward(want_fwd_bf16.data(), pos.data(), N, H, D, 1e6);
    for_each_order([&] {
      Guarded<bf16_t> fwd_bf16(xb);
      sim::rope_forward(kStream, fwd_bf16.data(), pos.data(), cos.data(), sin.data(), N, H, D);
      EXPECT_BITWISE_EQ(fwd_bf16.values(), to_bf16(want_fwd_bf16));
      EXPECT_TRUE(fwd_bf16.guards_intact());
    });
  }
}

TEST(CudaSimKernels, RopeBackwardIsTheTransposeOfTheForward) {
  // <R x, y> = <x, Rᵀ y> for the rotation R: the backward's definition, checked on the kernels alone.
  const int64_t N = 9, H = 3, D = 10;
  std::vector<float> cos(size_t(kPositions * D / 2)), sin(cos.size());
  rope_table(cos.data(), sin.data(), kPositions, D, 1e4);
  const auto pos = packed_positions(N, 41);
  std::vector<float> x = random_floats(size_t(N * H * D), 42), y = random_floats(x.size(), 43);
  std::vector<float> rx = x, rty = y;
  sim::rope_forward(kStream, rx.data(), pos.data(), cos.data(), sin.data(), N, H, D);
  sim::rope_backward(kStream, rty.data(), pos.data(), cos.data(), sin.data(), N, H, D);
  EXPECT_NEAR(dot(rx, y), dot(x, rty), 1e-5 * double(x.size()));  // f32 rotations: ~1 ulp per element
}

// ---- SwiGLU ----

const int64_t kElementCounts[] = {1, 31, 257, 3001};

// SwiGLU in f32, forward and backward, bit for bit the CPU op's: the op table (tests/ops/test_op_harness.cpp). Here
// the kernels on bf16 gate and up: the CPU op on the widened inputs (the forward's output rounded once).
TEST(CudaSimKernels, SwigluBf16IsTheCpuOpOnTheWidenedInputs) {
  for (const int64_t n : kElementCounts) {
    SCOPED_TRACE("n=" + std::to_string(n));
    // Gates across the whole range the stable sigmoid handles differently (|g| > 87.3, large negative).
    auto gate = random_floats(static_cast<size_t>(n), 51 + n, -12.0f, 12.0f);
    if (n > 2) gate[1] = -100.0f, gate[2] = 95.0f;
    const auto up = random_floats(static_cast<size_t>(n), 52 + n), dout = random_floats(static_cast<size_t>(n), 53 + n);
    const auto gb = to_bf16(gate), ub = to_bf16(up);
    std::vector<float> want_b(static_cast<size_t>(n)), want_dg_b(static_cast<size_t>(n)),
        want_du_b(static_cast<size_t>(n));
    swiglu_forward(want_b.data(), to_f32(gb).data(), to_f32(ub).data(), n);
    swiglu_backward(want_dg_b.data(), want_du_b.data(), dout.data(), to_f32(gb).data(), to_f32(ub).data(), n);
    for_each_order([&] {
      Guarded<float> dg_b(static_cast<size_t>(n)), du_b(static_cast<size_t>(n));
      Guarded<bf16_t> out_b(static_cast<size_t>(n));
      sim::swiglu_forward(kStream, out_b.data(), gb.data(), ub.data(), n);
      sim::swiglu_backward(kStream, dg_b.data(), du_b.data(), dout.data(), gb.data(), ub.data(), n);
      EXPECT_BITWISE_EQ(out_b.values(), to_bf16(want_b));
      EXPECT_BITWISE_EQ(dg_b.values(), want_dg_b);
      EXPECT_BITWISE_EQ(du_b.values(), want_du_b);
      EXPECT_TRUE(out_b.guards_intact() && dg_b.guards_intact() && du_b.guards_intact());
    });
  }
}

TEST(CudaSimKernels, SwigluBackwardMatchesFiniteDifferencesOfTheForwardKernel) {
  const int64_t n = 301;
  const auto gate = random_floats(static_cast<size_t>(n), 61, -6.0f, 6.0f),
             up = random_floats(static_cast<size_t>(n), 62);
  const auto g = random_floats(static_cast<size_t>(n), 63), vg = random_floats(static_cast<size_t>(n), 64),
             vu = random_floats(static_cast<size_t>(n), 65);
  auto loss = [&](const std::vector<float>& ga, const std::vector<float>& u) {
    std::vector<float> out(static_cast<size_t>(n));
    sim::swiglu_forward(kStream, out.data(), ga.data(), u.data(), n);
    return dot(out, g);
  };
  std::vector<float> dgate(static_cast<size_t>(n)), dup(static_cast<size_t>(n));
  sim::swiglu_backward(kStream, dgate.data(), dup.data(), g.data(), gate.data(), up.data(), n);
  // f32 forward (silu within 4 ulp), eps 1e-2: truncation O(eps²) dominates, ~1e-4 relative.
  const double fd_g = central_difference([&](const auto& ga) { return loss(ga, up); }, gate, vg, 1e-2f);
  const double fd_u = central_difference([&](const auto& u) { return loss(gate, u); }, up, vu, 1e-2f);
  EXPECT_NEAR(dot(dgate, vg), fd_g, 2e-3 * std::abs(fd_g) + 1e-4);
  EXPECT_NEAR(dot(dup, vu), fd_u, 2e-3 * std::abs(fd_u) + 1e-4);
}

// ---- residual add, accumulation, conversions ----

TEST(CudaSimKernels, AddAccumulateZeroAndConvertAreExact) {
  for (const int64_t n : kElementCounts) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto a = random_floats(static_cast<size_t>(n), 71 + n), b = random_floats(static_cast<size_t>(n), 72 + n);
    if (n > 3) a[3] = 3.0e38f, b[3] = 3.0e38f;  // overflows to inf in f32 and in bf16 alike
    std::vector<float> sum(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] = a[static_cast<size_t>(i)] + b[static_cast<size_t>(i)];
    std::vector<float> bf16_sum(static_cast<size_t>(n));
    const auto ab = to_bf16(a), bb = to_bf16(b);
    for (int64_t i = 0; i < n; ++i)
      bf16_sum[static_cast<size_t>(i)] =
          bf16_to_f32(ab[static_cast<size_t>(i)]) + bf16_to_f32(bb[static_cast<size_t>(i)]);
    for_each_order([&] {
      Guarded<float> out(static_cast<size_t>(n)), acc(a), widened(static_cast<size_t>(n)), zeroed(b);
      Guarded<bf16_t> out_b(static_cast<size_t>(n)), rounded(static_cast<size_t>(n));
      sim::add(kStream, out.data(), a.data(), b.data(), n);
      sim::add(kStream, out_b.data(), ab.data(), bb.data(), n);
      sim::accumulate(kStream, acc.data(), b.data(), n);
      sim::convert(kStream, rounded.data(), a.data(), n);
      sim::convert(kStream, widened.data(), ab.data(), n);
      sim::zero(kStream, zeroed.data(), n);
      EXPECT_BITWISE_EQ(out.values(), sum);
      EXPECT_BITWISE_EQ(zeroed.values(), std::vector<float>(static_cast<size_t>(n), 0.0f));
      EXPECT_BITWISE_EQ(acc.values(), sum);
      EXPECT_BITWISE_EQ(out_b.values(), to_bf16(bf16_sum));
      EXPECT_BITWISE_EQ(rounded.values(), ab);
      EXPECT_BITWISE_EQ(widened.values(), to_f32(ab));
      EXPECT_TRUE(out.guards_intact() && acc.guards_intact() && widened.guards_intact() && out_b.guards_intact() &&
                  rounded.guards_intact() && zeroed.guards_intact());
    });
  }
}

// The kernels above take 16 bytes a load where every pointer is 16-byte aligned (the buffers above are) and one
// element at a time otherwise: an offset view (one element in, as a token chunk's may be) gives the same bits.
TEST(CudaSimKernels, ElementwiseKernelsGiveTheSameBitsOnUnalignedViews) {
  const int64_t n = 203;  // 25 packs of 8 and a tail of 3 when aligned
  const auto a0 = random_floats(static_cast<size_t>(n), 81, -9.0f, 9.0f), b0 = random_floats(size_t(n), 82);
  auto run = [&](int64_t at) {  // every input and output placed at element offset `at` of its buffer
    auto placed = [&](const std::vector<float>& v) {
      std::vector<float> out(size_t(n + 1), 0.5f);
      std::copy(v.begin(), v.end(), out.begin() + at);
      return out;
    };
    const auto a = placed(a0), b = placed(b0);
    const auto ab = to_bf16(a), bb = to_bf16(b);
    std::vector<float> sum(size_t(n + 1)), acc(b), dg(size_t(n + 1)), du(size_t(n + 1)), wide(size_t(n + 1));
    std::vector<bf16_t> sum_b(size_t(n + 1)), h(size_t(n + 1)), rounded(size_t(n + 1));
    sim::add(kStream, sum.data() + at, a.data() + at, b.data() + at, n);
    sim::add(kStream, sum_b.data() + at, ab.data() + at, bb.data() + at, n);
    sim::accumulate(kStream, acc.data() + at, a.data() + at, n);
    sim::swiglu_forward(kStream, h.data() + at, ab.data() + at, bb.data() + at, n);
    sim::swiglu_backward(kStream, dg.data() + at, du.data() + at, b.data() + at, ab.data() + at, bb.data() + at, n);
    sim::convert(kStream, rounded.data() + at, a.data() + at, n);
    sim::convert(kStream, wide.data() + at, ab.data() + at, n);
    auto view = [&](const auto& v) { return std::vector(v.begin() + at, v.begin() + at + n); };
    return std::vector<std::vector<float>>{view(sum), to_f32(view(sum_b)), view(acc), to_f32(view(h)),
                                           view(dg),  view(du),            to_f32(view(rounded)), view(wide)};
  };
  const auto aligned = run(0), offset = run(1);
  for (size_t i = 0; i < aligned.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    EXPECT_BITWISE_EQ(offset[i], aligned[i]);
  }
}

// RMSNorm and RoPE take 16-byte packs where C (or R/2 and D) % 8 == 0 and the pointers are 16-byte aligned, one
// element a lane otherwise: a view one element into its buffers gives the same bits as the aligned one.
TEST(CudaSimKernels, RmsnormAndRopeGiveTheSameBitsOnUnalignedViews) {
  const int64_t rows = 11, C = 264, N = 5, H = 3, D = 64;
  const auto x0 = random_floats(size_t(rows * C), 91), g0 = random_floats(size_t(rows * C), 92);
  const auto w0 = random_floats(size_t(C), 93, 0.5f, 1.5f), q0 = random_floats(size_t(N * H * D), 94);
  std::vector<float> cos(size_t(kPositions * D / 2)), sin(cos.size());
  rope_table(cos.data(), sin.data(), kPositions, D, 1e6);
  const auto pos = packed_positions(N, 95);
  auto run = [&](int64_t at) {  // x, g, w and q placed at element offset `at` of their buffers, outputs too
    auto placed = [&](const std::vector<float>& v) {
      std::vector<float> out(v.size() + 1, 0.5f);
      std::copy(v.begin(), v.end(), out.begin() + at);
      return out;
    };
    const auto x = placed(x0), g = placed(g0), w = placed(w0);
    const auto xb = to_bf16(x);
    std::vector<float> y(x.size()), din(x.size()), rstd(static_cast<size_t>(rows)), rstd_b(static_cast<size_t>(rows));
    std::vector<float> din_b(x.size());
    std::vector<float> dw(w.size(), 0.25f), dw_b(w.size(), 0.25f);
    std::vector<bf16_t> yb(x.size());
    std::vector<unsigned char> workspace(rmsnorm_backward_workspace_bytes(rows, C));
    sim::rmsnorm_forward(kStream, y.data() + at, rstd.data(), x.data() + at, w.data() + at, rows, C, 1e-6f);
    sim::rmsnorm_forward(kStream, yb.data() + at, rstd_b.data(), xb.data() + at, w.data() + at, rows, C, 1e-6f);
    sim::rmsnorm_backward(kStream, din.data() + at, dw.data() + at, g.data() + at, x.data() + at, w.data() + at,
                          rstd.data(), rows, C, workspace.data());
    sim::rmsnorm_backward(kStream, din_b.data() + at, dw_b.data() + at, g.data() + at, xb.data() + at,
                          w.data() + at, rstd_b.data(), rows, C, workspace.data());
    auto q = placed(q0);
    auto qb = to_bf16(q);
    sim::rope_forward(kStream, q.data() + at, pos.data(), cos.data(), sin.data(), N, H, D);
    sim::rope_forward(kStream, qb.data() + at, pos.data(), cos.data(), sin.data(), N, H, D);
    auto view = [&](const auto& v, size_t n) { return std::vector(v.begin() + at, v.begin() + at + int64_t(n)); };
    return std::vector<std::vector<float>>{view(y, x0.size()),   to_f32(view(yb, x0.size())), rstd,
                                           rstd_b,               view(din, x0.size()),        view(din_b, x0.size()),
                                           view(dw, w0.size()),  view(dw_b, w0.size()),       view(q, q0.size()),
                                           to_f32(view(qb, q0.size()))};
  };
  const auto aligned = run(0), offset = run(1);
  for (size_t i = 0; i < aligned.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    EXPECT_BITWISE_EQ(offset[i], aligned[i]);
  }
}

// ---- embedding ----

// The embedding in f32, forward and backward, bit for bit the CPU op's: the op table (tests/ops/test_op_harness.cpp).
// Here the forward into bf16 storage: the CPU op's rows rounded once.
TEST(CudaSimKernels, EmbeddingBf16IsTheCpuRowsRoundedOnce) {
  const int64_t V = 23;
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{1, 3}, {17, 37}, {64, 129}}) {
    SCOPED_TRACE(testing::shape_name({N, C}));
    Rng rng(uint64_t(N * C));
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (auto& id : ids) id = int32_t(rng.below(uint64_t(V / 2)));  // repeats, and ids seen once
    if (N > 1) ids[0] = int32_t(V - 1);
    const auto table = random_floats(size_t(V * C), 81 + N);
    std::vector<float> want(size_t(N * C));
    embedding_forward(want.data(), ids.data(), table.data(), N, C, V);
    for_each_order([&] {
      Guarded<bf16_t> out_b(size_t(N * C));
      sim::embedding_forward(kStream, out_b.data(), ids.data(), table.data(), N, C);
      EXPECT_BITWISE_EQ(out_b.values(), to_bf16(want));
      EXPECT_TRUE(out_b.guards_intact());
    });
  }
}

// The backward's device half (the streamed step's embedding rows): the CPU op's rows bit for bit in every thread
// order, packed (C a multiple of 8, aligned) and scalar (C 37, or the same rows one float off alignment).
TEST(CudaSimKernels, EmbeddingRowsAreTheCpuOpsBitwise) {
  const int64_t V = 29;
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{1, 8}, {45, 37}, {64, 264}}) {
    SCOPED_TRACE(testing::shape_name({N, C}));
    Rng rng(uint64_t(N * C) + 5);
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (auto& id : ids) id = int32_t(rng.below(uint64_t(V / 2)));  // repeats, and ids seen once
    if (N > 1) ids[0] = int32_t(V - 1);
    const TokenGroups g = group_tokens_by_id(ids.data(), N, V);
    const int64_t P = int64_t(g.present.size());
    std::vector<float> dout_buf = random_floats(size_t(N * C + 1), 85 + N);
    std::vector<float> want(size_t(P * C));
    for (const int shift : {0, 1}) {  // 1: dout and rows one float past 16-byte alignment
      const float* dout = dout_buf.data() + shift;
      embedding_grad_rows(want.data(), dout, g.start.data(), g.order.data(), P, C);
      for_each_order([&] {
        std::vector<float> rows(size_t(P * C + 1), NAN);
        sim::embedding_grad_rows(kStream, rows.data() + shift, dout, g.start.data(), g.order.data(), P, C);
        EXPECT_BITWISE_EQ(std::vector<float>(rows.begin() + shift, rows.begin() + shift + P * C), want);
      });
    }
  }
}

// ---- linear bias gradient ----

TEST(CudaSimKernels, BiasGradMatchesTheCpuLinearOpBitwise) {
  // Rows across a kTokenSlice boundary (two f32 adds into dbias), odd column counts.
  for (const auto& [M, N] : {std::pair<int64_t, int64_t>{1, 1}, {5, 130}, {kTokenSlice + 3, 7}}) {
    SCOPED_TRACE(testing::shape_name({M, N}));
    const int64_t K = 2;
    const auto x = random_floats(static_cast<size_t>(M * K), 91), w = random_floats(static_cast<size_t>(N * K), 92);
    const auto dout = random_floats(static_cast<size_t>(M * N), 93);
    std::vector<float> dx(static_cast<size_t>(M * K)), dw(static_cast<size_t>(N * K));
    std::vector<float> want = random_floats(static_cast<size_t>(N), 94);
    const std::vector<float> dbias0 = want;
    linear_backward(dx.data(), dw.data(), want.data(), dout.data(), x.data(), WeightRef{w.data(), DType::f32}, M, K, N);
    for_each_order([&] {
      Guarded<float> dbias(dbias0);
      sim::bias_grad(kStream, dbias.data(), dout.data(), M, N);
      EXPECT_BITWISE_EQ(dbias.values(), want);
      EXPECT_TRUE(dbias.guards_intact());
    });
  }
}

}  // namespace
}  // namespace lt::cuda
