// dist/data_parallel.h — a training step's gradients over N ranks: the executor's GradReducer on the ordered
// exchange (dist/grad_exchange.h), bitwise the accumulation one process does over the same micro-batches.
//
// Legend: N ranks, A micro-batches per rank and step; rank r runs global micro-batches a·N + r (train/trainer.cpp).
// Slabs: the embedding, layers 0..L-1, the head; each split into owners' runs of chunks (SlabShards).
//
// Per micro-batch, on the executor's host lane, slab by slab as backward delivers them (the exchange of a layer
// overlaps the backward of the layers below it):
//   * a layer's or the head's slab: reduce_scatter_ordered — the owner of each chunk adds every rank's gradient
//     in rank order (the first an overwrite at the step's first micro-batch);
//   * the embedding table, whose gradient one process builds per micro-batch as (table + lm_head's part when
//     tied) + the embedding rows (one per token id present) added at their ids: owners of the table's chunks
//     receive every rank's lm_head part for them and every rank's rows with their ids, and replay, rank by rank,
//     the tied part then the rows' add restricted to their elements (ops/embedding.h embedding_add_rows) — the
//     same additions per element.
// After the step's last micro-batch, finish_step() gives every rank the norm partials of every slab from the
// owners' chunk partials (one allgather of doubles), combined in chunk order as one process sums them.
//
// The optimizer is sharded the same way (ZeRO-1 over host memory): rank r keeps AdamW states for the chunks it
// owns and updates only them (their gradients are complete there and nowhere else); after each slab's update
// (pipelined into the next forward as in one process, on the executor's optimizer lane) the owners' updated
// weights are allgathered, so every rank streams the same weights. A chunk is 32768 elements of one tensor, so an
// 8-bit block size dividing 32768 keeps every block with one owner. Checkpoints gather every rank's state pieces to
// rank 0 (the whole state, one file whatever N); resume reads each rank's part.
//
// The f32 masters: with a bf16 compute copy the device streams the copy, so a rank needs the masters of its own
// chunks only (its update reads and writes them): the copy is allgathered after an update and the layers' and
// head's masters of other ranks' chunks are given back to the kernel (release_unowned_masters), 4 of the 6 bytes
// per parameter a replicated rank keeps. The embedding's stay whole (the lookup reads any row, one process's f32
// rows) and are allgathered with the copy. A checkpoint or an evaluation gathers them on rank 0 for its duration
// (gather_masters). In f32 compute the masters are the streamed weights: whole on every rank, allgathered.
//
// Freeze and LoRA (model/finetune.h): the gradients, masters and states are of the trained tensors alone (their
// layouts SlabLayout::trained: a frozen slab has no chunks and exchanges nothing); the optimizer states are sharded,
// the masters (small: adapters, a few layers) kept whole on every rank and allgathered; the streamed weights hold
// every tensor, frozen ones as every rank loaded them, trained ones allgathered by the same chunks at their places
// in the streamed slab (SlabLayout::placed_in).
//
//   DataParallelGrads dp(comm, grads);
//   HybridAdamW opt(params, grads, cfg, &dp.owned_ranges());
//   dp.attach(opt, params, copy);          // the allgathers after updates, the checkpoint's state gather
//   (params loaded with only = sharded_master_ranges(comm, cfg): the others' chunks never read)
//   dp.release_unowned_masters(params); make_compute_copy(*copy, params); dp.allgather_compute_copy(*copy);
//   GradTarget t{nullptr, mode, tokens_in_step, &dp};  ... executor.step(...) per micro-batch ...
//   dp.finish_step(partials);              // then opt.plan_step(partials.sum_of_squares())
//   dp.gather_masters(params); if (rank 0) save(params); dp.release_unowned_masters(params);
#pragma once

#include <cstdint>
#include <vector>

#include "dist/comm.h"
#include "dist/grad_exchange.h"
#include "exec/executor.h"
#include "model/weights.h"
#include "optim/adamw.h"

namespace lt {

class DataParallelGrads final : public GradReducer {
 public:
  // Shards every slab of `grads` (f32 gradients, also the layout the executor stages them in) over comm's ranks.
  DataParallelGrads(const Comm& comm, const ModelSlabs& grads);

  void slab(SlabKind kind, int64_t layer, uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
            const SlabLayout& src_layout, GradMode mode) override;
  void embedding(uint8_t* table, const SlabLayout& layout, const uint8_t* tied_part, const float* rows,
                 const int32_t* present, int64_t P, GradMode mode) override;

  // Every slab's Σ g² into `partials`, the same on every rank. Collective.
  void finish_step(GradNormPartials& partials) const;

  // The elements of each tensor this rank owns (HybridAdamW's `owned`).
  const HybridAdamW::OwnedRanges& owned_ranges() const { return owned_; }
  // Makes a sharded optimizer data parallel: after each slab's update its owners' masters (params) and compute
  // copy (`copy`, null in f32 compute) go to every rank; its checkpoint state is gathered to rank 0.
  void attach(HybridAdamW& optimizer, ModelSlabs& params, ModelSlabs* copy);
  // The ranks other than 0 call this where rank 0 saves the optimizer state (its save_state gathers). Collective.
  void send_optimizer_state(const HybridAdamW& optimizer) const;

  // Whether attach() sharded the masters (a compute copy is streamed); the calls below do nothing otherwise.
  bool masters_sharded() const { return masters_sharded_; }
  // Gives back the pages of the layers' and head's masters outside this rank's chunks (after the compute copy is
  // made from them, and after gather_masters). They are not read again until gather_masters refills rank 0's.
  void release_unowned_masters(ModelSlabs& params) const;
  // Rank 0 receives every owner's masters of the layers and head: whole f32 masters there, to save or evaluate.
  // Collective.
  void gather_masters(ModelSlabs& params) const;
  // Bytes of f32 masters this rank keeps between gathers (the whole slabs when they are not sharded).
  size_t master_bytes_kept(const ModelSlabs& params) const;
  // The compute copy of the layers and head from their owners: each rank made its own chunks' (from the masters it
  // loaded), the embedding's whole. Collective.
  void allgather_compute_copy(ModelSlabs& copy) const;

  const SlabShards& shards(SlabKind kind, int64_t layer) const { return shards_[slot(kind, layer)]; }
  // Bytes this rank sent in the exchange since construction: its gradient slices, embedding rows and updated
  // weights (its shard to each other rank).
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  size_t slot(SlabKind kind, int64_t layer) const;
  const Comm& comm_;
  int64_t layers_, hidden_;
  std::vector<SlabShards> shards_;            // [L + 2]: embedding, layers, head
  std::vector<std::vector<double>> partial_;  // [L + 2]: this rank's chunks' Σ g² after the latest micro-batch
  HybridAdamW::OwnedRanges owned_;            // [L + 2][tensors]: this rank's elements of each tensor
  std::vector<SlabLayout> copy_in_;           // [L + 2]: the gradients' tensors where the compute copy has them
  uint64_t bytes_sent_ = 0;
  bool masters_sharded_ = false;
};

// The f32 masters' elements a rank keeps when they are sharded: its chunks of every layer and head tensor, by HF
// name (the embedding's are absent: kept whole) — what it loads (load_hf_model, load_checkpoint's `only`).
TensorRanges sharded_master_ranges(const Comm& comm, const ModelConfig& cfg);

}  // namespace lt
