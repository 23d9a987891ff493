// The ordered reduce-scatter of gradient slabs: every rank builds the same layouts and every rank's micro-batch
// gradients from seeds, so each can run the one-process accumulation itself and compare its own shard and the
// norm bit for bit. Run as a plain test (a world of one) and under mpirun with 2 and 3 ranks (CMakeLists.txt:
// dist_exchange.ranks2 / .ranks3). Odd sizes throughout: tensors of 1..2 chunks plus a few elements, bf16
// matrices beside f32 norms in the source layout, ranks that own no chunk.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "dist/data_parallel.h"
#include "dist/grad_exchange.h"
#include "model/weights.h"
#include "ops/embedding.h"
#include "optim/adamw.h"
#include "optim/kernels.h"
#include "testing/model_testing.h"

namespace lt {
namespace {

ModelConfig odd_config() {
  testing::SmallShape s;
  s.vocab = 61, s.hidden = 136, s.intermediate = 401, s.layers = 1, s.heads = 4, s.kv_heads = 2, s.head_dim = 34;
  return testing::small_model_config(ModelType::qwen3, s);
}

// A slab in `layout` of seeded values, never zero (f32 or bf16 per tensor, as the layout says).
std::vector<uint8_t> random_slab(const SlabLayout& layout, uint64_t seed) {
  std::vector<uint8_t> bytes(layout.bytes(), 0);
  Rng rng(seed);
  for (const SlabEntry& e : layout.entries()) {
    for (int64_t i = 0; i < e.numel(); ++i) {
      const float x = float(0.01 * rng.normal()) + (i % 2 ? 1e-4f : -1e-4f);
      if (e.dtype == DType::f32) std::memcpy(bytes.data() + e.offset + size_t(i) * 4, &x, 4);
      else reinterpret_cast<bf16_t*>(bytes.data() + e.offset)[i] = f32_to_bf16(x);
    }
  }
  return bytes;
}

uint64_t seed_of(int step, int rank) { return 1000 + uint64_t(step) * 97 + uint64_t(rank); }

TEST(SlabShards, RunsOfChunksInOrderBalancedByElements) {
  const ModelConfig cfg = odd_config();
  const SlabLayout dl = SlabLayout::make_layer(cfg, 0), sl = SlabLayout::make_layer(cfg, 0, DType::bf16);
  for (int ranks = 1; ranks <= 7; ++ranks) {
    const SlabShards sh = SlabShards::make(dl, sl, ranks);
    ASSERT_EQ(sh.first.size(), size_t(ranks) + 1);
    EXPECT_EQ(sh.first.front(), 0u);
    EXPECT_EQ(sh.first.back(), sh.chunks.size());
    int64_t total = 0;
    for (const GradChunk& c : sh.chunks) total += c.len;
    for (int r = 0; r < ranks; ++r) {
      ASSERT_LE(sh.first[size_t(r)], sh.first[size_t(r) + 1]);
      int64_t mine = 0;
      for (size_t k = sh.first[size_t(r)]; k < sh.first[size_t(r) + 1]; ++k) mine += sh.chunks[k].len;
      EXPECT_LE(std::abs(mine - total / ranks), kAccumulateChunk) << ranks << " ranks, rank " << r;
    }
  }
}

TEST(GradExchange, ShardsAndNormEqualTheOneProcessAccumulationBitwise) {
  const Comm& comm = Comm::world();
  const int n = comm.size(), me = comm.rank();
  const ModelConfig cfg = odd_config();
  const SlabLayout dl = SlabLayout::make_layer(cfg, 0);
  for (DType src_dtype : {DType::f32, DType::bf16}) {
    const SlabLayout sl = SlabLayout::make_layer(cfg, 0, src_dtype);
    const SlabShards sh = SlabShards::make(dl, sl, n);
    for (GradMode mode : {GradMode::overwrite, GradMode::add}) {
      const std::vector<uint8_t> start = random_slab(dl, 7);
      std::vector<uint8_t> expected = start, actual = start;
      constexpr int kSteps = 3;  // accumulation steps: micro-batches step·N + r, in that order
      double expected_norm = 0, actual_norm = 0;
      std::vector<double> partial;
      for (int a = 0; a < kSteps; ++a) {
        for (int r = 0; r < n; ++r) {
          const std::vector<uint8_t> g = random_slab(sl, seed_of(a, r));
          expected_norm = accumulate_grad_slab(expected.data(), dl, g.data(), sl,
                                               a == 0 && r == 0 ? mode : GradMode::add);
        }
        const std::vector<uint8_t> mine = random_slab(sl, seed_of(a, me));
        reduce_scatter_ordered(comm, actual.data(), dl, mine.data(), sl, sh, a == 0 ? mode : GradMode::add, partial);
        actual_norm = slab_sum_of_squares(comm, sh, partial);
      }
      EXPECT_EQ(0, std::memcmp(&actual_norm, &expected_norm, sizeof(double)))
          << "rank " << me << " of " << n << ": " << actual_norm << " vs " << expected_norm;
      // This rank's chunks are the one-process sums; the others it has not touched. Gathered, every rank holds
      // the whole one-process slab.
      std::vector<uint8_t> gathered = actual;
      allgather_shards(comm, gathered.data(), dl, sh);
      EXPECT_EQ(0, std::memcmp(gathered.data(), expected.data(), dl.bytes()))
          << "rank " << me << " of " << n << ": the gathered slab differs from the one-process one";
      const auto& de = dl.entries();
      for (size_t k = 0; k < sh.chunks.size(); ++k) {
        const GradChunk& c = sh.chunks[k];
        const size_t at = de[c.entry].offset + size_t(c.begin) * 4, bytes = size_t(c.len) * 4;
        const bool owned = k >= sh.first[size_t(me)] && k < sh.first[size_t(me) + 1];
        const std::vector<uint8_t>& want = owned ? expected : start;
        EXPECT_EQ(0, std::memcmp(actual.data() + at, want.data() + at, bytes))
            << "rank " << me << " of " << n << ", chunk " << k << (owned ? " (owned)" : " (not owned)") << ", "
            << dtype_name(src_dtype) << (mode == GradMode::overwrite ? ", overwrite" : ", add");
      }
    }
  }
}

TEST(DataParallelGrads, EmbeddingReplayAndNormsEqualTheOneProcessStepBitwise) {
  // The table: 1031 x 136 = 5 chunks whose boundaries cut rows; each rank's micro-batch has its own token count
  // and repeated ids. One process per micro-batch m = a·N + r: lm_head's part (tied) then the scatter of dx0.
  const Comm& comm = Comm::world();
  const int n = comm.size(), me = comm.rank();
  for (bool tied : {true, false}) {
    testing::SmallShape shape;
    shape.vocab = 1031, shape.hidden = 136, shape.intermediate = 72, shape.layers = 2, shape.tied = tied;
    const ModelConfig cfg = testing::small_model_config(ModelType::qwen3, shape);
    const int64_t V = cfg.vocab_size, C = cfg.hidden_size;
    ModelSlabs expected(cfg), actual(cfg);
    DataParallelGrads dp(comm, actual);
    const SlabLayout& el = actual.layout(SlabKind::embedding);
    auto micro = [&](int a, int r) {  // rank r's micro-batch a: ids, dx0 rows, tied part
      Rng rng(seed_of(a, r) * 31);
      const int64_t N = 40 + 7 * r + a;
      std::vector<int32_t> ids(static_cast<size_t>(N));
      for (auto& id : ids) id = int32_t(rng.next_u64() % uint64_t(r % 2 ? 17 : V));  // odd ranks: many repeats
      std::vector<float> rows(static_cast<size_t>(N * C));
      for (auto& x : rows) x = float(0.01 * rng.normal()) + 1e-4f;
      return std::tuple{ids, rows, random_slab(el, seed_of(a, r) + 500)};
    };
    double expected_sq = 0;
    GradNormPartials partials(cfg.num_layers);
    for (int a = 0; a < 2; ++a) {
      const GradMode mode = a == 0 ? GradMode::overwrite : GradMode::add;
      float* table = expected.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>();
      for (int r = 0; r < n; ++r) {
        auto [ids, rows, part] = micro(a, r);
        const GradMode m = a == 0 && r == 0 ? GradMode::overwrite : GradMode::add;
        if (tied) accumulate_grad_slab(expected.slab(SlabKind::embedding), el, part.data(), el, m);
        else if (m == GradMode::overwrite) std::fill(table, table + V * C, 0.0f);
        embedding_backward(table, rows.data(), ids.data(), int64_t(ids.size()), C, V);
      }
      expected_sq = grad_sum_of_squares(table, V * C);
      // This rank's micro-batch: the other slabs too (finish_step needs every slab), then the table.
      for (int64_t l = 0; l < cfg.num_layers; ++l) {
        const SlabLayout& ll = actual.layout(SlabKind::layer, l);
        dp.slab(SlabKind::layer, l, actual.layer(l), ll, random_slab(ll, seed_of(a, me) + 9).data(), ll, mode);
      }
      const SlabLayout& hl = actual.layout(SlabKind::head);
      dp.slab(SlabKind::head, 0, actual.slab(SlabKind::head), hl, random_slab(hl, seed_of(a, me) + 3).data(), hl, mode);
      auto [ids, dx0, part] = micro(a, me);
      // The executor's halves (ops/embedding.h): the rows of each present id, then their add at the owners.
      const TokenGroups g = group_tokens_by_id(ids.data(), int64_t(ids.size()), V);
      const int64_t P = int64_t(g.present.size());
      std::vector<float> rows(size_t(P * C));
      embedding_grad_rows(rows.data(), dx0.data(), g.start.data(), g.order.data(), P, C);
      dp.embedding(actual.slab(SlabKind::embedding), el, tied ? part.data() : nullptr, rows.data(), g.present.data(), P,
                   mode);
    }
    dp.finish_step(partials);
    double got_sq = 0;
    for (int64_t l = 0; l < cfg.num_layers; ++l) partials.set(SlabKind::layer, l, 0.0);  // the table's alone
    partials.set(SlabKind::head, 0, 0.0);
    got_sq = partials.sum_of_squares();
    EXPECT_EQ(0, std::memcmp(&got_sq, &expected_sq, sizeof(double)))
        << "rank " << me << " of " << n << (tied ? ", tied" : ", untied") << ": " << got_sq << " vs " << expected_sq;
    allgather_shards(comm, actual.slab(SlabKind::embedding), el, dp.shards(SlabKind::embedding, 0));
    EXPECT_EQ(0, std::memcmp(actual.slab(SlabKind::embedding), expected.slab(SlabKind::embedding), el.bytes()))
        << "rank " << me << " of " << n << (tied ? ", tied" : ", untied") << ": the table differs";
  }
}


// Whether any page wholly inside [p, p + bytes) is resident (mincore).
bool any_page_resident(const uint8_t* p, size_t bytes) {
  const uintptr_t b = align_up(reinterpret_cast<uintptr_t>(p), kPageAlign);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) / kPageAlign * kPageAlign;
  if (e <= b) return false;
  std::vector<unsigned char> in((e - b) / kPageAlign);
  EXPECT_EQ(0, mincore(reinterpret_cast<void*>(b), e - b, in.data()));
  for (unsigned char c : in)
    if (c & 1) return true;
  return false;
}

TEST(DataParallelGrads, ShardedMastersLeaveOtherRanksPagesAndGatherWholeOnRankZero) {
  // bf16 compute: after the compute copy is made, a rank keeps the layers' and head's masters of its own chunks
  // (the others' pages given back) and the embedding's whole; gather_masters makes rank 0's whole again, bitwise.
  const Comm& comm = Comm::world();
  const int me = comm.rank();
  testing::SmallShape shape;
  shape.vocab = 1031, shape.hidden = 136, shape.intermediate = 401, shape.layers = 3;
  const ModelConfig cfg = testing::small_model_config(ModelType::qwen3, shape);
  ModelSlabs params(cfg), original(cfg), copy(cfg, DType::bf16), grads(cfg, DType::f32, Fill::none);
  init_random(params, 7);
  init_random(original, 7);
  DataParallelGrads dp(comm, grads);
  HybridAdamW opt(params, grads, AdamWConfig{}, &dp.owned_ranges());
  dp.attach(opt, params, &copy);
  ASSERT_TRUE(dp.masters_sharded());
  make_compute_copy(copy, params);
  dp.release_unowned_masters(params);

  size_t kept = params.layout(SlabKind::embedding).bytes();
  auto each_sharded = [&](auto&& fn) {
    for (int64_t l = 0; l < cfg.num_layers; ++l) fn(SlabKind::layer, l);
    fn(SlabKind::head, int64_t(0));
  };
  each_sharded([&](SlabKind kind, int64_t layer) {
    const SlabLayout& layout = params.layout(kind, layer);
    const auto [lo, hi] = owned_bytes(layout, dp.shards(kind, layer), me);
    kept += hi - lo;
    const uint8_t* slab = params.slab(kind, layer);
    EXPECT_EQ(0, std::memcmp(slab + lo, original.slab(kind, layer) + lo, hi - lo)) << "rank " << me << ": own masters";
    EXPECT_FALSE(any_page_resident(slab, lo)) << "rank " << me << " layer " << layer << ": pages before its shard";
    EXPECT_FALSE(any_page_resident(slab + hi, layout.bytes() - hi)) << "rank " << me << ": pages after its shard";
    if (comm.size() > 1 && layout.bytes() > 4 * kPageAlign * size_t(comm.size()))  // some whole page was released
      EXPECT_LT(hi - lo, layout.bytes()) << "rank " << me << " owns all of layer " << layer;
  });
  EXPECT_EQ(kept, dp.master_bytes_kept(params));
  EXPECT_EQ(0, std::memcmp(params.slab(SlabKind::embedding), original.slab(SlabKind::embedding),
                           params.layout(SlabKind::embedding).bytes()));

  dp.gather_masters(params);
  if (me == 0)
    each_sharded([&](SlabKind kind, int64_t layer) {
      const size_t bytes = params.layout(kind, layer).bytes();
      EXPECT_EQ(0, std::memcmp(params.slab(kind, layer), original.slab(kind, layer), bytes))
          << "rank 0 of " << comm.size() << ": gathered masters of slab " << layer << " differ";
    });
}

TEST(Launcher, LocalRankIsTheRankOnThisHost) {
  // Rank r of a host opens its GPU r (train/trainer.cpp): on one host, under mpirun (dist_exchange.ranksN) or srun
  // (make srun-check), the launcher's local rank is the world rank; without a launcher 0.
  const Comm& comm = Comm::world();
  EXPECT_EQ(launcher_local_rank(), comm.rank());
  EXPECT_EQ(launcher_world_size(), comm.size());
  if (comm.size() == 1 && !std::getenv("OMPI_COMM_WORLD_LOCAL_RANK") && !std::getenv("MPI_LOCALRANKID") &&
      !std::getenv("SLURM_LOCALID")) {
    setenv("SLURM_LOCALID", "3", 1);  // srun's variable: the fourth task on its node
    EXPECT_EQ(launcher_local_rank(), 3);
    unsetenv("SLURM_LOCALID");
  }
}

}  // namespace
}  // namespace lt
