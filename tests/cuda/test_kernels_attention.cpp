// The attention kernels under cuda-sim against the CPU op (ops/attention.h): forward (out, lse) and backward
// (dq, dk, dv) on odd sequence lengths (not multiples of the 32- or 16-row tiles), grouped heads, packed
// documents, head dims 64/128/256 and between (40, 96), f32 and bf16 storage; bitwise identical in every thread order
// (no atomics, fixed sums); sentinel guards around every output; the backward against finite differences of the forward
// kernel; an unsupported head dimension refused with the op named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/sim_orders.h"
#include "cuda_sim/cuda_sim.h"
#include "ops/attention.h"

namespace lt::cuda {
namespace {

using testing::for_each_order;
using testing::Guarded;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

constexpr Stream kStream = nullptr;

struct Case {
  AttentionShape s;
  bool packed;         // two documents per row (doc_ids), else plain causal
  bool sinks = false;  // GPT-OSS's per-head sinks (the forward applies them as it stores)
  int documents = 2;   // packed: documents a row (two: a third and two thirds; more: equal runs)
};
// The first eight span three tensor-core tiles of 64 with grouped heads (double-buffered loads, per-head dK/dV
// partials summed in order), one with documents. Then GPT-OSS's sliding windows (shape.window) and sinks: a
// window inside a tile and across tiles, on tensor cores (64, 128) and CUDA cores (40), with documents. The last
// two span the head dim 256 kernels' tiles (32-key forward tiles, 16-key dQ tiles, 32 × 32 dK/dV tiles, two query
// tiles of 64) with grouped heads and documents, then with a window and sinks. The last three pack three documents
// in 333 tokens, so blocks skip the tiles outside their documents: the forward and dQ blocks from row 128 start at
// key tile 1 (row 256: tile 3), the dK/dV block of keys 0–127 stops after queries 192–255.
const Case kCases[] = {{{2, 37, 4, 2, 64}, false},        {{1, 45, 3, 1, 128}, true},
                       {{1, 19, 2, 2, 256}, false},       {{1, 1, 2, 1, 64}, false},
                       {{2, 23, 6, 2, 40}, true},         {{1, 17, 2, 1, 96}, false},
                       {{1, 150, 4, 2, 64}, false},       {{1, 131, 3, 1, 128}, true},
                       {{2, 37, 4, 2, 64, 5}, false, true}, {{1, 150, 4, 2, 64, 70}, true, true},
                       {{1, 131, 3, 1, 128, 64}, false},  {{1, 45, 3, 1, 40, 9}, false, true},
                       {{1, 75, 4, 2, 256}, true},        {{2, 70, 2, 1, 256, 40}, false, true},
                       {{1, 333, 2, 1, 64}, true, false, 3}, {{1, 333, 4, 2, 128}, true, false, 3},
                       {{1, 333, 2, 1, 256}, true, false, 3}};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.s.B) + " T=" + std::to_string(c.s.T) + " Hq=" + std::to_string(c.s.Hq) +
         " Hkv=" + std::to_string(c.s.Hkv) + " D=" + std::to_string(c.s.D) + (c.packed ? " packed" : "") +
         (c.s.window ? " window=" + std::to_string(c.s.window) : "") + (c.sinks ? " sinks" : "");
}

// Sinks across the softmax's range (a sink can take most of a row), or none.
std::vector<float> sinks_for(const Case& c) {
  return c.sinks ? random_floats(static_cast<size_t>(c.s.Hq), 77, -1.0f, 3.0f) : std::vector<float>{};
}

std::vector<int32_t> doc_ids_for(const Case& c) {
  if (!c.packed) return {};
  std::vector<int32_t> ids(static_cast<size_t>(c.s.B * c.s.T));
  for (int64_t b = 0; b < c.s.B; ++b)
    for (int64_t t = 0; t < c.s.T; ++t)
      ids[static_cast<size_t>(b * c.s.T + t)] = c.documents == 2 ? (t < c.s.T / 3 ? 0 : 1) : int32_t(t * c.documents / c.s.T);
  return ids;
}

