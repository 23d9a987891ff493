// Attention: the tiled online-softmax kernels against a full-matrix reference in double, finite differences,
// document masking against separate runs, fully written gradients, thread-count determinism, and every
// kernel path against the others (AVX2 and AVX-512 bitwise, each against the plain one within rounding).
//
// Legend: B batch rows, T tokens, Hq query heads, Hkv key/value heads, D head dimension, G = Hq / Hkv.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "testing/grad_check.h"

namespace lt {
namespace detail {
// The selected path's exp (std::exp on the plain path); internal to ops/cpu/attention.cpp, declared only here.
void attention_exp_for_test(float* y, const float* x, int64_t n);
}  // namespace detail

namespace {

enum class Docs : uint8_t { none, packed };

struct Case {
  int64_t B, T, Hq, Hkv, D;
  Docs docs;
  int64_t window = 0;  // sliding window (0: none)
  bool sinks = false;  // attention sinks (attention_sinks_forward / _backward around the kernels)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_Hq" + std::to_string(c.Hq) + "_Hkv" +
         std::to_string(c.Hkv) + "_D" + std::to_string(c.D) + (c.docs == Docs::packed ? "_docs" : "") +
         (c.window ? "_W" + std::to_string(c.window) : "") + (c.sinks ? "_sinks" : "");
}

struct Inputs {
  AttentionShape s;
  std::vector<float> q, k, v, dout;  // [B,T,Hq,D], [B,T,Hkv,D] x2, [B,T,Hq,D]
  std::vector<int32_t> doc;          // [B,T]; empty for plain causal
  std::vector<float> sinks;          // [Hq]; empty: none
  const int32_t* doc_ptr() const { return doc.empty() ? nullptr : doc.data(); }
};

// q in [-3, 3) so scaled scores have a standard deviation near 1 and the softmax is far from uniform.
// Packed documents: segments of 1..40 tokens with ids drawn from {0..3}, so neighbours may share an id and
// ids are not sorted (the kernel may assume neither).
Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.s = {c.B, c.T, c.Hq, c.Hkv, c.D, c.window};
  // Sinks in [-1, 3): from a small share of a row's mass to most of it (released GPT-OSS sinks span about that).
  if (c.sinks) in.sinks = testing::random_vector(size_t(c.Hq), seed + 5, -1.f, 3.f);
  const size_t nq = size_t(c.B * c.T * c.Hq * c.D), nkv = size_t(c.B * c.T * c.Hkv * c.D);
  in.q = testing::random_vector(nq, seed, -3.f, 3.f);
  in.k = testing::random_vector(nkv, seed + 1);
  in.v = testing::random_vector(nkv, seed + 2);
  in.dout = testing::random_vector(nq, seed + 3);
  if (c.docs == Docs::packed) {
    Rng rng(seed + 4);
    in.doc.resize(size_t(c.B * c.T));
    for (int64_t b = 0; b < c.B; ++b) {
      int64_t left = 0;
      int32_t id = 0;
      for (int64_t t = 0; t < c.T; ++t, --left) {
        if (left == 0) {
          left = 1 + int64_t(rng.below(40));
          id = int32_t(rng.below(4));
        }
        in.doc[size_t(b * c.T + t)] = id;
      }
    }
  }
  return in;
}

// Everything a forward + backward produces.
struct Result {
  std::vector<float> out, lse, dq, dk, dv, dsinks;
};

// Gradients start as NaN so an element the backward forgets to write shows up.
Result run(const Inputs& in) {
  const AttentionShape& s = in.s;
  Result r;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  r.out.assign(in.q.size(), nan);
  r.lse.assign(size_t(s.B * s.Hq * s.T), nan);
  r.dq.assign(in.q.size(), nan);
  r.dk.assign(in.k.size(), nan);
  r.dv.assign(in.v.size(), nan);
  attention_forward(r.out.data(), r.lse.data(), in.q.data(), in.k.data(), in.v.data(), in.doc_ptr(), s);
  if (!in.sinks.empty()) attention_sinks_forward(r.out.data(), r.lse.data(), in.sinks.data(), s);
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), in.dout.data(), r.out.data(), r.lse.data(),
                     in.q.data(), in.k.data(), in.v.data(), in.doc_ptr(), s);
  if (!in.sinks.empty()) {
    r.dsinks.assign(in.sinks.size(), nan);
    attention_sinks_backward(r.dsinks.data(), in.dout.data(), r.out.data(), r.lse.data(), in.sinks.data(), s);
  }
  return r;
}

