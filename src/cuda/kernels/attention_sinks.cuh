// cuda/kernels/attention_sinks.cuh — GPT-OSS's attention sinks (ops/attention.h) as kernels with the CPU ops'
// arithmetic: attention_sinks_forward rescales a stored f32 output and its lse in place (one thread per row; the
// attention kernels also apply it in their epilogue, attention_common.cuh's with_sink), attention_sinks_backward
// gives dsinks[h] = −Σ_rows exp(sink_h − lse'_row) · (dO · O)_row, one thread per head summing its rows in the CPU
// op's (b, t) order in double — the CPU op's bits.
#pragma once

#include "cuda/kernels/attention_common.cuh"

namespace lt::cuda::LT_KERNELS_NS {

__global__ void attention_sinks_forward_kernel(float* out, float* lse, const float* sinks, AttentionShape s) {
  const int64_t rows = s.B * s.Hq * s.T;
  for (int64_t row = global_thread(); row < rows; row += grid_threads()) {  // row = (b·Hq + h)·T + t, as lse
    const int64_t t = row % s.T, h = (row / s.T) % s.Hq, b = row / (s.T * s.Hq);
    const SinkRow sr = with_sink(lse[row], sinks[h]);
    float* o = out + head_row(b, t, h, s.T, s.Hq, s.D);
    for (int64_t d = 0; d < s.D; ++d) o[d] *= sr.keep;
    lse[row] = sr.lse;
  }
}

template <class T>
__global__ void attention_sinks_backward_kernel(float* dsinks, const float* dout, const T* out, const float* lse,
                                                const float* sinks, AttentionShape s) {
  const int64_t h = global_thread();
  if (h >= s.Hq) return;
  double acc = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t) {
      const double p_sink = ::exp(double(sinks[h]) - double(lse[(b * s.Hq + h) * s.T + t]));
      const int64_t at = head_row(b, t, h, s.T, s.Hq, s.D);
      double dot = 0;
      for (int64_t d = 0; d < s.D; ++d) dot += double(dout[at + d]) * double(load(out + at + d));
      acc += p_sink * dot;
    }
  dsinks[h] = float(-acc);
}

void attention_sinks_forward(Stream st, float* out, float* lse, const float* sinks, AttentionShape s) {
  const int64_t rows = s.B * s.Hq * s.T;
  if (rows > 0)
    LT_LAUNCH(attention_sinks_forward_kernel, dim3(elementwise_blocks(rows)), dim3(kElementwiseThreads), 0,
              native_stream(st), out, lse, sinks, s);
}
void attention_sinks_backward(Stream st, float* dsinks, const float* dout, const float* out, const float* lse,
                              const float* sinks, AttentionShape s) {
  LT_LAUNCH(attention_sinks_backward_kernel<float>, dim3(unsigned((s.Hq + 127) / 128)), dim3(128), 0,
            native_stream(st), dsinks, dout, out, lse, sinks, s);
}
void attention_sinks_backward(Stream st, float* dsinks, const float* dout, const bf16_t* out, const float* lse,
                              const float* sinks, AttentionShape s) {
  LT_LAUNCH(attention_sinks_backward_kernel<bf16>, dim3(unsigned((s.Hq + 127) / 128)), dim3(128), 0,
            native_stream(st), dsinks, dout, dev(out), lse, sinks, s);
}

}  // namespace lt::cuda::LT_KERNELS_NS