size_t q_size(const AttentionShape& s) { return static_cast<size_t>(s.B * s.T * s.Hq * s.D); }
size_t kv_size(const AttentionShape& s) { return static_cast<size_t>(s.B * s.T * s.Hkv * s.D); }
size_t lse_size(const AttentionShape& s) { return static_cast<size_t>(s.B * s.Hq * s.T); }

// |got - want| ≤ tol · (1 + max|want|): f32 sums in another order than the CPU op's and a GPU-style expf.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * scale) << what << " element " << i;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs inputs_for(const AttentionShape& s, uint64_t seed) {
  return {random_floats(q_size(s), seed), random_floats(kv_size(s), seed + 1), random_floats(kv_size(s), seed + 2),
          random_floats(q_size(s), seed + 3)};
}

TEST(CudaSimAttention, F32MatchesTheCpuOpAndIsTheSameInEveryThreadOrder) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const AttentionShape s = c.s;
    const Inputs in = inputs_for(s, uint64_t(s.T * s.D));
    const auto docs = doc_ids_for(c);
    const int32_t* doc_ids = docs.empty() ? nullptr : docs.data();
    const auto sinks = sinks_for(c);
    const float* sk = sinks.empty() ? nullptr : sinks.data();
    std::vector<float> want_out(q_size(s)), want_lse(lse_size(s));
    attention_forward(want_out.data(), want_lse.data(), in.q.data(), in.k.data(), in.v.data(), doc_ids, s);
    if (sk) attention_sinks_forward(want_out.data(), want_lse.data(), sk, s);
    std::vector<float> want_dq(q_size(s)), want_dk(kv_size(s)), want_dv(kv_size(s)), want_ds(size_t(s.Hq));
    attention_backward(want_dq.data(), want_dk.data(), want_dv.data(), in.dout.data(), want_out.data(), want_lse.data(),
                       in.q.data(), in.k.data(), in.v.data(), doc_ids, s);
    if (sk) attention_sinks_backward(want_ds.data(), in.dout.data(), want_out.data(), want_lse.data(), sk, s);
    std::vector<std::vector<float>> first;  // the forward order's results, which every order must repeat
    for_each_order([&] {
      Guarded<float> out(q_size(s)), lse(lse_size(s)), dq(q_size(s)), dk(kv_size(s)), dv(kv_size(s)), ds(size_t(s.Hq));
      Guarded<unsigned char> workspace(attention_backward_workspace_bytes(s));
      sim::attention_forward(kStream, out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), doc_ids, s, sk);
      sim::attention_backward(kStream, dq.data(), dk.data(), dv.data(), in.dout.data(), out.data(), lse.data(),
                              in.q.data(), in.k.data(), in.v.data(), doc_ids, s, workspace.data());
      if (sk) sim::attention_sinks_backward(kStream, ds.data(), in.dout.data(), out.data(), lse.data(), sk, s);
      expect_close(out.values(), want_out, 2e-6, "out");
      expect_close(lse.values(), want_lse, 2e-6, "lse");
      expect_close(dq.values(), want_dq, 2e-5, "dq");
      expect_close(dk.values(), want_dk, 2e-5, "dk");
      expect_close(dv.values(), want_dv, 2e-5, "dv");
      if (sk) expect_close(ds.values(), want_ds, 2e-5, "dsinks");
      EXPECT_TRUE(out.guards_intact() && lse.guards_intact() && dq.guards_intact() && dk.guards_intact() &&
                  dv.guards_intact() && workspace.guards_intact() && (!sk || ds.guards_intact()));
      const std::vector<std::vector<float>> now{out.values(), lse.values(), dq.values(), dk.values(), dv.values()};
      if (first.empty()) first = now;
      for (size_t i = 0; i < now.size(); ++i) EXPECT_BITWISE_EQ(now[i], first[i]);
    });
  }
}