// The forward alone (out, and lse into `lse`), sinks applied when the inputs have them.
void forward(std::vector<float>& out, std::vector<float>& lse, const Inputs& in) {
  attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), in.doc_ptr(), in.s);
  if (!in.sinks.empty()) attention_sinks_forward(out.data(), lse.data(), in.sinks.data(), in.s);
}

// The specification: full softmax rows in double, forward and backward; a sink is one more logit column of the
// row's softmax whose probability is dropped (transformers' GPT-OSS eager attention).
struct Reference {
  std::vector<double> out, lse, dq, dk, dv, dsinks;
};

Reference reference(const Inputs& in) {
  const AttentionShape& s = in.s;
  const int64_t G = s.Hq / s.Hkv, D = s.D;
  const double scale = 1.0 / std::sqrt(double(D));
  Reference r;
  r.out.assign(in.q.size(), 0.0);
  r.lse.assign(size_t(s.B * s.Hq * s.T), 0.0);
  r.dq.assign(in.q.size(), 0.0);
  r.dk.assign(in.k.size(), 0.0);
  r.dv.assign(in.v.size(), 0.0);
  r.dsinks.assign(in.sinks.size(), 0.0);
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return size_t(((b * s.T + t) * s.Hq + h) * D); };
  auto ki = [&](int64_t b, int64_t t, int64_t g) { return size_t(((b * s.T + t) * s.Hkv + g) * D); };
  std::vector<double> p(size_t(s.T)), dp(size_t(s.T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t g = h / G;
      for (int64_t i = 0; i < s.T; ++i) {
        auto allowed = [&](int64_t j) {
          return j <= i && (s.window == 0 || j > i - s.window) &&
                 (in.doc.empty() || in.doc[size_t(b * s.T + j)] == in.doc[size_t(b * s.T + i)]);
        };
        const double sink = in.sinks.empty() ? -INFINITY : double(in.sinks[size_t(h)]);
        double m = sink;
        for (int64_t j = 0; j <= i; ++j) {
          if (!allowed(j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(in.q[qi(b, i, h) + d]) * double(in.k[ki(b, j, g) + d]);
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        double sum = in.sinks.empty() ? 0.0 : std::exp(sink - m);
        for (int64_t j = 0; j <= i; ++j)
          if (allowed(j)) sum += (p[j] = std::exp(p[j] - m));
        r.lse[size_t((b * s.Hq + h) * s.T + i)] = m + std::log(sum);
        double Di = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (!allowed(j)) continue;
          p[j] /= sum;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.out[qi(b, i, h) + d] += p[j] * in.v[ki(b, j, g) + d];
            dot += double(in.dout[qi(b, i, h) + d]) * double(in.v[ki(b, j, g) + d]);
          }
          dp[j] = dot;
          Di += p[j] * dot;  // = rowsum(dO ∘ O)
        }
        // The sink's column: its dP is 0, so its logit's gradient is p_sink · (0 − Di).
        if (!in.sinks.empty()) r.dsinks[size_t(h)] -= std::exp(sink - m) / sum * Di;
        for (int64_t j = 0; j <= i; ++j) {
          if (!allowed(j)) continue;
          const double ds = p[j] * (dp[j] - Di);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi(b, i, h) + d] += scale * ds * in.k[ki(b, j, g) + d];
            r.dk[ki(b, j, g) + d] += scale * ds * in.q[qi(b, i, h) + d];
            r.dv[ki(b, j, g) + d] += p[j] * in.dout[qi(b, i, h) + d];
          }
        }
      }
    }
  return r;
}

// max |a - r| / max |r|: the worst element error relative to the tensor's scale. The scale is floored at
// 0.1, the size of these outputs and gradients of O(1) inputs, so that a gradient that is exactly zero in
// exact arithmetic (T = 1: one key, so dS = P(dP - Di) = 0) compares its f32 cancellation noise (~3e-7)
// with 0.1 rather than with 0.
double max_error(const std::vector<float>& a, const std::vector<double>& r) {
  double err = 0, scale = 0.1;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(double(a[i]) - r[i]));
    scale = std::max(scale, std::fabs(r[i]));
  }
  return err / scale;
}

