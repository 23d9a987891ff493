#include "dist/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/embedding.h"
#include "optim/kernels.h"

namespace lt {
namespace {

// Every rank's pieces of each state tensor to rank 0, which returns the whole tensors (views into `storage`);
// the others return nothing. Each piece is contiguous and the ranks' pieces of a tensor tile it.
NamedTensors gather_state(const Comm& comm, const std::vector<StatePiece>& mine,
                          std::vector<AlignedBuffer<uint8_t>>* storage) {
  const size_t n = size_t(comm.size()), pieces = mine.size();
  comm.barrier(Comm::kWaitForLead);  // rank 0 comes here after writing the model files
  // Every piece's (offset, bytes) on every rank, in one allgather.
  std::vector<uint64_t> where(2 * pieces), all(2 * pieces * n);
  for (size_t i = 0; i < pieces; ++i) where[2 * i] = mine[i].offset, where[2 * i + 1] = mine[i].bytes;
  comm.allgather(where.data(), where.size() * sizeof(uint64_t), all.data());
  NamedTensors out;
  std::vector<size_t> bytes(n), offsets(n);
  for (size_t i = 0; i < pieces; ++i) {
    const StatePiece& p = mine[i];
    size_t covered = 0;
    for (size_t r = 0; r < n; ++r) {
      offsets[r] = all[(r * pieces + i) * 2];
      bytes[r] = all[(r * pieces + i) * 2 + 1];
      covered += bytes[r];
    }
    uint8_t* whole = nullptr;
    if (comm.rank() == 0) {
      const size_t total = size_t(shape_numel(p.shape)) * dtype_size(p.dtype);
      LT_CHECK(covered == total, "data parallel: the ranks' parts of optimizer state '{}' cover {} of its {} bytes",
               p.name, covered, total);
      storage->emplace_back(std::max<size_t>(total, 1));
      whole = storage->back().data();
      out[p.name] = TensorView::contiguous(whole, p.dtype, p.shape);
    }
    comm.gatherv(p.data, p.bytes, whole, bytes, offsets);
  }
  return out;
}

// The sharded masters' slabs: every layer and the head (the embedding's stay whole).
template <typename Fn>
void for_each_sharded_slab(int64_t layers, Fn&& fn) {
  for (int64_t l = 0; l < layers; ++l) fn(SlabKind::layer, l);
  fn(SlabKind::head, int64_t(0));
}

}  // namespace

DataParallelGrads::DataParallelGrads(const Comm& comm, const ModelSlabs& grads)
    : comm_(comm),
      layers_(grads.num_layers()),
      hidden_(grads.config().hidden_size) {
  shards_.resize(size_t(layers_) + 2);
  partial_.resize(size_t(layers_) + 2);
  auto make = [&](SlabKind kind, int64_t layer) {
    const SlabLayout& l = grads.layout(kind, layer);
    shards_[slot(kind, layer)] = SlabShards::make(l, l, comm_.size());
  };
  make(SlabKind::embedding, 0);
  for (int64_t l = 0; l < layers_; ++l) make(SlabKind::layer, l);
  make(SlabKind::head, 0);
  // The embedding's partials are summed as grad_sum_of_squares sums the whole table: chunks of kAccumulateChunk
  // from its first element, which the slab's chunks are when the table is its only tensor (none: frozen).
  const SlabShards& e = shards_[0];
  LT_CHECK(grads.layout(SlabKind::embedding).entries().size() <= 1,
           "data parallel: the embedding slab must hold the table alone");
  for (const GradChunk& c : e.chunks) LT_CHECK_EQ(c.begin % kAccumulateChunk, 0, "data parallel: embedding chunk");
  // This rank's run of chunks as an element range per tensor (a run is contiguous: at most the tensors at its
  // two ends are cut).
  owned_.resize(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    const SlabShards& sh = shards_[s];
    const size_t tensors = s == 0 ? grads.layout(SlabKind::embedding).entries().size()
                           : s + 1 == shards_.size() ? grads.layout(SlabKind::head).entries().size()
                                                     : grads.layout(SlabKind::layer, int64_t(s) - 1).entries().size();
    owned_[s].assign(tensors, {0, 0});
    for (size_t k = sh.first[size_t(comm_.rank())]; k < sh.first[size_t(comm_.rank()) + 1]; ++k) {
      const GradChunk& c = sh.chunks[k];
      auto& [b, e] = owned_[s][c.entry];
      if (b == e) b = c.begin;
      e = c.begin + c.len;
    }
  }
}

size_t DataParallelGrads::slot(SlabKind kind, int64_t layer) const {
  switch (kind) {
    case SlabKind::embedding: return 0;
    case SlabKind::layer: return size_t(1 + layer);
    case SlabKind::head: return size_t(layers_ + 1);
  }
  LT_FAIL("data parallel: unknown slab kind");
}

void DataParallelGrads::slab(SlabKind kind, int64_t layer, uint8_t* dst, const SlabLayout& dst_layout,
                             const uint8_t* src, const SlabLayout& src_layout, GradMode mode) {
  const SlabShards& sh = shards_[slot(kind, layer)];
  const int me = comm_.rank();
  for (size_t k = 0; k < sh.chunks.size(); ++k)
    if (k < sh.first[size_t(me)] || k >= sh.first[size_t(me) + 1]) bytes_sent_ += sh.src_bytes[k];
  reduce_scatter_ordered(comm_, dst, dst_layout, src, src_layout, sh, mode, partial_[slot(kind, layer)]);
}

void DataParallelGrads::embedding(uint8_t* table, const SlabLayout& layout, const uint8_t* tied_part,
                                  const float* rows, const int32_t* present, int64_t P, GradMode mode) {
  const SlabShards& sh = shards_[0];
  const int n = comm_.size(), me = comm_.rank();
  const size_t first = sh.first[size_t(me)], last = sh.first[size_t(me) + 1];
  const int64_t C = hidden_;

  // lm_head's part (tied): each owner receives every rank's part of its chunks.
  ReceivedChunks tied;
  if (tied_part) tied = gather_owned_chunks(comm_, tied_part, layout, sh);

  // Every rank's embedding rows and their ids (each rank's own P).
  const std::vector<int64_t> counts = comm_.allgather_int(P);
  const size_t ranks = static_cast<size_t>(n);
  std::vector<size_t> id_bytes(ranks), id_off(ranks), row_bytes(ranks), row_off(ranks);
  size_t id_total = 0, row_total = 0;
  for (int r = 0; r < n; ++r) {
    id_bytes[size_t(r)] = size_t(counts[size_t(r)]) * sizeof(int32_t);
    row_bytes[size_t(r)] = size_t(counts[size_t(r)] * C) * sizeof(float);
    id_off[size_t(r)] = id_total;
    row_off[size_t(r)] = row_total;
    id_total += id_bytes[size_t(r)];
    row_total += row_bytes[size_t(r)];
  }
  std::vector<int32_t> all_ids(id_total / sizeof(int32_t));
  std::vector<float> all_rows(row_total / sizeof(float));
  comm_.allgatherv(present, id_bytes[size_t(me)], all_ids.data(), id_bytes, id_off);
  comm_.allgatherv(rows, row_bytes[size_t(me)], all_rows.data(), row_bytes, row_off);
  bytes_sent_ += uint64_t(n - 1) * (id_bytes[size_t(me)] + row_bytes[size_t(me)]);
  if (tied_part) bytes_sent_ += uint64_t(layout.bytes() - tied.per_rank);

  // The replay, rank by rank, on this rank's elements [e0, e1) of the table only.
  std::vector<double>& partial = partial_[0];
  partial.assign(last - first, 0.0);
  if (first == last) return;
  float* t = reinterpret_cast<float*>(table + layout.entries()[0].offset);
  const int64_t e0 = sh.chunks[first].begin, e1 = sh.chunks[last - 1].begin + sh.chunks[last - 1].len;
  for (int r = 0; r < n; ++r) {
    const GradMode m = r == 0 ? mode : GradMode::add;
    if (tied_part) accumulate_grad_packed(table, layout, tied.from(r), layout, sh.chunks, first, last, m, partial.data());
    else if (m == GradMode::overwrite) std::fill(t + e0, t + e1, 0.0f);
    embedding_add_rows(t, all_rows.data() + row_off[size_t(r)] / sizeof(float),
                       all_ids.data() + id_off[size_t(r)] / sizeof(int32_t), counts[size_t(r)], C, e0, e1);
  }
  for (size_t k = first; k < last; ++k)
    partial[k - first] = grad_chunk_sum_of_squares(t + sh.chunks[k].begin, sh.chunks[k].len);
}

void DataParallelGrads::finish_step(GradNormPartials& partials) const {
  // One allgather: each rank's partials of every slab back to back, padded to the longest rank's row.
  const int n = comm_.size();
  std::vector<size_t> owned(size_t(n), 0);
  for (const SlabShards& sh : shards_)
    for (int r = 0; r < n; ++r) owned[size_t(r)] += sh.owned(r);
  const size_t row = *std::max_element(owned.begin(), owned.end());
  std::vector<double> mine(row, 0.0), all(size_t(n) * row);
  size_t at = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    LT_CHECK_EQ(partial_[s].size(), shards_[s].owned(comm_.rank()), "data parallel: a slab had no gradient this step");
    std::copy(partial_[s].begin(), partial_[s].end(), mine.begin() + ptrdiff_t(at));
    at += partial_[s].size();
  }
  comm_.allgather(mine.data(), row * sizeof(double), all.data());
  std::vector<size_t> cursor(size_t(n), 0);  // where each rank's next slab's partials start in its row
  for (size_t s = 0; s < shards_.size(); ++s) {
    const SlabShards& sh = shards_[s];
    std::vector<double> ordered;
    ordered.reserve(sh.chunks.size());
    for (int r = 0; r < n; ++r) {
      const double* p = all.data() + size_t(r) * row + cursor[size_t(r)];
      ordered.insert(ordered.end(), p, p + sh.owned(r));
      cursor[size_t(r)] += sh.owned(r);
    }
    const double sum = combine_grad_chunks(sh.chunks, ordered.data());
    if (s == 0) partials.set(SlabKind::embedding, 0, sum);
    else if (s == shards_.size() - 1) partials.set(SlabKind::head, 0, sum);
    else partials.set(SlabKind::layer, int64_t(s) - 1, sum);
  }
}