TEST(CudaSimAttention, Bf16StorageIsTheCpuOpOnTheWidenedInputs) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const AttentionShape s = c.s;
    const Inputs in = inputs_for(s, uint64_t(s.T + s.D));
    const auto docs = doc_ids_for(c);
    const int32_t* doc_ids = docs.empty() ? nullptr : docs.data();
    const auto qb = to_bf16(in.q), kb = to_bf16(in.k), vb = to_bf16(in.v);
    const auto sinks = sinks_for(c);
    const float* sk = sinks.empty() ? nullptr : sinks.data();
    std::vector<float> want_out(q_size(s)), want_lse(lse_size(s));
    attention_forward(want_out.data(), want_lse.data(), to_f32(qb).data(), to_f32(kb).data(), to_f32(vb).data(),
                      doc_ids, s);
    if (sk) attention_sinks_forward(want_out.data(), want_lse.data(), sk, s);  // the output rounded once, after them
    Guarded<bf16_t> out(q_size(s));
    Guarded<float> lse(lse_size(s)), dq(q_size(s)), dk(kv_size(s)), dv(kv_size(s));
    sim::attention_forward(kStream, out.data(), lse.data(), qb.data(), kb.data(), vb.data(), doc_ids, s, sk);
    // One bf16 rounding of the output: within half a bf16 ulp (2^-9 relative) of the f32 result, plus the f32
    // difference that can move a value across a rounding boundary. The tensor-core kernels (D 64 and 128:
    // attention_mma.cuh) also round every P to bf16 before P·V: out = Σ p·v / l moves by at most
    // 2^-9 · max|v| more (taken twice for the f32 differences around it).
    const bool mma = attention_on_tensor_cores(s.D);
    double max_v = 0;
    for (float x : to_f32(vb)) max_v = std::max(max_v, double(std::abs(x)));
    const double p_rounding = mma ? 0x1p-8 * max_v : 0.0;
    const auto got = to_f32(out.values());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want_out[i], std::abs(want_out[i]) * 0x1p-8 + p_rounding + 1e-6) << "out element " << i;
    expect_close(lse.values(), want_lse, 2e-6, "lse");
    // The backward reads the bf16 output for Di = rowsum(dO ∘ O), as the GPU executor will.
    std::vector<float> want_dq(q_size(s)), want_dk(kv_size(s)), want_dv(kv_size(s));
    attention_backward(want_dq.data(), want_dk.data(), want_dv.data(), in.dout.data(), got.data(), lse.values().data(),
                       to_f32(qb).data(), to_f32(kb).data(), to_f32(vb).data(), doc_ids, s);
    Guarded<unsigned char> workspace(attention_backward_workspace_bytes(s));
    sim::attention_backward(kStream, dq.data(), dk.data(), dv.data(), in.dout.data(), out.data(), lse.data(), qb.data(),
                            kb.data(), vb.data(), doc_ids, s, workspace.data());
    // The tensor-core backward's products read bf16 P, dS and dO (2^-9 relative each, two per product at most):
    // a sum of such products is within ~2^-8 of its size, which its terms' cancellation can make a few times
    // the largest result. CUDA cores: f32 sums in another order.
    const double grad_tol = mma ? 1e-2 : 2e-5;
    expect_close(dq.values(), want_dq, grad_tol, "dq");
    expect_close(dk.values(), want_dk, grad_tol, "dk");
    expect_close(dv.values(), want_dv, grad_tol, "dv");
    if (sk) {  // from the stored (bf16) output, as the CPU op on its widened values
      std::vector<float> ds(size_t(s.Hq)), want_ds(size_t(s.Hq));
      sim::attention_sinks_backward(kStream, ds.data(), in.dout.data(), out.data(), lse.data(), sk, s);
      attention_sinks_backward(want_ds.data(), in.dout.data(), got.data(), lse.values().data(), sk, s);
      EXPECT_BITWISE_EQ(ds, want_ds);
    }
    EXPECT_TRUE(out.guards_intact() && lse.guards_intact() && dq.guards_intact() && dk.guards_intact() &&
                dv.guards_intact() && workspace.guards_intact());
  }
}

