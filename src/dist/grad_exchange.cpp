#include "dist/grad_exchange.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace lt {

SlabShards SlabShards::make(const SlabLayout& dst_layout, const SlabLayout& src_layout, int ranks) {
  LT_CHECK(ranks >= 1, "SlabShards: {} ranks", ranks);
  SlabShards sh;
  sh.chunks = grad_chunks(dst_layout, src_layout);
  const auto& se = src_layout.entries();
  int64_t total = 0;
  for (const GradChunk& c : sh.chunks) {
    total += c.len;
    sh.src_bytes.push_back(size_t(c.len) * dtype_size(se[c.entry].dtype));
  }
  // Rank r's run ends at the first chunk that reaches (r + 1)/N of the elements.
  sh.first.assign(size_t(ranks) + 1, sh.chunks.size());
  sh.first[0] = 0;
  int64_t seen = 0;
  size_t k = 0;
  for (int r = 1; r < ranks; ++r) {
    const int64_t target = total * r / ranks;
    while (k < sh.chunks.size() && seen + sh.chunks[k].len <= target) seen += sh.chunks[k++].len;
    sh.first[size_t(r)] = k;
  }
  return sh;
}

ReceivedChunks gather_owned_chunks(const Comm& comm, const uint8_t* src, const SlabLayout& src_layout,
                                   const SlabShards& sh) {
  const int n = comm.size(), me = comm.rank();
  LT_CHECK_EQ(sh.first.size(), size_t(n) + 1, "gather_owned_chunks: shards made for another world size");
  const auto& se = src_layout.entries();
  auto chunk_src = [&](size_t k) {
    const GradChunk& c = sh.chunks[k];
    return src + se[c.entry].offset + size_t(c.begin) * dtype_size(se[c.entry].dtype);
  };
  // Send: this rank's chunks grouped by owner, packed. Receive: the chunks this rank owns, from every rank.
  ReceivedChunks got;
  for (size_t k = sh.first[size_t(me)]; k < sh.first[size_t(me) + 1]; ++k) got.per_rank += sh.src_bytes[k];
  std::vector<size_t> send_bytes(size_t(n), 0), send_off(size_t(n), 0), recv_bytes(size_t(n), got.per_rank),
      recv_off(size_t(n), 0);
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    send_off[size_t(r)] = total;
    for (size_t k = sh.first[size_t(r)]; k < sh.first[size_t(r) + 1]; ++k) send_bytes[size_t(r)] += sh.src_bytes[k];
    total += send_bytes[size_t(r)];
    recv_off[size_t(r)] = size_t(r) * got.per_rank;
  }
  std::vector<uint8_t> send(total);
  for (int r = 0; r < n; ++r) {
    uint8_t* out = send.data() + send_off[size_t(r)];
    for (size_t k = sh.first[size_t(r)]; k < sh.first[size_t(r) + 1]; ++k) {
      std::memcpy(out, chunk_src(k), sh.src_bytes[k]);
      out += sh.src_bytes[k];
    }
  }
  got.data.resize(size_t(n) * got.per_rank);
  comm.alltoallv(send.data(), send_bytes, send_off, got.data.data(), recv_bytes, recv_off);
  return got;
}

void reduce_scatter_ordered(const Comm& comm, uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                            const SlabLayout& src_layout, const SlabShards& sh, GradMode mode,
                            std::vector<double>& partial) {
  const ReceivedChunks got = gather_owned_chunks(comm, src, src_layout, sh);
  // Each rank's contribution in rank order, added straight from the received buffer.
  const size_t first = sh.first[size_t(comm.rank())], last = sh.first[size_t(comm.rank()) + 1];
  partial.assign(last - first, 0.0);
  for (int r = 0; r < comm.size(); ++r)
    accumulate_grad_packed(dst, dst_layout, got.from(r), src_layout, sh.chunks, first, last,
                           r == 0 ? mode : GradMode::add, partial.data());
}

namespace {

// Where chunk k of the slab lies in `layout`: byte offset and bytes.
std::pair<size_t, size_t> chunk_bytes(const SlabLayout& layout, const SlabShards& sh, size_t k) {
  const GradChunk& c = sh.chunks[k];
  const auto& e = layout.entries()[c.entry];
  return {e.offset + size_t(c.begin) * dtype_size(e.dtype), size_t(c.len) * dtype_size(e.dtype)};
}

// Each rank's shard of a slab packed in chunk order, as one fixed-size row (the largest shard's bytes) per rank:
// one MPI_Allgather / MPI_Gather moves them all.
struct ShardRows {
  size_t row = 0;
  std::vector<uint8_t> mine;

