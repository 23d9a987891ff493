// The op table (tests/testing/op_harness.h): every op below on every backend this host has — plain, AVX2,
// AVX-512, the CUDA kernels under cuda-sim in four thread orders, and natively on a GPU where there is one — against
// the plain backend's outputs, on odd
// shapes with sentinels around every output. One gtest per (op, backend, dtype): its name says which, and a failure
// inside it names the shape and the output. cuda-sim rows must also repeat the forward order's bits in every order.
//
// What the rows hold (and why): the vector paths perform the plain loops' operations lane for lane with FMA
// contraction off (SwiGLU, RMSNorm, RoPE, the head's softmax passes), and the element-wise and row kernels of
// cuda-sim perform the CPU op's operations in its order — the same bits. GEMM-based ops (linear, attention, the
// head under cuda-sim) sum in another order: a tolerance from the sums' length in f32 (Tolerance::reordered_sums),
// or the kernel tests' measured bounds where bf16 rounding points can flip (the head at bf16).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "core/rng.h"
#include "ops/attention.h"
#include "ops/delta_gates.h"
#include "ops/embedding.h"
#include "ops/gated_rmsnorm.h"
#include "ops/head.h"
#include "ops/l2norm.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/short_conv.h"
#include "ops/sigmoid_gate.h"
#include "ops/swiglu.h"
#include "testing/op_harness.h"

namespace lt::testing {
namespace {

// Seeded values in [lo, hi), none exactly zero.
std::vector<float> values(size_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = rng.uniform(lo, hi);
    if (x == 0.0f) x = 0.5f;
  }
  return v;
}

std::vector<int32_t> ids(size_t n, uint64_t seed, int64_t below) {
  Rng rng(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = int32_t(rng.below(uint64_t(below)));
  return v;
}

std::vector<float> bf16_rounded(std::vector<float> v) {
  std::vector<bf16_t> b(v.size());
  convert_f32_to_bf16(b.data(), v.data(), v.size());
  convert_bf16_to_f32(v.data(), b.data(), v.size());
  return v;
}

Tolerance bitwise(OpBackend, DType, const Shape&) { return Tolerance::bitwise(); }

// --- the ops --------------------------------------------------------------------------------------------------

OpCase rmsnorm_forward_case() {
  // Rows: one, a partial block, several dweight chunks; C below, between and above the 16 lanes; C % 8 == 0 (the
  // packed kernels), past one 256-element stage and a pack into the next.
  return {"rmsnorm_forward", {{1, 1}, {7, 5}, {9, 33}, {37, 100}, {130, 17}, {13, 264}, {3, 1032}}, {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t rows = s[0], C = s[1];
            const auto x = values(size_t(rows * C), 1 + rows), w = values(size_t(C), 2 + C, 0.5f, 1.5f);
            rmsnorm_forward(out.add("out", x.size()), out.add("rstd", size_t(rows)), x.data(), w.data(), rows, C, 1e-6f);
          },
          bitwise};
}

OpCase rmsnorm_backward_case() {
  return {"rmsnorm_backward", {{1, 1}, {7, 5}, {9, 33}, {37, 100}, {130, 17}, {13, 264}, {3, 1032}}, {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t rows = s[0], C = s[1];
            const auto x = values(size_t(rows * C), 5 + rows), w = values(size_t(C), 6 + C, 0.5f, 1.5f);
            const auto g = values(x.size(), 7 + rows);
            std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows));
            rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, C, 1e-6f);
            float* dw = out.add("dweight (accumulated)", size_t(C), values(size_t(C), 8));
            rmsnorm_backward(out.add("din", x.size()), dw, g.data(), x.data(), w.data(), rstd.data(), rows, C);
          },
          bitwise};
}