// The tensor-core kernels' double-buffered copies and their barriers: every thread order gives the forward
// order's bits (a missing barrier reads a tile before its copy or overwrites one still read). The forward with
// warps of 32 rows (Q copied into shared memory with the first key tile) and of 16 (Q in registers).
// Head dim 256 adds the dK/dV pass's Pᵀ and dSᵀ through shared memory between two barriers.
TEST(CudaSimAttention, TensorCoresAreTheSameInEveryThreadOrder) {
  struct OrderCase {
    AttentionShape s;
    int warp_rows;
    int documents;  // 0: none; 3: the last block starts at key tile 1, so its first copy goes to the odd buffer
  };
  for (const OrderCase& c : {OrderCase{{1, 150, 4, 2, 64}, 32, 0}, OrderCase{{1, 150, 2, 1, 64}, 16, 3},
                             OrderCase{{1, 83, 2, 1, 256}, 16, 0}}) {
    const AttentionShape s = c.s;
    SCOPED_TRACE("D=" + std::to_string(s.D) + " warp rows " + std::to_string(c.warp_rows));
    ASSERT_TRUE(attention_on_tensor_cores(s.D));
    const AttentionForwardWarpRows rows(c.warp_rows);
    const auto docs = c.documents ? doc_ids_for(Case{s, true, false, c.documents}) : std::vector<int32_t>{};
    const int32_t* doc_ids = docs.empty() ? nullptr : docs.data();
    const Inputs in = inputs_for(s, 5);
    const auto qb = to_bf16(in.q), kb = to_bf16(in.k), vb = to_bf16(in.v);
    std::vector<std::vector<float>> first;
    for_each_order([&] {
      std::vector<bf16_t> out(q_size(s));
      std::vector<float> lse(lse_size(s)), dq(q_size(s)), dk(kv_size(s)), dv(kv_size(s));
      std::vector<unsigned char> workspace(attention_backward_workspace_bytes(s));
      sim::attention_forward(kStream, out.data(), lse.data(), qb.data(), kb.data(), vb.data(), doc_ids, s);
      sim::attention_backward(kStream, dq.data(), dk.data(), dv.data(), in.dout.data(), out.data(), lse.data(),
                              qb.data(), kb.data(), vb.data(), doc_ids, s, workspace.data());
      const std::vector<std::vector<float>> now{to_f32(out), lse, dq, dk, dv};
      if (first.empty()) first = now;
      for (size_t i = 0; i < now.size(); ++i) EXPECT_BITWISE_EQ(now[i], first[i]);
    });
  }
}

// The forward's warps of 32 query rows (two m-tiles sharing each K and V fragment, Q from shared memory) give the
// bits of warps of 16 (Q's fragments in registers) on every case at head dims 64 and 128: each m-tile's rows see the
// same products and softmax steps in the same order. With 99 KiB a block (sm_86 / sm_89) the 32-row block at head dim
// 128 does not fit, and the launcher takes 16-row warps (cuda-sim refuses a launch over the limit).
TEST(CudaSimAttention, ForwardWarpsOf32RowsGiveTheBitsOf16) {
  for (const Case& c : kCases) {
    if (c.s.D != 64 && c.s.D != 128) continue;
    SCOPED_TRACE(name(c));
    const AttentionShape s = c.s;
    const Inputs in = inputs_for(s, uint64_t(3 * s.T + s.D));
    const auto docs = doc_ids_for(c);
    const int32_t* doc_ids = docs.empty() ? nullptr : docs.data();
    const auto qb = to_bf16(in.q), kb = to_bf16(in.k), vb = to_bf16(in.v);
    const auto sinks = sinks_for(c);
    const float* sk = sinks.empty() ? nullptr : sinks.data();
    auto forward = [&](int warp_rows) {
      const AttentionForwardWarpRows rows(warp_rows);
      Guarded<bf16_t> out(q_size(s));
      Guarded<float> lse(lse_size(s));
      sim::attention_forward(kStream, out.data(), lse.data(), qb.data(), kb.data(), vb.data(), doc_ids, s, sk);
      EXPECT_TRUE(out.guards_intact() && lse.guards_intact());
      return std::vector<std::vector<float>>{to_f32(out.values()), lse.values()};
    };
    const auto sixteen = forward(16), thirty_two = forward(32);
    for (size_t i = 0; i < sixteen.size(); ++i) EXPECT_BITWISE_EQ(thirty_two[i], sixteen[i]);
    const cuda_sim::SharedMemoryLimit sm89(kSm89BlockSharedBytes);
    const auto on_sm89 = forward(32);
    for (size_t i = 0; i < sixteen.size(); ++i) EXPECT_BITWISE_EQ(on_sm89[i], sixteen[i]);
  }
}

