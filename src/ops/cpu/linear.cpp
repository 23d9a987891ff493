// ops/cpu/linear.cpp — nn.Linear forward/backward on ops/gemm.h.
//
// Legend: N tokens, in_f / out_f the input and output features (C, I, Hq·D, ... at the call sites).
//
// bf16 mode (W.dtype == bf16): the activation operand of each GEMM (in, dout) is rounded to bf16 into a
// thread-local scratch buffer, the GEMM multiplies bf16 x bf16 exactly and accumulates in f32. dW is the
// f32 master gradient (Accumulate::yes). The bias add and the bias gradient are not GEMMs and stay f32 on
// the unrounded dout.
//
// Determinism: the GEMMs are deterministic (ops/gemm.h); the bias gradient is parallel over fixed column
// blocks, each summing its columns over the rows in row order in double, so its bits never depend on the
// thread count. dW and dbias add one token slice (kTokenSlice) at a time, so they do not depend on how a
// caller splits the tokens at slice boundaries either.
#include "ops/linear.h"
#include "ops/override.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/gemm.h"

namespace lt {

const float* WeightRef::f32() const {
  LT_CHECK(dtype == DType::f32, "weight is {}, but its f32 data was asked for", dtype_name(dtype));
  return static_cast<const float*>(data);
}

const bf16_t* WeightRef::bf16() const {
  LT_CHECK(dtype == DType::bf16, "weight is {}, but its bf16 data was asked for", dtype_name(dtype));
  return static_cast<const bf16_t*>(data);
}

namespace {

constexpr int64_t kRowChunk = 64;                   // rows per bias-add task
constexpr int64_t kColChunk = 256;                  // columns per bias-grad task

void check_sizes(const void* W, int64_t N, int64_t in_f, int64_t out_f) {
  LT_CHECK(W != nullptr, "linear: weight data is null");
  LT_CHECK(N >= 0 && in_f > 0 && out_f > 0, "linear: bad sizes N={}, in_f={}, out_f={}", N, in_f, out_f);
}

// Rounds src[n] to bf16 into a scratch buffer owned by this thread (slot 0 or 1, so backward can hold two).
const bf16_t* to_bf16_scratch(const float* src, int64_t n, int slot) {
  thread_local std::vector<bf16_t> scratch[2];
  std::vector<bf16_t>& buf = scratch[slot];
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  parallel_convert_from_f32(buf.data(), DType::bf16, src, size_t(n));
  return buf.data();
}

}  // namespace

void linear_forward(float* out, const float* in, WeightRef W, const float* bias, int64_t N, int64_t in_f,
                    int64_t out_f) {
  check_sizes(W.data, N, in_f, out_f);
  LT_OPS_OVERRIDE(linear_forward, out, in, W, bias, N, in_f, out_f);
  // out[N, out_f] = in[N, in_f] · W[out_f, in_f]ᵀ
  if (W.dtype == DType::bf16) {
    const bf16_t* in_b = to_bf16_scratch(in, N * in_f, 0);
    gemm_bf16(Trans::no, Trans::yes, N, out_f, in_f, in_b, in_f, W.bf16(), in_f, out, out_f, Accumulate::no);
  } else {
    gemm_f32(Trans::no, Trans::yes, N, out_f, in_f, in, in_f, W.f32(), in_f, out, out_f, Accumulate::no);
  }
  if (bias == nullptr) return;
  parallel_chunks(N, kRowChunk, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      float* o = out + n * out_f;
      for (int64_t j = 0; j < out_f; ++j) o[j] += bias[j];
    }
  });
}

void linear_backward(float* din, float* dW, float* dbias, const float* dout, const float* in, WeightRef W,
                     int64_t N, int64_t in_f, int64_t out_f) {
  check_sizes(W.data, N, in_f, out_f);
  LT_OPS_OVERRIDE(linear_backward, din, dW, dbias, dout, in, W, N, in_f, out_f);
  if (W.dtype == DType::bf16) {
    const bf16_t* dout_b = to_bf16_scratch(dout, N * out_f, 0);
    // din[N, in_f] = dout[N, out_f] · W[out_f, in_f]
    if (din != nullptr)
      gemm_bf16(Trans::no, Trans::no, N, in_f, out_f, dout_b, out_f, W.bf16(), in_f, din, in_f, Accumulate::no);
    // dW[out_f, in_f] += dout[t, out_f]ᵀ · in[t, in_f] for each token slice t (none for a frozen weight)
    const bf16_t* in_b = dW ? to_bf16_scratch(in, N * in_f, 1) : nullptr;
    for (int64_t t0 = 0; dW && t0 < N; t0 += kTokenSlice)
      gemm_bf16(Trans::yes, Trans::no, out_f, in_f, std::min(kTokenSlice, N - t0), dout_b + t0 * out_f, out_f,
                in_b + t0 * in_f, in_f, dW, in_f, Accumulate::yes);
  } else {
    if (din != nullptr)
      gemm_f32(Trans::no, Trans::no, N, in_f, out_f, dout, out_f, W.f32(), in_f, din, in_f, Accumulate::no);
    for (int64_t t0 = 0; dW && t0 < N; t0 += kTokenSlice)
      gemm_f32(Trans::yes, Trans::no, out_f, in_f, std::min(kTokenSlice, N - t0), dout + t0 * out_f, out_f,
               in + t0 * in_f, in_f, dW, in_f, Accumulate::yes);
  }
  if (dbias == nullptr) return;
  // dbias[out_f] += Σ_rows dout: each task owns columns [c0, c1) and walks the rows in order, so the rows
  // are read contiguously and the sum order is fixed; one f32 add per token slice.
  parallel_chunks(out_f, kColChunk, [&](int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    for (int64_t t0 = 0; t0 < N; t0 += kTokenSlice) {
      double acc[kColChunk] = {};
      for (int64_t n = t0; n < std::min(N, t0 + kTokenSlice); ++n) {
        const float* g = dout + n * out_f + c0;
        for (int64_t j = 0; j < w; ++j) acc[j] += double(g[j]);
      }
      for (int64_t j = 0; j < w; ++j) dbias[c0 + j] += float(acc[j]);
    }
  });
}

void linear_backward_input(float* din, const float* dout, WeightRef W, int64_t N, int64_t in_f, int64_t out_f) {
  check_sizes(W.data, N, in_f, out_f);
  if (W.dtype == DType::bf16)
    gemm_bf16(Trans::no, Trans::no, N, in_f, out_f, to_bf16_scratch(dout, N * out_f, 0), out_f, W.bf16(), in_f, din,
              in_f, Accumulate::no);
  else
    gemm_f32(Trans::no, Trans::no, N, in_f, out_f, dout, out_f, W.f32(), in_f, din, in_f, Accumulate::no);
}

}  // namespace lt
