// The streaming executor: every plan gives the in-memory path's loss and gradients bit for bit; memory
// measured <= budget and within 5% of predicted; too-small budgets refused before any work.
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"
#include "device/device.h"
#include "exec/executor.h"
#include "io/nvme.h"
#include "model/model.h"
#include "ops/embedding.h"
#include "ops/head.h"
#include "testing/grad_check.h"
#include "testing/exec_testing.h"
#include "testing/model_testing.h"

namespace lt {
namespace {

using testing::expect_bitwise_equal;
using testing::nvme_store_for;
using testing::random_batch;
using testing::random_config;
using testing::random_host_plan;
using testing::random_params;
using testing::random_plan;
using testing::with_random_windows;

struct Reference {
  ModelSlabs grads;
  LossResult loss;
};

void check_plan(const ModelConfig& cfg, const ModelSlabs& params, const ModelSlabs& weights, const Batch& batch,
                const Plan& plan, Precision precision, const Reference& ref, LinkSpec link, double budget_slack,
                const std::string& what, int64_t mlp_chunk = 0) {
  ExecOptions o;
  o.compute = precision.compute;
  o.activations = precision.activations;
  o.mlp_chunk_tokens = mlp_chunk;
  const size_t predicted = predict_peak_device_bytes(cfg, batch.B, batch.T, plan, o);
  const size_t budget = size_t(double(predicted) * budget_slack) + 4096;
  auto dev = make_cpu_device(budget, link);
  std::unique_ptr<NvmeStore> nvme = nvme_store_for(cfg, batch, plan, o);
  StreamingExecutor ex(cfg, *dev, o, nvme.get());
  ModelSlabs grads(cfg);
  StepStats st = ex.step(grads, params, weights, batch, plan);
  EXPECT_EQ(st.loss_sum, ref.loss.loss_sum) << what;
  EXPECT_EQ(st.tokens, ref.loss.tokens) << what;
  expect_bitwise_equal(grads, ref.grads, what);
  EXPECT_LE(st.peak_device_bytes, budget) << what;
  EXPECT_LE(std::fabs(double(st.peak_device_bytes) - double(predicted)), 0.05 * double(predicted)) << what;
}

// Every policy (device, host, NVMe tiers, dropped boundaries, kept or recomputed internals, transfer windows)
// against the in-memory path at the same precision: seeds [first, last], activations stored in `act`, the
// architecture by seed when `by_seed` (qwen2, qwen3, llama in turn), else at random.
void every_policy_matches(uint64_t first, uint64_t last, DType act, bool by_seed) {
  for (uint64_t seed = first; seed <= last; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = random_config(rng, by_seed ? int(seed % 3) : -1);
    ModelSlabs params = random_params(cfg, seed * 7);
    Batch batch = random_batch(cfg, rng, seed % 3 == 0);
    const ComputeType ct = seed % 2 == 0 ? ComputeType::bf16 : ComputeType::f32;
    const Precision precision(ct, act);
    ModelSlabs bf16(cfg, DType::bf16);
    const ModelSlabs* weights = &params;
    if (ct == ComputeType::bf16) {
      make_compute_copy(bf16, params);
      weights = &bf16;
    }
    Reference ref{ModelSlabs(cfg), {}};
    ref.loss = model_forward_backward(ref.grads, params, batch, precision);
    const int64_t L = cfg.num_layers;
    std::vector<Plan> plans = {Plan::keep_all(L), Plan::every(L, 1), Plan::every(L, 2), Plan::every(L, 4),
                               Plan::every(L, 3, Tier::host), Plan::every(L, 2, Tier::nvme), random_plan(L, rng),
                               random_plan(L, rng), with_random_windows(Plan::every(L, 1, Tier::host), rng),
                               with_random_windows(random_host_plan(L, rng), rng),
                               with_random_windows(random_host_plan(L, rng), rng)};
    for (const Plan& plan : plans) {
      std::string what = "seed " + std::to_string(seed) + " plan " + plan.to_json().dump();
      // A budget that just fits, and a generous one; a slow link on some cases so transfers and
      // compute really overlap (ordering bugs would show as wrong bits).
      LinkSpec link = seed % 2 == 1 ? LinkSpec{1.0 + double(seed % 3), 2.0, 20e-6} : LinkSpec{};
      check_plan(cfg, params, *weights, batch, plan, precision, ref, link, 1.0, what);
      if (::testing::Test::HasFatalFailure()) return;
      check_plan(cfg, params, *weights, batch, plan, precision, ref, {}, 1.5, what + " (roomy)");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(Executor, EveryPolicyMatchesInMemoryPathBitwise) { every_policy_matches(1, 12, DType::f32, false); }

// bf16 storage (boundaries, kept internals, their host and NVMe copies, the ring): still bitwise the in-memory
// path at the same storage, on each architecture with f32 and bf16 GEMMs.
TEST(Executor, EveryPolicyMatchesInMemoryPathBitwiseWithBf16Activations) {
  every_policy_matches(101, 112, DType::bf16, true);
}

// Bounded layer scratch: the MLP in token chunks of kTokenSlice (here 3 chunks, the last short) gives the
// in-memory path's bits (one chunk) under every kind of plan, at both activation storages, on each
// architecture; and the working copy and backward scratch shrink to one chunk's MLP rows.
TEST(Executor, ChunkedMlpMatchesTheUnchunkedInMemoryPathBitwise) {
  for (uint64_t seed = 201; seed <= 206; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = random_config(rng, int(seed % 3));
    cfg.num_layers = 3;
    cfg.max_position_embeddings = 8192;
    ModelSlabs params = random_params(cfg, seed);
    Batch batch;
    batch.B = 2;
    batch.T = kTokenSlice + 37;  // N = 2 T: chunks of kTokenSlice, kTokenSlice, 74
    for (int64_t i = 0; i < batch.N(); ++i) batch.input_ids.push_back(int32_t(rng.below(uint64_t(cfg.vocab_size))));
    batch.labels = batch.input_ids;
    for (int64_t r = 0; r < batch.B; ++r) batch.labels[size_t(r * batch.T)] = kIgnoreIndex;
    const Precision precision(seed % 2 == 0 ? ComputeType::bf16 : ComputeType::f32,
                              seed < 204 ? DType::bf16 : DType::f32);
    ModelSlabs bf16(cfg, DType::bf16);
    const ModelSlabs* weights = &params;
    if (precision.compute == ComputeType::bf16) {
      make_compute_copy(bf16, params);
      weights = &bf16;
    }
    Reference ref{ModelSlabs(cfg), {}};
    ref.loss = model_forward_backward(ref.grads, params, batch, precision);
    const int64_t L = cfg.num_layers;
    for (const Plan& plan : {Plan::keep_all(L), Plan::every(L, 1), Plan::every(L, 2, Tier::host), random_plan(L, rng)}) {
      const std::string what = "seed " + std::to_string(seed) + " plan " + plan.to_json().dump();
      check_plan(cfg, params, *weights, batch, plan, precision, ref, {}, 1.0, what + " (chunked)", kTokenSlice);
      if (HasFatalFailure()) return;
    }
    ExecOptions whole, chunked;
    whole.activations = chunked.activations = precision.activations;
    chunked.mlp_chunk_tokens = kTokenSlice;
    const Plan every = Plan::every(L, 1);
    const BlockShape s = BlockShape::make(cfg, batch.B, batch.T, precision.activations, kTokenSlice);
    EXPECT_EQ(s.mlp_rows(), kTokenSlice);
    // gate, up, h (their gradients in the backward scratch) for all but one chunk of tokens, less alignment padding
    const size_t saved = 3 * size_t(batch.N() - kTokenSlice) * size_t(cfg.intermediate_size) * 4 - 256;
    EXPECT_GE(plan_working_set(cfg, batch.B, batch.T, every, whole).buffer("working copy").bytes,
              plan_working_set(cfg, batch.B, batch.T, every, chunked).buffer("working copy").bytes + saved);
    EXPECT_GE(plan_working_set(cfg, batch.B, batch.T, every, whole).buffer("backward scratch").bytes,
              plan_working_set(cfg, batch.B, batch.T, every, chunked).buffer("backward scratch").bytes + saved);
  }
}

// The backward starts on the layers the forward left in the weight buffers (exec/weight_buffers.h): with
// keep-all and B buffers it uploads L - B layers, none when B >= L; every plan stays bitwise exact with 1 to
// L + 1 buffers.
TEST(Executor, BackwardReusesTheLayersTheForwardLeftBitwise) {
  for (uint64_t seed = 31; seed <= 34; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = random_config(rng);
    cfg.num_layers = 3 + int64_t(rng.below(3));
    const int64_t L = cfg.num_layers;
    ModelSlabs params = random_params(cfg, seed);
    Batch batch = random_batch(cfg, rng, false);
    Reference ref{ModelSlabs(cfg), {}};
    ref.loss = model_forward_backward(ref.grads, params, batch, ComputeType::f32);
    for (int buffers = 1; buffers <= int(L) + 1; ++buffers)
      for (const Plan& plan : {Plan::keep_all(L), Plan::every(L, 2), random_plan(L, rng)}) {
        ExecOptions o;
        o.weight_buffers = buffers;
        auto dev = make_cpu_device(size_t(256) << 20, seed % 2 ? LinkSpec{2.0, 2.0, 10e-6} : LinkSpec{});
        std::unique_ptr<NvmeStore> nvme = nvme_store_for(cfg, batch, plan, o);
        StreamingExecutor ex(cfg, *dev, o, nvme.get());
        ModelSlabs grads(cfg);
        TraceRecorder trace;
        StepStats st = ex.step(grads, params, params, batch, plan, &trace);
        const std::string what = fmt::format("seed {} plan {} buffers {}", seed, plan.to_json().dump(), buffers);
        EXPECT_EQ(st.loss_sum, ref.loss.loss_sum) << what;
        expect_bitwise_equal(grads, ref.grads, what);
        if (HasFatalFailure()) return;
        if (plan.name != "keep-all") continue;
        int64_t uploads = 0;
        for (const OpRecord& op : trace.ops()) uploads += op.lane == "h2d" && op.name.rfind("h2d W", 0) == 0;
        EXPECT_EQ(uploads, L + std::max<int64_t>(0, L - buffers)) << what;
      }
  }
}

// The embedding backward in its two halves: the device sums dx0 per token id and one row per id present goes down
// (P·C·4 bytes, not dx0's N·C·4), the host adds them — the in-memory path's bits, with ids repeated many times,
// ids seen once, and every token one id.
TEST(Executor, TheEmbeddingRowsGoDownOneRowPerTokenIdPresentBitwise) {
  for (uint64_t seed = 41; seed <= 43; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = random_config(rng);
    const int64_t L = cfg.num_layers, C = cfg.hidden_size;
    ModelSlabs params = random_params(cfg, seed);
    Batch batch = random_batch(cfg, rng, seed == 42);
    for (size_t n = 0; n < batch.input_ids.size(); ++n)  // few ids: 7 of them, and one seen once (seed 41)
      batch.input_ids[n] = seed == 43 ? 5 : int32_t(n % 7);
    if (seed == 41) batch.input_ids.back() = int32_t(cfg.vocab_size - 1);
    const int64_t P = int64_t(group_tokens_by_id(batch.input_ids.data(), batch.N(), cfg.vocab_size).present.size());
    Reference ref{ModelSlabs(cfg), {}};
    ref.loss = model_forward_backward(ref.grads, params, batch, ComputeType::f32);
    for (const Plan& plan : {Plan::keep_all(L), Plan::every(L, 2, Tier::host)}) {
      auto dev = make_cpu_device(size_t(256) << 20, LinkSpec{2.0, 2.0, 10e-6});
      std::unique_ptr<NvmeStore> nvme = nvme_store_for(cfg, batch, plan, ExecOptions{});
      StreamingExecutor ex(cfg, *dev, ExecOptions{}, nvme.get());
      ModelSlabs grads(cfg);
      TraceRecorder trace;
      StepStats st = ex.step(grads, params, params, batch, plan, &trace);
      const std::string what = fmt::format("seed {} plan {}", seed, plan.name);
      EXPECT_EQ(st.loss_sum, ref.loss.loss_sum) << what;
      expect_bitwise_equal(grads, ref.grads, what);
      int seen = 0;
      for (const OpRecord& op : trace.ops()) {
        if (op.name == "d2h embedding rows") {
          EXPECT_EQ(op.bytes, size_t(P * C) * 4) << what;
          EXPECT_LT(op.bytes, size_t(batch.N() * C) * 4) << what;
          ++seen;
        }
        seen += op.name == "embedding rows" && op.lane == "compute";
      }
      EXPECT_EQ(seen, 2) << what;
    }
  }
}

// Micro-batches of one optimizer step (same weights, same version): each step starts on the layers the
// previous backward left in the weight buffers (layers 1 and 0 at least) — and with a resident head on its
// weights — uploads that much less, and gives the in-memory path's bits. A new version (the weights changed)
// or another weights object uploads everything.
TEST(Executor, MicroBatchesStartOnTheCarriedLayersBitwise) {
  for (uint64_t seed = 21; seed <= 26; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = random_config(rng);
    cfg.num_layers = 4 + int64_t(rng.below(3));
    const int64_t L = cfg.num_layers;
    ModelSlabs params = random_params(cfg, seed);
    ModelSlabs other = random_params(cfg, seed);  // equal contents, another object
    const Plan plans[] = {Plan::keep_all(L), Plan::every(L, 2), with_random_windows(Plan::every(L, 1, Tier::host), rng)};
    const Plan& plan = plans[seed % 3];
    ExecOptions o;
    o.weight_buffers = 2 + int(seed % 2);
    o.resident_head = seed % 3 != 1;
    auto dev = make_cpu_device(size_t(256) << 20, seed % 2 ? LinkSpec{2.0, 2.0, 10e-6} : LinkSpec{});
    StreamingExecutor ex(cfg, *dev, o);
    const size_t layer_bytes = params.layout(SlabKind::layer).bytes();
    size_t full = 0;
    Rng shape_rng(seed);
    const Batch shape = random_batch(cfg, shape_rng, false);  // every micro-batch has this B x T
    for (int k = 0; k < 6; ++k) {
      Batch batch = shape;
      for (auto& id : batch.input_ids) id = int32_t(rng.below(uint64_t(cfg.vocab_size)));
      batch.labels = batch.input_ids;
      for (int64_t r = 0; r < batch.B; ++r) batch.labels[size_t(r * batch.T)] = kIgnoreIndex;
      Reference ref{ModelSlabs(cfg), {}};
      ref.loss = model_forward_backward(ref.grads, params, batch, ComputeType::f32);
      const uint64_t version = k < 4 ? 7 : 8;           // k = 4: the weights changed
      const ModelSlabs& w = k == 5 ? other : params;    // k = 5: another object (same version as k = 4)
      ModelSlabs grads(cfg);
      TraceRecorder trace;
      StepStats st = ex.step(grads, params, w, batch, plan, &trace, nullptr, {}, version);
      const std::string what = fmt::format("seed {} plan {} step {}", seed, plan.name, k);
      EXPECT_EQ(st.loss_sum, ref.loss.loss_sum) << what;
      expect_bitwise_equal(grads, ref.grads, what);
      if (HasFatalFailure()) return;
      size_t weights_h2d = 0;  // the layer weights' uploads
      int head_uploads = 0;
      for (const OpRecord& op : trace.ops()) {
        if (op.lane == "h2d" && op.name.rfind("h2d W", 0) == 0) weights_h2d += op.bytes;
        head_uploads += op.lane == "h2d" && op.name == "h2d head";
      }
      EXPECT_EQ(head_uploads, o.resident_head && k >= 1 && k <= 3 ? 0 : 1) << what;
      if (k == 0) full = weights_h2d;
      if (k == 1 || k == 2 || k == 3) {
        EXPECT_LE(weights_h2d + 2 * layer_bytes, full) << what;  // layers 1 and 0 at least: the backward's last
      }
      if (k == 4 || k == 5) {
        EXPECT_EQ(weights_h2d, full) << what;
      }
    }
  }
}

// Transfer windows: written and read back by the plan file; refused outside what the ring allows, on a
// tier that has no host copy, or with fractions that do not add up, naming the boundary.
TEST(Plan, TransferWindowsRoundTripAndRefusals) {
  Rng rng(4);
  const int64_t L = 6;
  Plan p = with_random_windows(Plan::every(L, 1, Tier::host), rng);
  p.validate_windows(L, 3);
  Plan q = Plan::from_json(p.to_json(), "plan.json", L);
  q.validate_windows(L, 3);
  ASSERT_EQ(q.offload_parts.size(), size_t(L + 1));
  for (int64_t i = 0; i <= L; ++i) {
    ASSERT_EQ(q.offload_parts[size_t(i)].size(), p.offload_parts[size_t(i)].size()) << i;
    for (size_t k = 0; k < p.offload_parts[size_t(i)].size(); ++k) {
      EXPECT_EQ(q.offload_parts[size_t(i)][k].window, p.offload_parts[size_t(i)][k].window);
      EXPECT_DOUBLE_EQ(q.offload_parts[size_t(i)][k].fraction, p.offload_parts[size_t(i)][k].fraction);
    }
  }
  auto refused = [&](nlohmann::json w, const std::string& want) {
    nlohmann::json j = Plan::every(L, 1, Tier::host).to_json();
    j["windows"] = w;
    try {
      Plan::from_json(j, "plan.json", L).validate_windows(L, 3);
      ADD_FAILURE() << "accepted " << w.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused({{{"boundary", 2}, {"kind", "offload"}, {"window", "F5"}, {"fraction", 1.0}}}, "boundary 2's offload part in window F5");
  refused({{{"boundary", 2}, {"kind", "reload"}, {"window", "F1"}, {"fraction", 1.0}}}, "outside");
  refused({{{"boundary", 2}, {"kind", "offload"}, {"window", "F2"}, {"fraction", 0.5}}}, "sum to 0.5");
  refused({{{"boundary", 6}, {"kind", "offload"}, {"window", "F5"}, {"fraction", 1.0}}}, "boundary 6 is 'device'");
  refused({{{"boundary", 2}, {"kind", "sideways"}, {"window", "F2"}, {"fraction", 1.0}}}, "kind 'sideways'");
  refused({{{"boundary", 2}, {"kind", "offload"}, {"window", "X9"}, {"fraction", 1.0}}}, "'X9' is not a window");
}

TEST(Executor, TooSmallBudgetIsRefusedBeforeAnyWork) {
  Rng rng(99);
  ModelConfig cfg = random_config(rng);
  ModelSlabs params = random_params(cfg, 5);
  Batch batch = random_batch(cfg, rng, false);
  Plan plan = Plan::keep_all(cfg.num_layers);
  ExecOptions o;
  size_t predicted = predict_peak_device_bytes(cfg, batch.B, batch.T, plan, o);
  auto dev = make_cpu_device(predicted / 2);
  StreamingExecutor ex(cfg, *dev, o);
  ModelSlabs grads(cfg);
  try {
    ex.step(grads, params, params, batch, plan);
    FAIL() << "expected the plan to be refused";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("keep-all"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MiB of device memory"), std::string::npos) << msg;
  }
  EXPECT_EQ(dev->memory().peak, 0u);  // nothing was allocated
  for (auto& t : grads.named_tensors())
    for (int64_t i = 0; i < t.view.numel(); ++i) ASSERT_EQ(t.view.ptr<float>()[i], 0.f);
}

TEST(Plan, ParseBuiltinsAndFiles) {
  Plan p = Plan::parse("every:3", 7);
  EXPECT_EQ(p.boundary.size(), 8u);
  EXPECT_EQ(p.boundary[3], Tier::device);
  EXPECT_EQ(p.boundary[4], Tier::drop);
  EXPECT_EQ(p.boundary[7], Tier::device);  // the head's input is pinned
  EXPECT_EQ(Plan::parse("host:2", 4).boundary[2], Tier::host);
  EXPECT_THROW(Plan::parse("every:0", 4), Error);
  EXPECT_THROW(Plan::parse("every:x", 4), Error);
  EXPECT_THROW(Plan::parse("sometimes", 4), Error);
  Plan q = Plan::from_json(p.to_json(), "plan.json", 7);
  EXPECT_EQ(q.boundary, p.boundary);
  EXPECT_EQ(q.keep_internals, p.keep_internals);
  nlohmann::json bad = p.to_json();
  bad["keep_internals"][4] = true;  // boundary 4 is dropped
  EXPECT_THROW(Plan::from_json(bad, "plan.json", 7), Error);
  bad = p.to_json();
  bad["boundaries"][2] = "disk";
  EXPECT_THROW(Plan::from_json(bad, "plan.json", 7), Error);
  EXPECT_THROW(Plan::from_json(p.to_json(), "plan.json", 6), Error);  // wrong layer count
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

TEST(WorkingSet, PackingNeverOverlapsLiveBuffersAndReusesDeadOnes) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = random_config(rng);
    cfg.vocab_size = 2000;  // a large head, live only in the head window, so its memory is reused
    const int64_t L = cfg.num_layers;
    for (const Plan& plan : {Plan::keep_all(L), Plan::every(L, 2), random_plan(L, rng)}) {
      WorkingSet ws = plan_working_set(cfg, 2, 16, plan, ExecOptions{});
      size_t static_sum = 0, max_window = 0;
      for (size_t w : ws.window_bytes) max_window = std::max(max_window, w);
      for (const auto& a : ws.buffers) {
        static_sum += a.bytes;
        EXPECT_LE(a.offset + a.bytes, ws.peak_bytes) << a.tag;
        EXPECT_EQ(a.offset % kDeviceAlign, 0u) << a.tag;
        for (const auto& b : ws.buffers) {
          if (&a == &b) continue;
          bool live_together = !(a.last_window < b.first_window || b.last_window < a.first_window);
          bool share_memory = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
          EXPECT_FALSE(live_together && share_memory) << a.tag << " and " << b.tag << " overlap";
        }
      }
      EXPECT_GE(ws.peak_bytes, max_window);
      EXPECT_LT(ws.peak_bytes, static_sum) << "nothing was reused for plan " << plan.name;
    }
  }
}

}  // namespace
}  // namespace lt
