// dist/grad_exchange.h — one micro-batch's gradient slab, summed across ranks into each owner's shard, in rank
// order, so that N ranks give the one-process bits.
//
// Legend: N ranks; a slab's chunks (optim/clip.h GradChunk: at most 32768 elements of one tensor) in order; rank
// r owns the contiguous run of chunks [first[r], first[r+1]) (balanced by elements).
//
// Why rank order: at accumulation step a, rank r runs global micro-batch a·N + r (N ranks × A steps deal the
// micro-batches one process with N·A steps sees, in its order), and one process accumulates them in order:
// G = ((G + g_aN) + g_aN+1) + … So the owner of a chunk receives every rank's gradient for it and adds them in
// rank order: the same f32 additions in the same order. (MPI_Reduce_scatter with MPI_SUM fixes no order.) Each
// owner keeps its chunks' Σ g² partials; the slab's norm from all owners' partials in chunk order
// (combine_grad_chunks) is the one-process norm bit for bit.
//
//   SlabShards sh = SlabShards::make(grads_layout, stage_layout, comm.size());
//   std::vector<double> partial;
//   reduce_scatter_ordered(comm, grads, grads_layout, stage, stage_layout, sh, mode, partial);
//   double sum_sq = slab_sum_of_squares(comm, sh, partial);   // every rank gets the same value
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "dist/comm.h"
#include "model/layout.h"
#include "optim/clip.h"

namespace lt {

struct SlabShards {
  std::vector<GradChunk> chunks;  // the slab's chunks, in order
  std::vector<size_t> first;      // [N + 1]: rank r owns chunks [first[r], first[r + 1])
  std::vector<size_t> src_bytes;  // [chunks]: bytes of each chunk in the source layout (f32 or bf16 tensors)

  // Splits the chunks into `ranks` contiguous runs of about equal elements (a rank may own none).
  static SlabShards make(const SlabLayout& dst_layout, const SlabLayout& src_layout, int ranks);
  size_t owned(int rank) const { return first[size_t(rank) + 1] - first[size_t(rank)]; }
};

// Every rank's chunks of `src` (src_layout) that this rank owns, packed in chunk order per source rank, ranks in
// order: what an owner adds in rank order (accumulate_grad_packed). One alltoallv. Collective.
struct ReceivedChunks {
  std::vector<uint8_t> data;
  size_t per_rank = 0;  // bytes from each rank
  const uint8_t* from(int rank) const { return data.data() + size_t(rank) * per_rank; }
};
ReceivedChunks gather_owned_chunks(const Comm& comm, const uint8_t* src, const SlabLayout& src_layout,
                                   const SlabShards& shards);

// This rank's gradient `src` (src_layout) for the slab goes to the owners of its chunks; this rank adds every
// rank's gradient of the chunks it owns into dst (dst_layout, f32) in rank order — the first add an overwrite when
// mode is overwrite. dst's other chunks are not touched. partial[owned chunks] receives their Σ dst² after the
// last add. Collective: every rank calls it for the same slab, in the same order.
void reduce_scatter_ordered(const Comm& comm, uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                            const SlabLayout& src_layout, const SlabShards& shards, GradMode mode,
                            std::vector<double>& partial);

// Every owner's chunks of `slab` (`layout`, the layout the shards were made for as destination) to every rank: after
// it each rank holds the whole slab as its owners left it (one allgather of the largest shard's bytes). The step of
// a replicated optimizer, and of the updated weights of a sharded one. Collective.
void allgather_shards(const Comm& comm, uint8_t* slab, const SlabLayout& layout, const SlabShards& shards);
// The same to rank 0 only (one gather): rank 0 then holds the whole slab, the others' slabs are unchanged.
// Sharded masters written to a checkpoint or evaluated. Collective.
void gather_shards_to_lead(const Comm& comm, uint8_t* slab, const SlabLayout& layout, const SlabShards& shards);
// The bytes [begin, end) of `layout` that `rank`'s run of chunks spans ({0, 0} when it owns none): its chunks and
// any padding between their tensors.
std::pair<size_t, size_t> owned_bytes(const SlabLayout& layout, const SlabShards& shards, int rank);

// The slab's Σ g² from every owner's partials, combined in chunk order (one allgather). Collective.
double slab_sum_of_squares(const Comm& comm, const SlabShards& shards, const std::vector<double>& partial);

}  // namespace lt
