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

void allgather_shards(const Comm& comm, uint8_t* slab, const SlabLayout& layout, const SlabShards& sh) {
  const int n = comm.size();
  LT_CHECK_EQ(sh.first.size(), size_t(n) + 1, "allgather_shards: shards made for another world size");
  const auto& le = layout.entries();
  auto chunk_at = [&](size_t k) {
    const GradChunk& c = sh.chunks[k];
    return std::pair{le[c.entry].offset + size_t(c.begin) * dtype_size(le[c.entry].dtype),
                     size_t(c.len) * dtype_size(le[c.entry].dtype)};
  };
  // Fixed-size rows (the largest shard's bytes) so one MPI_Allgather moves them all.
  std::vector<size_t> shard_bytes(size_t(n), 0);
  for (int r = 0; r < n; ++r)
    for (size_t k = sh.first[size_t(r)]; k < sh.first[size_t(r) + 1]; ++k) shard_bytes[size_t(r)] += chunk_at(k).second;
  const size_t row = *std::max_element(shard_bytes.begin(), shard_bytes.end());
  std::vector<uint8_t> mine(row, 0), all(size_t(n) * row);
  uint8_t* out = mine.data();
  for (size_t k = sh.first[size_t(comm.rank())]; k < sh.first[size_t(comm.rank()) + 1]; ++k) {
    const auto [at, bytes] = chunk_at(k);
    std::memcpy(out, slab + at, bytes);
    out += bytes;
  }
  comm.allgather(mine.data(), row, all.data());
  for (int r = 0; r < n; ++r) {
    if (r == comm.rank()) continue;
    const uint8_t* in = all.data() + size_t(r) * row;
    for (size_t k = sh.first[size_t(r)]; k < sh.first[size_t(r) + 1]; ++k) {
      const auto [at, bytes] = chunk_at(k);
      std::memcpy(slab + at, in, bytes);
      in += bytes;
    }
  }
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