// The tensor-core path end to end on a case's bf16 inputs (seeded): dq, dk, dv of the forward's output and lse, every
// output and the workspace between sentinels.
std::vector<std::vector<float>> bf16_backward(const Case& c, uint64_t seed) {
  const AttentionShape s = c.s;
  const Inputs in = inputs_for(s, seed);
  const auto docs = doc_ids_for(c);
  const int32_t* doc_ids = docs.empty() ? nullptr : docs.data();
  const auto qb = to_bf16(in.q), kb = to_bf16(in.k), vb = to_bf16(in.v);
  std::vector<bf16_t> out(q_size(s));
  std::vector<float> lse(lse_size(s));
  Guarded<float> dq(q_size(s)), dk(kv_size(s)), dv(kv_size(s));
  Guarded<unsigned char> workspace(attention_backward_workspace_bytes(s));
  sim::attention_forward(kStream, out.data(), lse.data(), qb.data(), kb.data(), vb.data(), doc_ids, s);
  sim::attention_backward(kStream, dq.data(), dk.data(), dv.data(), in.dout.data(), out.data(), lse.data(), qb.data(),
                          kb.data(), vb.data(), doc_ids, s, workspace.data());
  EXPECT_TRUE(dq.guards_intact() && dk.guards_intact() && dv.guards_intact() && workspace.guards_intact());
  return {dq.values(), dk.values(), dv.values()};
}

// On a GPU whose blocks may opt into 99 KiB of shared memory (sm_86 / sm_89) the narrow dK/dV block at head dim 128
// (137 KiB) cannot launch: the launcher takes the wide kernel (32 keys × 32 queries, accumulators split over dims).
// It sums in the same order (query k-steps of 16, ascending) from the same bf16 P and dS, so under cuda-sim it gives
// the narrow kernel's bits. cuda-sim refuses a launch over the emulated limit, so the narrow block cannot have run.
TEST(CudaSimAttention, AnSm89TakesTheWideDkDvKernelAtHeadDim128WithTheSameBits) {
  for (const Case& c : {Case{{2, 75, 4, 2, 128, 40}, true}}) {  // two 64-row tiles, two rows, documents, a window
    SCOPED_TRACE(name(c));
    const auto narrow = bf16_backward(c, 9);
    const cuda_sim::SharedMemoryLimit sm89(kSm89BlockSharedBytes);
    const auto wide = bf16_backward(c, 9);  // its thread orders: TensorCoresAreTheSameInEveryThreadOrder (D 256)
    for (size_t i = 0; i < wide.size(); ++i) EXPECT_BITWISE_EQ(wide[i], narrow[i]);
  }
}

// With grouped heads the dK/dV partials are summed a group of batch rows at a time (AttentionMmaWorkspace): a budget
// of one row's partials makes a batch of two take two groups, with the one group's bits and a smaller workspace.
TEST(CudaSimAttention, DkDvPartialsSummedAGroupOfRowsAtATimeGiveTheSameBits) {
  for (const Case& c : {Case{{2, 37, 4, 2, 64}, true}, Case{{3, 40, 2, 1, 256, 24}, false}}) {
    SCOPED_TRACE(name(c));
    const AttentionShape s = c.s;
    const auto whole = bf16_backward(c, 10);
    ASSERT_EQ(attention_partial_rows(s), s.B);
    const size_t whole_bytes = attention_backward_workspace_bytes(s);
    const int64_t row_bytes = 2 * s.Hq * s.T * s.D * int64_t(sizeof(float));  // G · Hkv = Hq
    const AttentionPartialBudget one_row(row_bytes);
    ASSERT_EQ(attention_partial_rows(s), 1);
    EXPECT_LT(attention_backward_workspace_bytes(s), whole_bytes);
    const auto grouped = bf16_backward(c, 10);
    for (size_t i = 0; i < whole.size(); ++i) EXPECT_BITWISE_EQ(grouped[i], whole[i]);
  }
}

