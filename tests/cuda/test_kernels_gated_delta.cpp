// The gated delta rule's kernels (cuda/kernels/gated_delta.cuh) under cuda-sim: forward and backward against the
// f64 recurrence (ops/gated_delta.h's reference, itself checked by finite differences in tests/ops) and the CPU
// chunked op, on packed rows, odd head dims, rows across a chunk boundary and Qwen3.6's head dims; the same bits
// in every thread order; bf16 storage equal to the f32 kernels on the widened inputs; sentinel guards around
// every output and the workspace. The tensor-core kernels (gated_delta_mma*.cuh: bf16, head dims multiples of 16)
// against the recurrence to bf16 bounds, across documents inside and across 64-token tiles, in row groups.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "core/error.h"
#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/sim_orders.h"
#include "ops/gated_delta.h"

namespace lt::cuda {
namespace {

using testing::for_each_order;
using testing::Guarded;
using testing::random_floats;
using testing::rel_l2;
using testing::to_bf16;
using testing::to_f32;
using Vec = std::vector<float>;

constexpr Stream kStream = nullptr;

// Inputs as a Gated DeltaNet layer gives the rule: q | k | v as slices of one conv output row [N, 2·Hk·dk + Hv·dv]
// (strided), q and k L2-normalised per head, β ∈ (0, 1), g ≤ 0 from near 0 (long memory) to −12 (e^g ≈ 0).
struct Inputs {
  DeltaShape s;
  Vec qkv, beta, g, dout;
  std::vector<int32_t> docs;  // empty: each row one document
  const int32_t* doc_ids() const { return docs.empty() ? nullptr : docs.data(); }
  int64_t k_at() const { return s.Hk * s.dk; }
  int64_t v_at() const { return 2 * s.Hk * s.dk; }
};

struct Case {
  int64_t B, T, Hk, Hv, dk, dv;
  int packed;  // 0: a document per row; 1: documents starting inside chunks; 2: documents across tiles (below)
};

std::string name(const Case& c) {
  std::string s = "B T Hk Hv dk dv =";
  for (int64_t d : {c.B, c.T, c.Hk, c.Hv, c.dk, c.dv}) s.append(" ").append(std::to_string(d));
  return c.packed ? s.append(", packed") : s;
}

Inputs make(const Case& c, uint64_t seed) {
  Inputs in;
  const int64_t ld = 2 * c.Hk * c.dk + c.Hv * c.dv, N = c.B * c.T;
  in.s = DeltaShape{c.B, c.T, c.Hk, c.Hv, c.dk, c.dv, float(1.0 / std::sqrt(double(c.dk))), ld, ld, ld};
  in.qkv = random_floats(size_t(N * ld), seed, -1.f, 1.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < 2 * c.Hk; ++h) {
      float* x = &in.qkv[size_t(n * ld + h * c.dk)];
      double ss = 0;
      for (int64_t d = 0; d < c.dk; ++d) ss += double(x[d]) * x[d];
      for (int64_t d = 0; d < c.dk; ++d) x[d] = float(x[d] / std::sqrt(ss + 1e-6));
    }
  in.beta = random_floats(size_t(N * c.Hv), seed + 1, 0.02f, 0.98f);
  in.g = random_floats(size_t(N * c.Hv), seed + 2, -7.f, 2.5f);
  for (float& x : in.g) x = -std::exp(x);
  in.dout = random_floats(size_t(N * c.Hv * c.dv), seed + 3);
  if (c.packed == 1) {  // row 0: documents of 5, 62 (to token 67) and the rest; row 1: 1 token, then one document
    in.docs.resize(size_t(N));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t)
        in.docs[size_t(b * c.T + t)] = b == 0 ? (t < 5 ? 0 : t < 67 ? 1 : 2) : (t < 1 ? 3 : 4);
  } else if (c.packed == 2) {
    // Row 0: [0, 40), [40, 100), [100, 128), the rest: tile 0 hands a document on, tile 1 carries it in and ends
    // another, tile 2 starts one. Row 1: 1 token, then one document: a state carried through tile 1 into tile 2.
    in.docs.resize(size_t(N));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t)
        in.docs[size_t(b * c.T + t)] = b == 0 ? (t < 40 ? 0 : t < 100 ? 1 : t < 128 ? 2 : 3) : (t < 1 ? 4 : 5);
  }
  return in;
}