OpCase rope_case() {
  // Rows with non-monotonic positions (packed documents); D from one pair to 256.
  return {"rope_forward_backward", {{1, 1, 2}, {13, 3, 6}, {7, 5, 64}, {3, 2, 256}}, {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], H = s[1], D = s[2];
            const auto pos = ids(size_t(N), uint64_t(N + D), 50);
            const auto x = values(size_t(N * H * D), 31 + D);
            float* fwd = out.add("forward", x.size(), x);
            float* bwd = out.add("backward", x.size(), x);
            rope_forward(fwd, pos.data(), N, H, D, 1e6);
            rope_backward(bwd, pos.data(), N, H, D, 1e6);
            // YaRN (GPT-OSS's scaling): the CUDA kernels rotate by the CPU op's table, scaled cos and sin included.
            const RopeSpec yarn = RopeSpec::yarn(150000.0, 32.0, 32.0, 1.0, 4096, false);
            rope_forward(out.add("forward (yarn)", x.size(), x), pos.data(), N, H, D, yarn);
            rope_backward(out.add("backward (yarn)", x.size(), x), pos.data(), N, H, D, yarn);
          },
          bitwise};
}

OpCase swiglu_case() {
  // Ragged tails for the 8- and 16-wide loops; gates across the whole range the stable sigmoid treats apart.
  return {"swiglu_forward_backward", {{1}, {31}, {257}, {37 * 67 + 13}, {3001}, {4096 + 13}}, {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t n = s[0];
            auto gate = values(size_t(n), 51 + n, -12.0f, 12.0f);
            if (n > 2) gate[1] = -100.0f, gate[2] = 95.0f;
            const auto up = values(size_t(n), 52 + n), dout = values(size_t(n), 53 + n);
            swiglu_forward(out.add("out", size_t(n)), gate.data(), up.data(), n);
            swiglu_backward(out.add("dgate", size_t(n)), out.add("dup", size_t(n)), dout.data(), gate.data(), up.data(), n);
          },
          bitwise};
}

OpCase embedding_case() {
  return {"embedding_forward_backward", {{1, 3}, {17, 37}, {64, 129}, {40, 264}}, {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], C = s[1], V = 23;
            auto tok = ids(size_t(N), uint64_t(N * C), V / 2);  // repeats, and ids seen once
            if (N > 1) tok[0] = int32_t(V - 1);
            const auto table = values(size_t(V * C), 81 + N), dout = values(size_t(N * C), 82 + N);
            embedding_forward(out.add("out", size_t(N * C)), tok.data(), table.data(), N, C, V);
            embedding_backward(out.add("dtable (accumulated)", size_t(V * C), values(size_t(V * C), 83)), dout.data(),
                               tok.data(), N, C, V);
            const TokenGroups g = group_tokens_by_id(tok.data(), N, V);  // the streamed step's device half alone
            const int64_t P = int64_t(g.present.size());
            embedding_grad_rows(out.add("rows", size_t(P * C)), dout.data(), g.start.data(), g.order.data(), P, C);
          },
          bitwise};
}