void DataParallelGrads::attach(HybridAdamW& optimizer, ModelSlabs& params, ModelSlabs* copy) {
  LT_CHECK(kAccumulateChunk % optimizer.config().block_size == 0,
           "data parallel: the optimizer's 8-bit block size {} must divide {} (a block must not straddle two ranks)",
           optimizer.config().block_size, kAccumulateChunk);
  // The shards were cut in the f32 gradients' layout, which f32 masters share.
  LT_CHECK(params.matrix_dtype() == DType::f32, "data parallel: the masters must be f32 slabs");
  // Frozen tensors (model/finetune.h): the masters are the trained tensors alone (adapters, a few layers), kept whole
  // on every rank; the streamed copy holds every tensor, the trained ones at their places there (copy_in_).
  const bool trains_all = params.config().trains_all();
  masters_sharded_ = copy != nullptr && trains_all;
  copy_in_.clear();
  if (copy) {
    copy_in_.resize(shards_.size());
    copy_in_[0] = params.layout(SlabKind::embedding).placed_in(copy->layout(SlabKind::embedding));
    for (int64_t l = 0; l < layers_; ++l)
      copy_in_[slot(SlabKind::layer, l)] = params.layout(SlabKind::layer, l).placed_in(copy->layout(SlabKind::layer, l));
    copy_in_.back() = params.layout(SlabKind::head).placed_in(copy->layout(SlabKind::head));
  }
  optimizer.set_after_update([this, &params, copy](SlabKind kind, int64_t layer, uint8_t* copy_slab) {
    const SlabShards& sh = shards_[slot(kind, layer)];
    auto gather = [&](uint8_t* slab, const SlabLayout& layout) {
      allgather_shards(comm_, slab, layout, sh);
      const auto [lo, hi] = owned_bytes(layout, sh, comm_.rank());
      bytes_sent_ += uint64_t(comm_.size() - 1) * (hi - lo);
    };
    if (!masters_sharded_ || kind == SlabKind::embedding) gather(params.slab(kind, layer), params.layout(kind, layer));
    if (copy_slab) {
      LT_CHECK(copy != nullptr && copy_slab == copy->slab(kind, layer), "data parallel: an unknown compute copy");
      gather(copy_slab, copy_in_[slot(kind, layer)]);
    }
  });
  optimizer.set_state_gather([this](const std::vector<StatePiece>& mine, std::vector<AlignedBuffer<uint8_t>>& storage) {
    return gather_state(comm_, mine, &storage);
  });
}