struct Result {
  Vec o, dqkv, dbeta, dg;
};

// Every output of `got` bit for bit `want`'s.
void expect_same_bits(const Result& got, const Result& want) {
  EXPECT_BITWISE_EQ(got.o, want.o);
  EXPECT_BITWISE_EQ(got.dqkv, want.dqkv);
  EXPECT_BITWISE_EQ(got.dbeta, want.dbeta);
  EXPECT_BITWISE_EQ(got.dg, want.dg);
}

// The kernels' forward and backward; T_ the storage of q, k, v and o (the inputs rounded to it), `offset` elements
// into their buffer (1: views that are not 16-byte aligned).
template <class T_>
Result run_kernels(const Inputs& in, size_t offset = 0) {
  const DeltaShape& s = in.s;
  std::vector<T_> qkv(in.qkv.size());
  if constexpr (std::is_same_v<T_, float>)
    qkv = in.qkv;
  else
    qkv = to_bf16(in.qkv);
  qkv.insert(qkv.begin(), offset, T_{});
  Guarded<T_> o(size_t(s.N() * s.Hv * s.dv));
  Guarded<float> dqkv(in.qkv.size()), dbeta(in.beta.size()), dg(in.g.size());
  Guarded<unsigned char> fws(gated_delta_forward_workspace_bytes(s)), bws(gated_delta_backward_workspace_bytes(s));
  const T_* q = qkv.data() + offset;
  sim::gated_delta_forward(kStream, o.data(), q, q + in.k_at(), q + in.v_at(), in.beta.data(), in.g.data(),
                           in.doc_ids(), s, fws.data());
  float* d = dqkv.data();
  sim::gated_delta_backward(kStream, d, d + in.k_at(), d + in.v_at(), dbeta.data(), dg.data(), in.dout.data(), q,
                            q + in.k_at(), q + in.v_at(), in.beta.data(), in.g.data(), in.doc_ids(), s, bws.data());
  EXPECT_TRUE(o.guards_intact()) << "o";
  EXPECT_TRUE(dqkv.guards_intact() && dbeta.guards_intact() && dg.guards_intact()) << "gradients";
  EXPECT_TRUE(fws.guards_intact() && bws.guards_intact()) << "workspace";
  Result r;
  if constexpr (std::is_same_v<T_, float>)
    r.o = o.values();
  else
    r.o = to_f32(o.values());
  r.dqkv = dqkv.values(), r.dbeta = dbeta.values(), r.dg = dg.values();
  return r;
}

// The CPU op: the f64 recurrence (reference) or the chunked fast path.
Result run_cpu(const Inputs& in, bool recurrent) {
  const DeltaShape& s = in.s;
  Result r{Vec(size_t(s.N() * s.Hv * s.dv), NAN), Vec(in.qkv.size(), NAN), Vec(in.beta.size(), NAN),
           Vec(in.g.size(), NAN)};
  const float* q = in.qkv.data();
  float* d = r.dqkv.data();
  (recurrent ? gated_delta_forward_recurrent : gated_delta_forward)(r.o.data(), q, q + in.k_at(), q + in.v_at(),
                                                                    in.beta.data(), in.g.data(), in.doc_ids(), s);
  (recurrent ? gated_delta_backward_recurrent : gated_delta_backward)(
      d, d + in.k_at(), d + in.v_at(), r.dbeta.data(), r.dg.data(), in.dout.data(), q, q + in.k_at(), q + in.v_at(),
      in.beta.data(), in.g.data(), in.doc_ids(), s);
  return r;
}