// Shape {N, C, V, chunk}: chunks that divide N and that leave a ragged last chunk.
OpCase head_case() {
  return {"head_forward_backward",
          {{37, 48, 101, 8}, {37, 48, 101, 16}, {74, 48, 101, 16}, {37, 48, 101, 37}, {37, 48, 101, 64}, {9, 5, 13, 4}},
          {DType::f32, DType::bf16},
          true,
          [](OpOutputs& out, const Shape& s, DType dt) {
            const HeadShape hs{s[0], s[1], s[2], 1e-6f, s[3]};
            auto targets = ids(size_t(hs.N), 7, hs.V);
            targets[3] = kIgnoreIndex;
            const auto x = values(size_t(hs.N * hs.C), 8), norm_w = values(size_t(hs.C), 9, 0.5f, 1.5f);
            const auto lm_f32 = values(size_t(hs.V * hs.C), 10, -0.5f, 0.5f);
            std::vector<bf16_t> lm_b(lm_f32.size());
            convert_f32_to_bf16(lm_b.data(), lm_f32.data(), lm_f32.size());
            const WeightRef lm = dt == DType::bf16 ? WeightRef{lm_b.data(), DType::bf16} : WeightRef{lm_f32.data(), DType::f32};
            float* dnorm = out.add("dnorm_w (accumulated)", size_t(hs.C), values(size_t(hs.C), 11));
            float* dlm = out.add("dlm_w (accumulated)", lm_f32.size(), values(lm_f32.size(), 12));
            out.scalar("loss", head_forward_backward(out.add("dx", x.size()), dnorm, dlm, x.data(), targets.data(),
                                                     norm_w.data(), lm, 1.0f / float(hs.N), hs));
            out.scalar("loss (forward only)", head_forward(x.data(), targets.data(), norm_w.data(), lm, hs));
          },
          [](OpBackend b, DType dt, const Shape&) {
            // The vector passes are the scalar ones lane for lane. cuda-sim's chunked GEMMs sum in their own order:
            // f32 2e-6 of the largest value; bf16 GEMMs round xn and dlogits to bf16 in both, and one near a rounding
            // boundary may round the other way after an f32-level difference: 2^-8 diluted over C or V terms, 2e-3.
            if (!is_cuda(b)) return Tolerance::bitwise();
            return Tolerance::of(dt == DType::bf16 ? 2e-3 : 2e-6);
          }};
}

// Shape {N, in, out}: one row, odd widths, and rows past a token slice (dW accumulated in two slices).
OpCase linear_case() {
  return {"linear_forward_backward",
          {{1, 5, 3}, {37, 33, 17}, {4096 + 37, 5, 3}},
          {DType::f32, DType::bf16},
          true,
          [](OpOutputs& out, const Shape& s, DType dt) {
            const int64_t N = s[0], K = s[1], M = s[2];
            // bf16 weights: inputs already bf16 values, so the GEMMs' own rounding of x changes nothing.
            auto x = values(size_t(N * K), 11), w = values(size_t(M * K), 12);
            if (dt == DType::bf16) x = bf16_rounded(x);
            const auto bias = values(size_t(M), 13), dy = values(size_t(N * M), 14);
            std::vector<bf16_t> wb(w.size());
            convert_f32_to_bf16(wb.data(), w.data(), w.size());
            const WeightRef W = dt == DType::bf16 ? WeightRef{wb.data(), DType::bf16} : WeightRef{w.data(), DType::f32};
            linear_forward(out.add("y", size_t(N * M)), x.data(), W, bias.data(), N, K, M);
            linear_backward(out.add("dx", size_t(N * K)), out.add("dW (accumulated)", w.size(), values(w.size(), 15)),
                            out.add("dbias (accumulated)", size_t(M), values(size_t(M), 16)), dy.data(), x.data(), W, N, K,
                            M);
          },
          [](OpBackend, DType, const Shape& s) {
            // y sums K products, dx M, dW and dbias N: the longest of them bounds every output's reordering.
            return Tolerance::reordered_sums(std::max({s[0], s[1], s[2]}));
          }};
}