void DataParallelGrads::release_unowned_masters(ModelSlabs& params) const {
  if (!masters_sharded_) return;
  for_each_sharded_slab(layers_, [&](SlabKind kind, int64_t layer) {
    const SlabLayout& layout = params.layout(kind, layer);
    const auto [lo, hi] = owned_bytes(layout, shards_[slot(kind, layer)], comm_.rank());
    uint8_t* slab = params.slab(kind, layer);
    release_pages(slab, lo);  // a rank owning none of the slab: {0, 0}, the second call releases it all
    release_pages(slab + hi, layout.bytes() - hi);
  });
}

void DataParallelGrads::gather_masters(ModelSlabs& params) const {
  if (!masters_sharded_) return;
  for_each_sharded_slab(layers_, [&](SlabKind kind, int64_t layer) {
    gather_shards_to_lead(comm_, params.slab(kind, layer), params.layout(kind, layer), shards_[slot(kind, layer)]);
  });
}

void DataParallelGrads::allgather_compute_copy(ModelSlabs& copy) const {
  if (!masters_sharded_) return;
  for_each_sharded_slab(layers_, [&](SlabKind kind, int64_t layer) {
    allgather_shards(comm_, copy.slab(kind, layer), copy.layout(kind, layer), shards_[slot(kind, layer)]);
  });
}