const Case kCases[] = {
    {2, 70, 2, 4, 12, 10, true},    // value heads 2× key heads, across a chunk, three and two documents
    {1, 37, 1, 3, 8, 6, false},     // one partial chunk
    {2, 130, 1, 1, 16, 16, false},  // three chunks, the state carried twice
    {1, 70, 1, 2, 128, 128, false}  // Qwen3.6's head dims
};

TEST(GatedDeltaKernels, MatchTheRecurrenceAndTheCpuOp) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const Inputs in = make(c, 40);
    const Result ref = run_cpu(in, true), cpu = run_cpu(in, false);
    for_each_order([&] {
      const Result gpu = run_kernels<float>(in);
      // The chunked form in f32 against the f64 recurrence: the CPU op's bounds (tests/ops/test_gated_delta.cpp,
      // measured there 4e-7 .. 1.2e-6; here 1.9e-7 .. 7.8e-7, as the CPU op's to within 1.5×), far below a
      // wrong term (~1).
      EXPECT_LT(rel_l2(gpu.o, ref.o), 1e-5) << "o";
      EXPECT_LT(rel_l2(gpu.dqkv, ref.dqkv), 2e-5) << "dq | dk | dv";
      EXPECT_LT(rel_l2(gpu.dbeta, ref.dbeta), 2e-5) << "dbeta";
      EXPECT_LT(rel_l2(gpu.dg, ref.dg), 2e-5) << "dg";
      // The same steps as the CPU op with other summation orders: f32 rounding apart (measured ≤ 3e-7).
      EXPECT_LT(rel_l2(gpu.o, cpu.o), 1e-5) << "o vs the CPU op";
      EXPECT_LT(rel_l2(gpu.dqkv, cpu.dqkv), 2e-5) << "dqkv vs the CPU op";
    });
  }
}

TEST(GatedDeltaKernels, SameBitsInEveryThreadOrder) {
  const Inputs in = make(kCases[0], 41);
  Result first;
  bool have = false;
  for_each_order([&] {
    const Result r = run_kernels<float>(in);
    if (!have) {
      first = r;
      have = true;
      return;
    }
    expect_same_bits(r, first);
  });
}

TEST(GatedDeltaKernels, Bf16StorageIsTheF32KernelOnTheWidenedInputs) {
  // q, k, v stored bf16 are widened exactly on load, so the bf16 kernels compute the f32 kernels' values on the
  // widened inputs: the gradients bit for bit, the output that value rounded once to bf16.
  for (const Case& c : {kCases[0], kCases[1]}) {
    SCOPED_TRACE(name(c));
    Inputs in = make(c, 42);
    const Result b16 = run_kernels<bf16_t>(in);
    in.qkv = to_f32(to_bf16(in.qkv));
    const Result f32 = run_kernels<float>(in);
    EXPECT_BITWISE_EQ(b16.o, to_f32(to_bf16(f32.o)));
    EXPECT_BITWISE_EQ(b16.dqkv, f32.dqkv);
    EXPECT_BITWISE_EQ(b16.dbeta, f32.dbeta);
    EXPECT_BITWISE_EQ(b16.dg, f32.dg);
  }
}

// Head dims that are multiples of 16 at bf16 storage: forward and backward on tensor cores (gated_delta_mma*.cuh).
const Case kTensorCoreCases[] = {
    {2, 150, 1, 2, 16, 32, 2},       // three tiles; documents start at a tile's first token, inside tiles, across them
    {1, 70, 1, 2, 128, 128, 0},      // Qwen3.6's head dims: the state over a full tile into a partial one
    {1, 45, 2, 4, 32, 48, 1},        // dv an odd multiple of 16; value heads 2× key heads
};