// Shape {B, T, Hq, Hkv, D, packed}: grouped heads, head dims of every tile path, a single token, packed documents.
OpCase attention_case() {
  return {"attention_forward_backward",
          {{2, 37, 4, 2, 64, 0}, {1, 45, 3, 1, 128, 1}, {1, 19, 2, 2, 256, 0}, {1, 1, 2, 1, 64, 0}, {2, 23, 6, 2, 40, 1}},
          {DType::f32},
          true,
          [](OpOutputs& out, const Shape& sh, DType) {
            const AttentionShape s{sh[0], sh[1], sh[2], sh[3], sh[4]};
            const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
            const auto q = values(nq, 21), k = values(nkv, 22), v = values(nkv, 23), dout = values(nq, 24);
            std::vector<int32_t> docs;
            if (sh[5]) {  // two documents per row
              docs.resize(size_t(s.B * s.T));
              for (int64_t t = 0; t < s.B * s.T; ++t) docs[size_t(t)] = int32_t((t % s.T) < s.T / 2 ? 0 : 1);
            }
            const int32_t* doc = docs.empty() ? nullptr : docs.data();
            float* o = out.add("out", nq);
            float* lse = out.add("lse", size_t(s.B * s.Hq * s.T));
            attention_forward(o, lse, q.data(), k.data(), v.data(), doc, s);
            attention_backward(out.add("dq", nq), out.add("dk", nkv), out.add("dv", nkv), dout.data(), o, lse, q.data(),
                               k.data(), v.data(), doc, s);
          },
          [](OpBackend, DType, const Shape& sh) {
            // The vector softmax paths agree with each other, not with the plain loop's exp; cuda-sim tiles its sums.
            // Forward and backward sum over T keys and D dims: 2e-5 of the largest value, the kernel tests' bound,
            // and as much of the inputs' O(1) scale (one key: dq and dk are 0 up to rounding, in either sign).
            const double r = std::max(2e-5, Tolerance::reordered_sums(std::max(sh[1], sh[4])).relative);
            return Tolerance::of(r, r);
          }};
}

// GPT-OSS's attention: shape {B, T, Hq, Hkv, D, window}, sinks on every head; a window inside a tile, across tiles,
// and wider than the row; on the CUDA kernels too (the window in their masks, the sinks' own kernels).
OpCase attention_window_sinks_case() {
  return {"attention_window_sinks",
          {{2, 37, 4, 2, 64, 5}, {1, 150, 4, 1, 40, 70}, {1, 23, 2, 2, 16, 64}, {1, 70, 2, 1, 128, 33}},
          {DType::f32},
          true,
          [](OpOutputs& out, const Shape& sh, DType) {
            const AttentionShape s{sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]};
            const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
            const auto q = values(nq, 25), k = values(nkv, 26), v = values(nkv, 27), dout = values(nq, 28);
            const auto sinks = values(size_t(s.Hq), 29, -1.0f, 3.0f);
            float* o = out.add("out", nq);
            float* lse = out.add("lse", size_t(s.B * s.Hq * s.T));
            attention_forward(o, lse, q.data(), k.data(), v.data(), nullptr, s);
            attention_sinks_forward(o, lse, sinks.data(), s);
            attention_backward(out.add("dq", nq), out.add("dk", nkv), out.add("dv", nkv), dout.data(), o, lse, q.data(),
                               k.data(), v.data(), nullptr, s);
            attention_sinks_backward(out.add("dsinks", size_t(s.Hq)), dout.data(), o, lse, sinks.data(), s);
          },
          [](OpBackend, DType, const Shape& sh) {
            // As attention's (the vector exp against std::exp, sums over T keys and D dims); dsinks sums B·T rows.
            const double r = std::max(2e-5, Tolerance::reordered_sums(std::max(sh[0] * sh[1], sh[4])).relative);
            return Tolerance::of(r, r);
          }};
}

// GPT-OSS's clamped SwiGLU: one plain build and a kernel of the same formulas (ops/swiglu_math.h), so every backend
// gives its bits. Gates and ups across both clamps.
OpCase clamped_swiglu_case() {
  return {"clamped_swiglu_forward_backward", {{1}, {37 * 67 + 13}, {4096 + 13}}, {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t n = s[0];
            const auto gate = values(size_t(n), 54 + n, -12.0f, 12.0f), up = values(size_t(n), 55 + n, -12.0f, 12.0f);
            const auto dout = values(size_t(n), 56 + n);
            clamped_swiglu_forward(out.add("out", size_t(n)), gate.data(), up.data(), n, 1.702f, 7.0f);
            clamped_swiglu_backward(out.add("dgate", size_t(n)), out.add("dup", size_t(n)), dout.data(), gate.data(),
                                    up.data(), n, 1.702f, 7.0f);
          },
          bitwise};
}