TEST(CudaSimAttention, BackwardMatchesFiniteDifferencesOfTheForwardKernel) {
  const AttentionShape s{1, 21, 2, 1, 64};
  const Inputs in = inputs_for(s, 77);
  auto loss = [&](const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v) {
    std::vector<float> out(q_size(s)), lse(lse_size(s));
    sim::attention_forward(kStream, out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, s);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += double(out[i]) * double(in.dout[i]);
    return sum;
  };
  std::vector<float> out(q_size(s)), lse(lse_size(s)), dq(q_size(s)), dk(kv_size(s)), dv(kv_size(s));
  std::vector<unsigned char> workspace(attention_backward_workspace_bytes(s));
  sim::attention_forward(kStream, out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), nullptr, s);
  sim::attention_backward(kStream, dq.data(), dk.data(), dv.data(), in.dout.data(), out.data(), lse.data(), in.q.data(),
                          in.k.data(), in.v.data(), nullptr, s, workspace.data());
  auto directional = [&](const std::vector<float>& grad, int which, uint64_t seed) {
    const auto dir = random_floats(grad.size(), seed);
    const float eps = 1e-2f;  // f32 forward: truncation O(eps²) and rounding ~1e-7·|L|/eps, both ≲ 1e-3 relative
    auto shifted = [&](float sign) {
      std::vector<float> q = in.q, k = in.k, v = in.v;
      std::vector<float>& x = which == 0 ? q : (which == 1 ? k : v);
      for (size_t i = 0; i < x.size(); ++i) x[i] += sign * eps * dir[i];
      return loss(q, k, v);
    };
    const double fd = (shifted(1.0f) - shifted(-1.0f)) / (2.0 * eps);
    double analytic = 0;
    for (size_t i = 0; i < grad.size(); ++i) analytic += double(grad[i]) * double(dir[i]);
    EXPECT_NEAR(analytic, fd, 3e-3 * std::abs(fd) + 1e-3) << "input " << which;
  };
  directional(dq, 0, 81);
  directional(dk, 1, 82);
  directional(dv, 2, 83);
}

// ldmatrix's emulation (what every tensor-core kernel's cuda-sim run loads fragments with) against PTX's
// definition: lane l gets row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j in r[j]; transposed, column
// l / 4 and rows 2 (l % 4), 2 (l % 4) + 1. (On a GPU, CudaNative.LdmatrixLayoutIsTheEmulations holds the
// instruction to the same.)
TEST(CudaSimMma, LdmatrixEmulationIsPtxsDefinition) {
  const std::vector<bf16_t> tile = to_bf16(random_floats(32 * 8, 44));  // matrix j = rows 8j .. 8j + 7
  std::vector<uint32_t> out(4 * 32 * 4);
  sim::ldmatrix_layout_check(kStream, out.data(), tile.data());
  auto at = [&](int j, int row, int col) { return uint32_t(tile[size_t((8 * j + row) * 8 + col)]); };
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j) {
      const int g = lane / 4, t = lane % 4;
      const uint32_t plain = at(j, g, 2 * t) | at(j, g, 2 * t + 1) << 16;
      const uint32_t transposed = at(j, 2 * t, g) | at(j, 2 * t + 1, g) << 16;
      for (int v = 0; v < 2; ++v) {
        EXPECT_EQ(out[size_t((v * 32 + lane) * 4 + j)], plain) << "lane " << lane << " matrix " << j;
        EXPECT_EQ(out[size_t(((2 + v) * 32 + lane) * 4 + j)], transposed) << "lane " << lane << " matrix " << j;
      }
    }
}

TEST(CudaSimAttention, RefusesAHeadDimensionItHasNoKernelFor) {
  const AttentionShape s{1, 5, 2, 1, 320};
  std::vector<float> x(q_size(s), 0.5f), lse(lse_size(s));
  try {
    sim::attention_forward(kStream, x.data(), lse.data(), x.data(), x.data(), x.data(), nullptr, s);
    ADD_FAILURE() << "head dimension 320 was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("attention_forward"), std::string::npos) << m;
    EXPECT_NE(m.find("head dimension 320"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace lt::cuda