  ShardRows(const Comm& comm, const uint8_t* slab, const SlabLayout& layout, const SlabShards& sh) {
    LT_CHECK_EQ(sh.first.size(), size_t(comm.size()) + 1, "shard exchange: shards made for another world size");
    for (int r = 0; r < comm.size(); ++r) {
      size_t bytes = 0;
      for (size_t k = sh.first[size_t(r)]; k < sh.first[size_t(r) + 1]; ++k) bytes += chunk_bytes(layout, sh, k).second;
      row = std::max(row, bytes);
    }
    mine.assign(row, 0);
    uint8_t* out = mine.data();
    for (size_t k = sh.first[size_t(comm.rank())]; k < sh.first[size_t(comm.rank()) + 1]; ++k) {
      const auto [at, bytes] = chunk_bytes(layout, sh, k);
      std::memcpy(out, slab + at, bytes);
      out += bytes;
    }
  }
  // The other ranks' rows (all: [N][row]) back into their chunks of `slab`.
  static void unpack(const Comm& comm, const uint8_t* all, size_t row, uint8_t* slab, const SlabLayout& layout,
                     const SlabShards& sh) {
    for (int r = 0; r < comm.size(); ++r) {
      if (r == comm.rank()) continue;
      const uint8_t* in = all + size_t(r) * row;
      for (size_t k = sh.first[size_t(r)]; k < sh.first[size_t(r) + 1]; ++k) {
        const auto [at, bytes] = chunk_bytes(layout, sh, k);
        std::memcpy(slab + at, in, bytes);
        in += bytes;
      }
    }
  }
};

}  // namespace

void allgather_shards(const Comm& comm, uint8_t* slab, const SlabLayout& layout, const SlabShards& sh) {
  const ShardRows rows(comm, slab, layout, sh);
  std::vector<uint8_t> all(size_t(comm.size()) * rows.row);
  comm.allgather(rows.mine.data(), rows.row, all.data());
  ShardRows::unpack(comm, all.data(), rows.row, slab, layout, sh);
}

void gather_shards_to_lead(const Comm& comm, uint8_t* slab, const SlabLayout& layout, const SlabShards& sh) {
  const ShardRows rows(comm, slab, layout, sh);
  const size_t n = size_t(comm.size());
  std::vector<uint8_t> all(comm.rank() == 0 ? n * rows.row : 0);
  std::vector<size_t> bytes(n, rows.row), offsets(n);
  for (size_t r = 0; r < n; ++r) offsets[r] = r * rows.row;
  comm.gatherv(rows.mine.data(), rows.row, all.data(), bytes, offsets);
  if (comm.rank() == 0) ShardRows::unpack(comm, all.data(), rows.row, slab, layout, sh);
}

std::pair<size_t, size_t> owned_bytes(const SlabLayout& layout, const SlabShards& sh, int rank) {
  const size_t first = sh.first[size_t(rank)], last = sh.first[size_t(rank) + 1];
  if (first == last) return {0, 0};
  const auto [lo, lo_bytes] = chunk_bytes(layout, sh, first);
  const auto [hi, hi_bytes] = chunk_bytes(layout, sh, last - 1);
  return {lo, hi + hi_bytes};
}

double slab_sum_of_squares(const Comm& comm, const SlabShards& sh, const std::vector<double>& partial) {
  const int n = comm.size();
  // Owners hold different counts; each sends a fixed-size row (the most any rank owns), padded.
  size_t most = 0;
  for (int r = 0; r < n; ++r) most = std::max(most, sh.owned(r));
  LT_CHECK_EQ(partial.size(), sh.owned(comm.rank()), "slab_sum_of_squares: partials of another shard");
  std::vector<double> mine(most, 0.0), all(size_t(n) * most);
  std::copy(partial.begin(), partial.end(), mine.begin());
  comm.allgather(mine.data(), most * sizeof(double), all.data());
  std::vector<double> ordered;
  ordered.reserve(sh.chunks.size());
  for (int r = 0; r < n; ++r)
    for (size_t k = 0; k < sh.owned(r); ++k) ordered.push_back(all[size_t(r) * most + k]);
  return combine_grad_chunks(sh.chunks, ordered.data());
}

}  // namespace lt