// CPU-only ops of the hybrid layers (no cuda-sim routing: the CUDA block runs their kernels itself, held against
// these ops by tests/cuda/test_kernels_linear_attention.cpp).
OpCase l2norm_case() {
  return {"l2norm_forward", {{1, 1, 4}, {7, 3, 16}, {33, 2, 128}}, {DType::f32}, false,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], H = s[1], d = s[2];
            const auto x = values(size_t(N * H * d), 61);
            l2norm_forward(out.add("out", x.size()), out.add("rnorm", size_t(N * H)), x.data(), N, H, d, H * d, H * d,
                           1e-6f);
          },
          bitwise};
}

OpCase sigmoid_gate_case() {
  return {"sigmoid_gate_forward", {{1, 1, 4}, {9, 3, 16}, {40, 4, 64}}, {DType::f32}, false,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], H = s[1], D = s[2];
            const auto x = values(size_t(N * H * D), 71), gate = values(size_t(N * H * 2 * D), 72, -10.f, 10.f);
            sigmoid_gate_forward(out.add("out", x.size()), x.data(), gate.data() + D, N, H, D, 2 * H * D, 2 * D);
          },
          bitwise};
}

OpCase short_conv_case() {
  return {"short_conv_forward", {{1, 1, 4, 3}, {2, 17, 5, 4}, {1, 70, 33, 4}}, {DType::f32}, false,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t B = s[0], T = s[1], Dc = s[2], K = s[3];
            const auto x = values(size_t(B * T * Dc), 81), w = values(size_t(Dc * K), 82);
            short_conv_forward(out.add("out", x.size()), x.data(), w.data(), nullptr, B * T, T, Dc, K);
          },
          bitwise};
}

OpCase delta_gates_case() {
  return {"delta_gates_forward", {{1, 1}, {13, 3}, {64, 16}}, {DType::f32}, false,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], Hv = s[1];
            const auto b = values(size_t(N * Hv), 91), a = values(size_t(N * Hv), 92);
            const auto A_log = values(size_t(Hv), 93, -1.f, 1.f), dt_bias = values(size_t(Hv), 94, -1.f, 1.f);
            delta_gates_forward(out.add("beta", b.size()), out.add("g", a.size()), b.data(), a.data(), A_log.data(),
                                dt_bias.data(), N, Hv);
          },
          bitwise};
}

OpCase gated_rmsnorm_case() {
  return {"gated_rmsnorm_forward", {{1, 1, 4}, {9, 3, 16}, {40, 4, 128}}, {DType::f32}, false,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], H = s[1], d = s[2];
            const auto x = values(size_t(N * H * d), 101), z = values(size_t(N * H * d), 102);
            const auto w = values(size_t(d), 103, 0.5f, 1.5f);
            gated_rmsnorm_forward(out.add("out", x.size()), out.add("rstd", size_t(N * H)), x.data(), z.data(), w.data(),
                                  N * H, d, 1e-6f);
          },
          bitwise};
}

// MoE routing and its row shuffles (ops/moe.h): plain scalar loops with no ISA paths, and CUDA kernels that perform
// the same operations in the same order (cuda/kernels/moe.cuh: the router is ops/moe_math.h itself), so every row,
// the CPU's and the kernels' in every thread order, must give the plain row's bits. Integer outputs (ids, offsets,
// order, row_of) as exact floats.
float* add_ints(OpOutputs& out, const std::string& name, const int32_t* v, size_t n) {
  float* p = out.add(name, n);
  for (size_t i = 0; i < n; ++i) p[i] = float(v[i]);
  return p;
}

// Shape {N, E, k, kind (0 softmax_topk, 1 topk_softmax), renormalize}: one token and expert, a partial top-k, k = E,
// k = 1, and 130 tokens (three router tasks) over 64 experts.
std::vector<Shape> router_shapes() {
  return {{1, 1, 1, 0, 0},  {7, 5, 2, 0, 0}, {33, 16, 8, 0, 1}, {33, 16, 8, 1, 0},
                                          {6, 6, 6, 0, 1},  {9, 8, 1, 1, 0}, {130, 64, 8, 0, 1}, {130, 64, 4, 1, 0}};
}
RouterShape router_shape(const Shape& s) {
  return {s[0], s[1], s[2], s[3] ? RouterKind::topk_softmax : RouterKind::softmax_topk, s[4] != 0};
}

