// optim/clip.h — gradient accumulation with the norm gathered in the same pass, and global-norm clipping.
//
// Gradients arrive per slab (backward runs layer by layer) and are added into the f32 host gradients by
// accumulate_grad, which returns that range's Σ g² (in double, after the addition) at no extra pass. The
// executor keeps each slab's latest partial in GradNormPartials; once backward ends, the global norm is
// sqrt(Σ partials) and the clip coefficient min(1, max_norm / (norm + 1e-6)) (torch.nn.utils.
// clip_grad_norm_) is handed to the fused update, which scales g inside the AdamW pass. So clipping costs
// neither a norm pass nor a scaling pass over the gradients.
//
// Determinism: every sum uses a fixed partition (32768-element chunks, 16 lanes each, a fixed lane tree,
// chunks in order; slabs in the order embedding, layers 0..L-1, head), so the norm's bits depend neither on
// the thread count nor on the vector path.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/layout.h"

namespace lt {

enum class GradMode : uint8_t {
  add,        // dst += src: the gradient contract for parameter gradients
  overwrite,  // dst = src: the first micro-batch of a step, which saves zeroing the gradients
};

// dst[0, n) (+)= src[0, n); returns Σ dst² over the range after the update, in double. Parallel over fixed
// chunks (core/parallel.h). A non-finite value in src makes the result non-finite, which skips the step.
double accumulate_grad(float* dst, const float* src, int64_t n, GradMode mode = GradMode::add);
double accumulate_grad(float* dst, const bf16_t* src, int64_t n, GradMode mode = GradMode::add);

// A whole slab: src is laid out by src_layout (the f32 layout, or a compute-copy layout whose matrices are
// bf16), dst by dst_layout (f32); entries matched by position. Returns the slab's Σ g², entries in order.
double accumulate_grad_slab(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                            const SlabLayout& src_layout, GradMode mode = GradMode::add);

// The work of accumulate_grad_slab, chunk by chunk: tensor `entry`'s elements [begin, begin + len), len at most
// kAccumulateChunk. A slab's chunks (every entry's, in order) partition it; data-parallel ranks (dist/) each
// accumulate a contiguous run of them and combine their partial sums in this order, which gives the one-process
// result bit for bit.
struct GradChunk {
  size_t entry;
  int64_t begin, len;
};
// The chunks of a slab accumulated from src_layout into dst_layout (checked as accumulate_grad_slab checks them).
std::vector<GradChunk> grad_chunks(const SlabLayout& dst_layout, const SlabLayout& src_layout);
// accumulate_grad_slab over chunks [first, last) of `chunks` only; partial[k - first] receives chunk k's Σ dst².
void accumulate_grad_chunks(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                            const SlabLayout& src_layout, const std::vector<GradChunk>& chunks, size_t first,
                            size_t last, GradMode mode, double* partial);
// The same with chunks [first, last)'s source data back to back in `packed` (each chunk's elements in its
// src_layout dtype), as a data-parallel owner receives them (dist/grad_exchange.h).
void accumulate_grad_packed(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* packed,
                            const SlabLayout& src_layout, const std::vector<GradChunk>& chunks, size_t first,
                            size_t last, GradMode mode, double* partial);
// The slab's Σ g² from every chunk's partial: each entry's chunks in order, then the entries in order.
double combine_grad_chunks(const std::vector<GradChunk>& chunks, const double* partial);

// The Σ g² accumulate_grad_slab(slab, layout, slab, layout, GradMode::overwrite) returns, read-only: for
// gradients copied straight into their place (the executor's overwrite mode), bit for bit the same sum.
double grad_slab_sum_of_squares(const uint8_t* slab, const SlabLayout& layout);

// Σ x² in double over fixed chunks (kAccumulateChunk elements, each summed in order by
// grad_chunk_sum_of_squares) combined in order, starting from 0: the embedding gradient's partial norm (it
// arrives by scatter-add, not through accumulate_grad). Deterministic whatever the thread count.
double grad_sum_of_squares(const float* x, int64_t n);
// One chunk of it (n <= kAccumulateChunk): a data-parallel owner of some of the table's chunks sums its own.
double grad_chunk_sum_of_squares(const float* x, int64_t n);

// The per-slab partial sums of one step. set() may be called from several threads for different slabs.
// When a slab is accumulated again (next micro-batch, or the tied embedding receiving lm_head's gradient
// after its own), its newer partial replaces the older: the partial must be of the final gradient.
class GradNormPartials {
 public:
  explicit GradNormPartials(int64_t num_layers);
  void set(SlabKind kind, int64_t layer, double partial);
  // Σ of all partials in slab order; every slab must have been set since clear().
  double sum_of_squares() const;
  void clear();

 private:
  size_t slot(SlabKind kind, int64_t layer) const;
  std::vector<double> partial_;
  std::vector<uint8_t> set_;  // not vector<bool>: distinct slabs are written from different threads
};

// torch.nn.utils.clip_grad_norm_'s coefficient min(1, max_norm / (norm + 1e-6)), in double then rounded;
// 1 when max_norm <= 0 (clipping off).
float clip_coefficient(double norm, double max_norm);

}  // namespace lt