TEST(GatedDeltaKernels, TensorCoresMatchTheRecurrenceWithTheSameBitsInEveryThreadOrder) {
  // Every block fits what an sm_86 / sm_89 block may opt into (cuda-sim refuses a launch over it).
  const cuda_sim::SharedMemoryLimit sm89(kSm89BlockSharedBytes);
  for (const Case& c : kTensorCoreCases) {
    SCOPED_TRACE(name(c));
    Inputs in = make(c, 43);
    in.qkv = to_f32(to_bf16(in.qkv));  // the inputs the bf16 kernels see, so only their own roundings differ
    // Even value heads keep a long memory (g ≥ −0.12), so a state leaking across a document boundary or dropped at
    // one shows; odd heads forget within a few tokens (down to e^γ ≈ 0).
    for (size_t x = 0; x < in.g.size(); x += 2) in.g[x] *= 0.01f;
    ASSERT_TRUE(gated_delta_on_tensor_cores(in.s));
    const Result ref = run_cpu(in, true);
    Result first;
    auto check = [&] {
      const Result gpu = run_kernels<bf16_t>(in);
      // bf16 operands (A diag(·), S₀, V', QKᵀ ⊙ E, dO, dS₁, dV', dW rounded once each, relative 2⁻⁹) and the
      // output's own rounding: measured o 3.4e-3 .. 4.3e-3, dq | dk | dv 3.2e-3 .. 4.3e-3, dβ 2.7e-3 .. 3.7e-3,
      // dg 1.9e-3 .. 7e-3 against the f64 recurrence; a dropped document mask or gate term measured 0.05 .. 0.6.
      EXPECT_LT(rel_l2(gpu.o, ref.o), 1e-2) << "o";
      EXPECT_LT(rel_l2(gpu.dqkv, ref.dqkv), 2e-2) << "dq | dk | dv";
      EXPECT_LT(rel_l2(gpu.dbeta, ref.dbeta), 2e-2) << "dbeta";
      EXPECT_LT(rel_l2(gpu.dg, ref.dg), 2e-2) << "dg";
      if (first.o.empty()) {
        first = gpu;
        return;
      }
      expect_same_bits(gpu, first);
    };
    if (c.dk * c.dv <= 32 * 48)
      for_each_order(check);
    else
      check();  // Qwen3.6's dims in one order (5 s a run): the small cases hold the orders
  }
}

TEST(GatedDeltaKernels, TensorCoresGiveTheSameBitsByGroupsOfRowsAndOnUnalignedViews) {
  // Each batch row is its own: a budget of one row at a time (two groups) gives the whole batch's bits;
  // q, k, v one element off 16-byte alignment take the 2-byte loads, the same values.
  const Inputs in = make(kTensorCoreCases[0], 44);
  const Result whole = run_kernels<bf16_t>(in), unaligned = run_kernels<bf16_t>(in, 1);
  expect_same_bits(unaligned, whole);
  ASSERT_EQ(gated_delta_forward_rows(in.s), in.s.B);
  ASSERT_EQ(gated_delta_backward_rows(in.s), in.s.B);
  const DeltaWorkspaceBudget one_row(1);
  ASSERT_EQ(gated_delta_forward_rows(in.s), 1);
  ASSERT_EQ(gated_delta_backward_rows(in.s), 1);
  const Result grouped = run_kernels<bf16_t>(in);
  expect_same_bits(grouped, whole);
}

TEST(GatedDeltaKernels, EmptyBatchLaunchesNothingAndBadShapesAreErrors) {
  DeltaShape s = DeltaShape::packed(0, 5, 1, 2, 4, 4, 0.5f);
  EXPECT_EQ(gated_delta_forward_workspace_bytes(s), 0u);
  sim::gated_delta_forward(kStream, static_cast<float*>(nullptr), nullptr, nullptr, nullptr, nullptr, nullptr,
                           nullptr, s, nullptr);
  s = DeltaShape::packed(1, 5, 2, 3, 4, 4, 0.5f);  // 3 value heads over 2 key heads
  Vec buf(1000, 1.f);
  EXPECT_THROW(sim::gated_delta_forward(kStream, buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                        buf.data(), nullptr, s, buf.data()),
               Error);
}

}  // namespace
}  // namespace lt::cuda