struct Routing {
  std::vector<int32_t> ids;  // [N, k]
  std::vector<float> w, p;   // [N, k], [N, E]
};
Routing routing(const RouterShape& rs, uint64_t seed) {
  Routing r{std::vector<int32_t>(size_t(rs.N * rs.k)), std::vector<float>(size_t(rs.N * rs.k)),
            std::vector<float>(size_t(rs.N * rs.E))};
  const auto logits = values(size_t(rs.N * rs.E), seed, -3.0f, 3.0f);
  router_forward(r.ids.data(), r.w.data(), r.p.data(), logits.data(), rs);
  return r;
}

OpCase router_forward_case() {
  return {"router_forward", router_shapes(), {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const RouterShape rs = router_shape(s);
            const Routing r = routing(rs, 201 + s[0] + s[1]);
            add_ints(out, "ids", r.ids.data(), r.ids.size());
            std::copy(r.w.begin(), r.w.end(), out.add("weights", r.w.size()));
            std::copy(r.p.begin(), r.p.end(), out.add("probs", r.p.size()));
          },
          bitwise};
}

OpCase router_backward_case() {
  return {"router_backward", router_shapes(), {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const RouterShape rs = router_shape(s);
            const Routing r = routing(rs, 211 + s[0] + s[1]);
            const auto dw = values(r.w.size(), 212), extra = values(size_t(rs.E), 213);
            router_backward(out.add("dlogits", r.p.size()), dw.data(), nullptr, nullptr, r.ids.data(), r.w.data(),
                            r.p.data(), rs);
            router_backward(out.add("dlogits (with dprobs_extra)", r.p.size()), dw.data(), extra.data(), nullptr,
                            r.ids.data(), r.w.data(), r.p.data(), rs);
            std::vector<uint8_t> counted(size_t(rs.N));  // every third token padding (the attention mask's 0)
            for (size_t t = 0; t < counted.size(); ++t) counted[t] = t % 3 != 1;
            router_backward(out.add("dlogits (dprobs_extra on counted tokens)", r.p.size()), dw.data(), extra.data(),
                            counted.data(), r.ids.data(), r.w.data(), r.p.data(), rs);
          },
          bitwise};
}

// Shape {N, E, k, C}: an expert with no rows (E > A), rows spanning several copy tasks.
std::vector<Shape> moe_row_shapes() {
  // C 40 and 296: the row kernels' 16-byte packs (cuda/kernels/moe.cuh).
  return {{1, 1, 1, 1}, {7, 5, 2, 3}, {3, 16, 2, 5}, {33, 16, 8, 37}, {130, 64, 8, 300}, {33, 16, 8, 40}, {9, 8, 2, 296}};
}

struct Grouped {
  Routing r;
  std::vector<int64_t> offsets;       // [E + 1]
  std::vector<int32_t> order, row_of;  // [A], [A]
};
Grouped grouped(const Shape& s, uint64_t seed) {
  const int64_t N = s[0], E = s[1], k = s[2];
  Grouped g{routing({N, E, k, RouterKind::softmax_topk, true}, seed), std::vector<int64_t>(size_t(E + 1)),
            std::vector<int32_t>(size_t(N * k)), std::vector<int32_t>(size_t(N * k))};
  moe_permute(g.offsets.data(), g.order.data(), g.row_of.data(), g.r.ids.data(), N, k, E);
  return g;
}