double max_error(const std::vector<float>& a, const std::vector<float>& b) {
  return max_error(a, std::vector<double>(b.begin(), b.end()));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool all_finite(const std::vector<float>& x) {
  for (float e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

// Runs fn(level) once per kernel path this CPU has: AVX-512 and AVX2 (with FMA) where present, and always
// the plain one. The kernels pick their path from cpu_features(), which each run overrides.
template <typename Fn>
void for_each_path(Fn fn) {
  const CpuFeatures probed = cpu_features();
  struct Path {
    IsaLevel level;
    CpuFeatures features;
  };
  std::vector<Path> paths;
  if (probed.avx512f) paths.push_back({IsaLevel::avx512, probed});
  if (probed.avx2 && probed.fma) paths.push_back({IsaLevel::avx2, cap_features(probed, IsaLevel::avx2)});
  paths.push_back({IsaLevel::plain, CpuFeatures{}});
  struct Restore {
    ~Restore() { cpu_features_override(nullptr); }
  } restore;
  for (const Path& p : paths) {
    SCOPED_TRACE(std::string(isa_name(p.level)) + " path");
    cpu_features_override(&p.features);
    fn(p.level);
  }
}

class Attention : public ::testing::TestWithParam<Case> {};

TEST_P(Attention, MatchesDoubleReference) {
  const Inputs in = make_inputs(GetParam(), 11);
  const Reference ref = reference(in);
  for_each_path([&](IsaLevel) {
    const Result r = run(in);
    // f32 error sources: the D-term score dot products and the T-term softmax and value sums (each
    // ~sqrt(n)·6e-8 relative), exp within 1 ulp, lse = m + log(l). Measured <= 4.2e-7 of scale over these
    // shapes on both paths; bound 5e-6 (10x). A wrong mask, scale or tile edge shows up at 1e-2 or more.
    EXPECT_LT(max_error(r.out, ref.out), 5e-6) << "out";
    EXPECT_LT(max_error(r.lse, ref.lse), 5e-6) << "lse";
    // The backward adds dP = dO·Vᵀ, the cancellation in dP - Di, and sums of up to G·T terms per dK/dV
    // element. Measured <= 1.2e-6 (T = 1, whose exact dq and dk are 0, shows its cancellation noise:
    // ~3e-7 / the 0.1 floor = 3e-6); bound 1e-5.
    EXPECT_LT(max_error(r.dq, ref.dq), 1e-5) << "dq";
    EXPECT_LT(max_error(r.dk, ref.dk), 1e-5) << "dk";
    EXPECT_LT(max_error(r.dv, ref.dv), 1e-5) << "dv";
    // Σ over B·T rows of p_sink·Di, in double from the f32 out and lse: the rows' f32 errors (~1e-6) averaged.
    if (!in.sinks.empty()) {
      EXPECT_LT(max_error(r.dsinks, ref.dsinks), 1e-5) << "dsinks";
    }
  });
}

TEST_P(Attention, GradientsMatchFiniteDifferences) {
  Inputs in = make_inputs(GetParam(), 21);
  const AttentionShape s = in.s;
  // loss = dot(out, w) in double, so dL/dout = w.
  in.dout = testing::random_vector(in.q.size(), 22);
  const Result r = run(in);
  std::vector<float> out(in.q.size()), lse(size_t(s.B * s.Hq * s.T));
  auto loss = [&] {
    forward(out, lse, in);
    return testing::dot(out, in.dout);
  };
  // Central differences with h = 1e-2 in f32. Truncation: h²|f'''|/6 ~ 2e-5 relative. Rounding: a probe
  // changes only the outputs it feeds (the others are bit-identical and cancel), up to G·T·D of them for a
  // key, each with ~6e-8 relative error: ~sqrt(8·130·64)·6e-8·|w| / 2h ~ 1e-4 absolute, up to 1e-2
  // relative against grad_check's 1e-2 floor. Measured <= 5e-3 over these shapes; bound 2e-2. A missing
  // term (mask, scale, GQA sum) is an O(1) relative error.
  const double bound = 2e-2;
  EXPECT_GRAD_OK(testing::grad_check(in.q, r.dq, loss, 31), bound, "dq");
  EXPECT_GRAD_OK(testing::grad_check(in.k, r.dk, loss, 32), bound, "dk");
  EXPECT_GRAD_OK(testing::grad_check(in.v, r.dv, loss, 33), bound, "dv");
  if (!in.sinks.empty()) {
    EXPECT_GRAD_OK(testing::grad_check(in.sinks, r.dsinks, loss, 34), bound, "dsinks");
  }
}

TEST_P(Attention, WritesEveryOutputAndGradient) {
  const Inputs in = make_inputs(GetParam(), 41);
  for_each_path([&](IsaLevel) {
    const Result r = run(in);  // every output starts as NaN
    EXPECT_TRUE(all_finite(r.out));
    EXPECT_TRUE(all_finite(r.lse));
    EXPECT_TRUE(all_finite(r.dq));
    EXPECT_TRUE(all_finite(r.dk));
    EXPECT_TRUE(all_finite(r.dv));
    EXPECT_TRUE(all_finite(r.dsinks));
  });
}

TEST_P(Attention, BitsIndependentOfThreadCount) {
  const Inputs in = make_inputs(GetParam(), 51);
  const int saved = num_threads();
  for_each_path([&](IsaLevel) {
    set_num_threads(1);
    const Result one = run(in);
    set_num_threads(2);
    const Result two = run(in);
    set_num_threads(saved);
    EXPECT_TRUE(same_bits(one.out, two.out)) << "out";
    EXPECT_TRUE(same_bits(one.lse, two.lse)) << "lse";
    EXPECT_TRUE(same_bits(one.dq, two.dq)) << "dq";
    EXPECT_TRUE(same_bits(one.dk, two.dk)) << "dk";
    EXPECT_TRUE(same_bits(one.dv, two.dv)) << "dv";
    EXPECT_TRUE(same_bits(one.dsinks, two.dsinks)) << "dsinks";
  });
}

// Every path this CPU has: AVX2 and AVX-512 compute the same bits (same FMA order, exp and reduction
// trees), and each vector path matches the plain one within rounding.
TEST_P(Attention, KernelPathsAgree) {
  const Inputs in = make_inputs(GetParam(), 61);
  std::map<IsaLevel, Result> by_path;
  for_each_path([&](IsaLevel level) { by_path[level] = run(in); });
  const Result& slow = by_path.at(IsaLevel::plain);
  for (IsaLevel level : {IsaLevel::avx2, IsaLevel::avx512}) {
    if (!by_path.count(level)) continue;  // the CPU lacks it
    SCOPED_TRACE(std::string(isa_name(level)) + " vs plain");
    const Result& fast = by_path.at(level);
    // Same tiles and order; only FMA contraction, vector sum order and exp (<= 1 ulp vs std::exp's 0.5)
    // differ. Measured <= 5.2e-7 (T = 1's zero gradients: 3.6e-6 against the 0.1 floor); bound 1e-5.
    EXPECT_LT(max_error(fast.out, slow.out), 1e-5) << "out";
    EXPECT_LT(max_error(fast.lse, slow.lse), 1e-5) << "lse";
    EXPECT_LT(max_error(fast.dq, slow.dq), 1e-5) << "dq";
    EXPECT_LT(max_error(fast.dk, slow.dk), 1e-5) << "dk";
    EXPECT_LT(max_error(fast.dv, slow.dv), 1e-5) << "dv";
  }
  if (by_path.count(IsaLevel::avx2) && by_path.count(IsaLevel::avx512)) {
    const Result &a = by_path.at(IsaLevel::avx2), &b = by_path.at(IsaLevel::avx512);
    EXPECT_TRUE(same_bits(a.out, b.out)) << "out";
    EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse";
    EXPECT_TRUE(same_bits(a.dq, b.dq)) << "dq";
    EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dk";
    EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dv";
  }
}

// T = 1 (one token), 37 (one partial tile), 70 and 130 (two and three tiles, the last partial); D = 16,
// 40 (a masked vector tail), 64, 128 (two column blocks); GQA 6:2 and 4:2, MHA 4:4, MQA 8:1. T = 75 with
// D = 36 gives the AVX2 GEMM partial 16-column blocks of both kinds (11 = 8 + 3 keys, 36 = 16 + 16 + 4).
INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(Case{2, 37, 6, 2, 16, Docs::none}, Case{2, 1, 4, 4, 64, Docs::none},
                                           Case{1, 75, 4, 2, 36, Docs::none},
                                           Case{2, 130, 8, 1, 64, Docs::none}, Case{2, 130, 6, 2, 16, Docs::none},
                                           Case{2, 37, 4, 4, 64, Docs::none}, Case{1, 130, 4, 4, 40, Docs::none},
                                           Case{1, 70, 4, 2, 128, Docs::none},
                                           Case{2, 130, 6, 2, 16, Docs::packed},
                                           Case{2, 130, 8, 1, 64, Docs::packed},
                                           Case{2, 37, 4, 4, 40, Docs::packed},
                                           // Sliding windows (GPT-OSS: 128): inside one tile, a tile and a bit,
                                           // wider than a row, and with documents; tiles wholly left behind skip.
                                           Case{2, 130, 6, 2, 16, Docs::none, 5},
                                           Case{1, 200, 4, 2, 40, Docs::none, 70},
                                           Case{1, 37, 4, 4, 16, Docs::none, 64},
                                           Case{2, 130, 8, 1, 64, Docs::packed, 17},
                                           // Sinks, alone and with a window.
                                           Case{2, 37, 6, 2, 16, Docs::none, 0, true},
                                           Case{1, 130, 4, 4, 40, Docs::packed, 0, true},
                                           Case{2, 130, 8, 2, 64, Docs::none, 64, true}),
                         case_name);

// One row packing document A (tokens [0, nA)) and document B (the rest) equals running each alone.
// Document A starts where a lone run starts, so its tiles hold the same values plus keys the mask turns
// into exact zeros of P: out, lse and all gradients are bitwise equal. Document B's tiles start at a
// different offset, which regroups the online-softmax and gradient sums: equal within f32 reordering
// (measured <= 2.8e-7 of scale; bound 2e-6).
TEST(AttentionDocs, PackedDocumentsEqualSeparateRuns) {
  struct Packing {
    int64_t nA, nB, Hq, Hkv, D;
  };
  // 70 + 130: the last query tiles see only document B, so whole key tiles of document A are skipped.
  for (const Packing& pk : {Packing{57, 73, 6, 2, 16}, Packing{70, 130, 8, 1, 64}}) {
    SCOPED_TRACE("nA=" + std::to_string(pk.nA) + " nB=" + std::to_string(pk.nB));
    const int64_t T = pk.nA + pk.nB;
    Inputs packed = make_inputs(Case{1, T, pk.Hq, pk.Hkv, pk.D, Docs::none}, 71);
    packed.doc.assign(size_t(T), 9);  // ids need only be equal within a document
    for (int64_t t = pk.nA; t < T; ++t) packed.doc[size_t(t)] = 4;
    // Token ranges of the packed row as separate one-document rows (doc_ids nullptr).
    auto slice = [&](int64_t t0, int64_t n) {
      Inputs one;
      one.s = {1, n, pk.Hq, pk.Hkv, pk.D};
      const int64_t qw = pk.Hq * pk.D, kw = pk.Hkv * pk.D;
      one.q.assign(packed.q.begin() + t0 * qw, packed.q.begin() + (t0 + n) * qw);
      one.dout.assign(packed.dout.begin() + t0 * qw, packed.dout.begin() + (t0 + n) * qw);
      one.k.assign(packed.k.begin() + t0 * kw, packed.k.begin() + (t0 + n) * kw);
      one.v.assign(packed.v.begin() + t0 * kw, packed.v.begin() + (t0 + n) * kw);
      return one;
    };
    // The same token range of a packed result ([T, H*D] rows, lse [H, T]).
    auto rows = [](const std::vector<float>& x, int64_t width, int64_t t0, int64_t n) {
      return std::vector<float>(x.begin() + t0 * width, x.begin() + (t0 + n) * width);
    };
    auto lse_rows = [&](const std::vector<float>& lse, int64_t t0, int64_t n) {
      std::vector<float> r;
      for (int64_t h = 0; h < pk.Hq; ++h) r.insert(r.end(), lse.begin() + h * T + t0, lse.begin() + h * T + t0 + n);
      return r;
    };
    for_each_path([&](IsaLevel) {
      const Result all = run(packed);
      const Result a = run(slice(0, pk.nA)), b = run(slice(pk.nA, pk.nB));
      const int64_t qw = pk.Hq * pk.D, kw = pk.Hkv * pk.D;
      EXPECT_TRUE(same_bits(rows(all.out, qw, 0, pk.nA), a.out)) << "out";
      EXPECT_TRUE(same_bits(lse_rows(all.lse, 0, pk.nA), a.lse)) << "lse";
      EXPECT_TRUE(same_bits(rows(all.dq, qw, 0, pk.nA), a.dq)) << "dq";
      EXPECT_TRUE(same_bits(rows(all.dk, kw, 0, pk.nA), a.dk)) << "dk";
      EXPECT_TRUE(same_bits(rows(all.dv, kw, 0, pk.nA), a.dv)) << "dv";
      EXPECT_LT(max_error(rows(all.out, qw, pk.nA, pk.nB), b.out), 2e-6) << "out";
      EXPECT_LT(max_error(lse_rows(all.lse, pk.nA, pk.nB), b.lse), 2e-6) << "lse";
      EXPECT_LT(max_error(rows(all.dq, qw, pk.nA, pk.nB), b.dq), 2e-6) << "dq";
      EXPECT_LT(max_error(rows(all.dk, kw, pk.nA, pk.nB), b.dk), 2e-6) << "dk";
      EXPECT_LT(max_error(rows(all.dv, kw, pk.nA, pk.nB), b.dv), 2e-6) << "dv";
    });
  }
}

// Each path's exp against std::exp over the softmax's domain (x <= 0, down to underflow), plus the edges.
TEST(AttentionExp, MatchesStdExp) {
  std::vector<float> x;
  for (double t = -90.0; t <= 1.0; t += 1.0 / 4096) x.push_back(float(t));
  for (float e : {0.f, -0.f, -1e-30f, -1e-7f, 1e-7f, -87.3f, -87.34f, -88.f, -1e30f}) x.push_back(e);
  x.push_back(-std::numeric_limits<float>::infinity());
  for_each_path([&](IsaLevel) {
    std::vector<float> y(x.size());
    detail::attention_exp_for_test(y.data(), x.data(), int64_t(x.size()));
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(double(x[i]));
      if (want < 1.1754944e-38) {  // below FLT_MIN the vector exp flushes to 0 (these feed sums of >= 1)
        ASSERT_LE(double(y[i]), 1.2e-38) << "x = " << x[i];
        continue;
      }
      worst = std::max(worst, std::fabs(double(y[i]) - want) / want);
    }
    // Cody-Waite reduction plus a degree-7 polynomial: measured 8.3e-8 (0.7 ulp of 2^-23 = 1.19e-7);
    // bound 2 ulp.
    EXPECT_LT(worst, 2.4e-7);
    EXPECT_EQ(y[x.size() - 1], 0.f) << "exp(-inf)";
    std::vector<float> nan_in{std::numeric_limits<float>::quiet_NaN()}, nan_out(1);
    detail::attention_exp_for_test(nan_out.data(), nan_in.data(), 1);
    EXPECT_TRUE(std::isnan(nan_out[0])) << "NaN propagates";
  });
}

// The AVX2 exp gives the AVX-512 one's bits for every input class: a dense sweep over the whole clamped
// range [-90, 90] (both clamp ends, where 2^n is 2^-126 and 2^127, and the underflow flush), random bit
// patterns (huge, tiny, subnormal, ±inf, NaN payloads), and an odd length so the tail masks run.
TEST(AttentionExp, Avx2MatchesAvx512Bitwise) {
  const CpuFeatures probed = cpu_features();
  if (!probed.avx512f || !(probed.avx2 && probed.fma)) GTEST_SKIP() << "needs both AVX-512 and AVX2 on this CPU";
  std::vector<float> x;
  for (double t = -90.0; t <= 90.0; t += 1.0 / 1024) x.push_back(float(t));
  for (float e : {-87.33654f, std::nextafter(-87.33654f, 0.f), std::nextafter(-87.33654f, -100.f), 88.37626f,
                  std::nextafter(88.37626f, 0.f), 88.7f, 89.f, 1e30f, -1e30f, 0.f, -0.f})
    x.push_back(e);
  Rng rng(81);
  for (int i = 0; i < 100003; ++i) {
    const uint32_t b = uint32_t(rng.next_u64());
    float f;
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  std::vector<float> y512(x.size()), y2(x.size());
  detail::attention_exp_for_test(y512.data(), x.data(), int64_t(x.size()));
  const CpuFeatures avx2 = cap_features(probed, IsaLevel::avx2);
  cpu_features_override(&avx2);
  detail::attention_exp_for_test(y2.data(), x.data(), int64_t(x.size()));
  cpu_features_override(nullptr);
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &y2[i], 4);
    std::memcpy(&b, &y512[i], 4);
    ASSERT_EQ(a, b) << "x = " << x[i] << " (element " << i << ")";
  }
}

TEST(AttentionShapes, RejectsBadGrouping) {
  std::vector<float> buf(64);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), nullptr,
                                 AttentionShape{1, 2, 3, 2, 4}),
               Error);
}

}  // namespace
}  // namespace lt