TensorRanges sharded_master_ranges(const Comm& comm, const ModelConfig& cfg) {
  // The shards as the run's gradients will have them: a slab set of the same layouts, its pages never touched.
  const ModelSlabs shape(cfg, DType::f32, Fill::none);
  const DataParallelGrads dp(comm, shape);
  const HybridAdamW::OwnedRanges& owned = dp.owned_ranges();  // [embedding, layers..., head][tensor]
  const std::vector<ModelSlabs::Named> named = shape.named_tensors();  // the same slabs and tensors, in order
  TensorRanges out;
  size_t at = 0;
  for (size_t s = 0; s < owned.size(); ++s)
    for (const auto& [begin, end] : owned[s]) {
      LT_CHECK(at < named.size(), "data parallel: the masters' tensors and the shards disagree");
      if (s > 0) out[named[at].hf_name] = ElementRange{begin, end};
      ++at;
    }
  LT_CHECK_EQ(at, named.size(), "data parallel: the masters' tensors and the shards disagree");
  return out;
}

size_t DataParallelGrads::master_bytes_kept(const ModelSlabs& params) const {
  if (!masters_sharded_) return params.total_bytes();
  size_t kept = params.layout(SlabKind::embedding).bytes();
  for_each_sharded_slab(layers_, [&](SlabKind kind, int64_t layer) {
    const auto [lo, hi] = owned_bytes(params.layout(kind, layer), shards_[slot(kind, layer)], comm_.rank());
    kept += hi - lo;
  });
  return kept;
}

void DataParallelGrads::send_optimizer_state(const HybridAdamW& optimizer) const {
  LT_CHECK(comm_.rank() != 0, "data parallel: rank 0 gathers the optimizer state in its save_state");
  gather_state(comm_, optimizer.state_pieces(), nullptr);
}

}  // namespace lt