OpCase moe_permute_gather_case() {
  return {"moe_permute_gather", moe_row_shapes(), {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], E = s[1], k = s[2], C = s[3], A = N * k;
            const Grouped g = grouped(s, 221 + N);
            float* off = out.add("offsets", size_t(E + 1));
            for (int64_t e = 0; e <= E; ++e) off[e] = float(g.offsets[size_t(e)]);
            add_ints(out, "order", g.order.data(), g.order.size());
            add_ints(out, "row_of", g.row_of.data(), g.row_of.size());
            const auto x = values(size_t(N * C), 222), dxp = values(size_t(A * C), 223);
            moe_gather(out.add("xp", size_t(A * C)), x.data(), g.order.data(), A, k, C);
            moe_scatter_add(out.add("dx", size_t(N * C)), dxp.data(), g.row_of.data(), N, k, C);
          },
          bitwise};
}

OpCase moe_combine_case() {
  return {"moe_combine", moe_row_shapes(), {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], k = s[2], C = s[3], A = N * k;
            const Grouped g = grouped(s, 231 + N);
            const auto yp = values(size_t(A * C), 232), dout = values(size_t(N * C), 233);
            moe_combine_forward(out.add("out", size_t(N * C)), yp.data(), g.r.w.data(), g.row_of.data(), N, k, C);
            moe_combine_backward(out.add("dyp", size_t(A * C)), out.add("dweights", size_t(A)), dout.data(), yp.data(),
                                 g.r.w.data(), g.row_of.data(), N, k, C);
          },
          bitwise};
}

// Shape {N, E, k, I, C, bias}: GPT-OSS's down projections carry a bias, Qwen's do not.
OpCase moe_weight_grads_case() {
  return {"moe_weight_grads", {{1, 1, 1, 1, 1, 1}, {7, 5, 2, 13, 3, 0}, {7, 5, 2, 13, 3, 1}, {33, 16, 8, 37, 19, 1},
                               {130, 64, 8, 129, 17, 0}},
          {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], E = s[1], k = s[2], I = s[3], C = s[4], A = N * k;
            const Grouped g = grouped({N, E, k}, 241 + N);
            const auto h = values(size_t(A * I), 242), dout = values(size_t(N * C), 243);
            const auto bias = values(size_t(E * C), 244);
            float* gr = out.add("g (scaled in place)", size_t(A * I), values(size_t(A * I), 245));
            moe_weight_grads(out.add("dweights", size_t(A)), gr, h.data(), g.r.w.data(), g.order.data(), g.r.ids.data(),
                             dout.data(), s[5] ? bias.data() : nullptr, A, k, I, C);
          },
          bitwise};
}

// Shape {N, E, k, masked}: one partial sum per expert over a call's (counted) tokens, added to running totals.
OpCase aux_loss_accumulate_case() {
  return {"aux_loss_accumulate", {{1, 1, 1, 0}, {7, 5, 2, 1}, {33, 16, 8, 0}, {130, 64, 4, 1}}, {DType::f32}, true,
          [](OpOutputs& out, const Shape& s, DType) {
            const int64_t N = s[0], E = s[1], k = s[2];
            const Routing r = routing({N, E, k, RouterKind::softmax_topk, false}, 251 + N);
            std::vector<uint8_t> counted(static_cast<size_t>(N));
            for (size_t t = 0; t < counted.size(); ++t) counted[t] = t % 4 != 2;
            std::vector<double> counts(size_t(E), 1.0), sums(size_t(E), 0.25);  // earlier layers' totals
            const int64_t rows = aux_loss_accumulate(counts.data(), sums.data(), r.ids.data(), r.p.data(),
                                                     s[3] ? counted.data() : nullptr, N, E, k);
            out.scalar("rows", double(rows));
            for (int64_t e = 0; e < E; ++e) {
              out.scalar("counts[" + std::to_string(e) + "]", counts[size_t(e)]);
              out.scalar("prob_sums[" + std::to_string(e) + "]", sums[size_t(e)]);
            }
          },
          bitwise};
}

