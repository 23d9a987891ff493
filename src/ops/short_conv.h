// ops/short_conv.h — the short causal convolution of a Gated DeltaNet layer (HF Qwen3.5/3.6's conv1d over the
// q|k|v projection, kernel K = 4): a depthwise causal conv1d, no bias, followed by SiLU.
//
// Legend: B rows of T tokens, N = B·T, Cc channels (2·Hk·dk + Hv·dv at the call site), K kernel width.
//
//   pre[n, c] = Σ_{j=0..span(n)} w[c, K-1-j] · x[n-j, c],   out[n, c] = silu(pre[n, c])
//
// w[Cc, K] is HF's conv1d.weight [Cc, 1, K] flattened: w[c, K-1] multiplies the token itself, w[c, 0] the token
// K-1 back (F.conv1d with padding K-1, the first T outputs kept). span(n) = min(K-1, taps back to the start of
// n's document). Documents are what attention's mask and the delta rule's state reset use (model/batch.cpp's
// doc_ids [B, T]): a run of equal doc_ids inside a row; without doc_ids each row is one document. The taps
// that would reach into the previous document see zeros, as HF's left zero padding does for an unpacked row
// and FLA's cu_seqlens kernel does for packed rows (HF's torch fallback ignores packing and leaks K-1 tokens
// across documents; we never do).
// pre is summed oldest tap first (j = span .. 0, i.e. kernel index ascending) in f32.
//
// Nothing is saved: the backward recomputes pre from x and w (K multiply-adds per element, the same bits as
// the forward), which saves an [N, Cc] buffer as wide as the layer's widest activation; it needs x anyway
// for dw.
//
// Backward (silu'(p) = σ(p)(1 + p(1 - σ(p)))):
//   dpre[n, c]      = dout[n, c] · silu'(pre[n, c])
//   dx[m, c]        = Σ_{j : j <= span(m+j)} dpre[m+j, c] · w[c, K-1-j]        written
//   dw[c, K-1-j]   += Σ_{n : j <= span(n)} dpre[n, c] · x[n-j, c]             accumulated
// dw is reduced over fixed token chunks into double partials, summed in chunk order and added once in f32:
// the bits never depend on the thread count, and two calls add exactly twice one call.
#pragma once

#include <cstdint>

namespace lt {

// out[N, Cc] from x[N, Cc], weight[Cc, K], doc_ids[N] or null (each row one document). N a multiple of T.
void short_conv_forward(float* out, const float* x, const float* weight, const int32_t* doc_ids, int64_t N,
                        int64_t T, int64_t Cc, int64_t K);

// dx[N, Cc] written; dweight[Cc, K] accumulated; from dout[N, Cc] and the forward's x, weight, doc_ids. dx must
// not alias dout or x.
void short_conv_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                         const int32_t* doc_ids, int64_t N, int64_t T, int64_t Cc, int64_t K);

}  // namespace lt