const std::vector<OpCase>& ops() {
  static const std::vector<OpCase> all = {rmsnorm_forward_case(), rmsnorm_backward_case(), rope_case(),
                                          swiglu_case(),          embedding_case(),        head_case(),
                                          linear_case(),          attention_case(),        l2norm_case(),
                                          sigmoid_gate_case(),    short_conv_case(),       delta_gates_case(),
                                          gated_rmsnorm_case(),   router_forward_case(),   router_backward_case(),
                                          moe_permute_gather_case(), moe_combine_case(),   moe_weight_grads_case(),
                                          attention_window_sinks_case(), clamped_swiglu_case(),
                                          aux_loss_accumulate_case()};
  return all;
}

// --- the rows ---------------------------------------------------------------------------------------------------

struct Row {
  size_t op;
  OpBackend backend;
  DType dtype;
};

std::vector<Row> rows() {
  std::vector<Row> r;
  for (size_t i = 0; i < ops().size(); ++i)
    for (OpBackend b : kAllBackends) {
      if (b == OpBackend::plain || (is_cuda(b) && !ops()[i].on_cuda_sim)) continue;
      for (DType dt : ops()[i].dtypes) r.push_back({i, b, dt});
    }
  return r;
}

class OpTable : public ::testing::TestWithParam<Row> {};

TEST_P(OpTable, MatchesThePlainReference) {
  const Row row = GetParam();
  const OpCase& op = ops()[row.op];
  if (!backend_available(row.backend)) GTEST_SKIP() << backend_name(row.backend) << " is not this host's";
  for (const Shape& shape : op.shapes) {
    const std::string what = op.name + " on " + backend_name(row.backend) + ", " + std::string(dtype_name(row.dtype)) + ", shape " +
                             shape_name(shape);
    const auto want = run_on(op, OpBackend::plain, shape, row.dtype);
    const auto got = run_on(op, row.backend, shape, row.dtype);
    expect_row(got, want, op.tolerance(row.backend, row.dtype, shape), what);
    if (is_cuda_sim(row.backend) && row.backend != OpBackend::cuda_sim_forward)
      expect_same_bits(got, run_on(op, OpBackend::cuda_sim_forward, shape, row.dtype), what + " (against the forward order)");
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::ValuesIn(rows()), [](const ::testing::TestParamInfo<Row>& i) {
  return ops()[i.param.op].name + "_" + backend_name(i.param.backend) + "_" + std::string(dtype_name(i.param.dtype));
});

// The table's own honesty: one bit of one output changed fails a bitwise row, a change beyond the tolerance fails a
// toleranced one, and a float written past an output's end lands on its sentinels.
TEST(OpTable, ADifferenceOrAnOverrunFailsTheRow) {
  OpOutputs out;
  float* y = out.add("y", 5);
  for (int i = 0; i < 5; ++i) y[i] = float(i) + 0.5f;
  const auto want = out.read();
  auto moved = want;
  moved[0].values[2] = double(std::nextafter(float(moved[0].values[2]), 10.0f));  // one ulp
  auto bitwise_row = [&] { expect_row(moved, want, Tolerance::bitwise(), "y"); };
  EXPECT_NONFATAL_FAILURE(bitwise_row(), "differs from the plain reference first at element 2");
  expect_row(moved, want, Tolerance::reordered_sums(8), "y");  // one ulp of 2.5 is within 8 reordered terms
  moved[0].values[2] += 1e-3;
  auto toleranced_row = [&] { expect_row(moved, want, Tolerance::reordered_sums(8), "y"); };
  EXPECT_NONFATAL_FAILURE(toleranced_row(), "element 2 is");
  y[5] = 1.0f;  // one past the end
  auto overrun = out.read();
  EXPECT_FALSE(overrun[0].guards_intact);
  auto overrun_row = [&] { expect_row(overrun, want, Tolerance::bitwise(), "y"); };
  EXPECT_NONFATAL_FAILURE(overrun_row(), "wrote past its end");
}

}  // namespace
}  // namespace lt::testing
