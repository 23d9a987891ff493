// exec/step_schedule.h — one streamed step of a plan as data: every operation, on its lane, in the order it is
// issued, with what it waits for; and every buffer the step uses, with its bytes and lifetime.
//
// build_step_schedule() is the one place that decides a step's order: which weight buffer a layer goes to, which
// ring slot a boundary takes, when each transfer is issued, what waits for what. Its readers:
//   the executor (exec/executor.cpp)   issues the operations to the Device and its host lanes, one by one;
//   the simulator (plan/simulate.cpp)  times the same operations with a profile's costs;
//   the memory model (working_set.h)   packs the device buffers by their lifetimes: the block the executor
//                                      allocates, the peak the planner constrains (memory_terms: its linear form).
//
//   ops      op 0 .. op n-1, issue order; op.deps ⊂ earlier ops; op.window: the window open when it was issued
//   buffers  tag, memory (device / host / NVMe), bytes, lifetime = first .. last window of the ops using it,
//            widened to the span it reserves (weight buffers, the ring, scratch: the whole step)
//
//   window:   F0  F1 ... F(L-1)   H    B(L-1) ... B0
//   compute:  fwd fwd    fwd     head  bwd        bwd     (recompute before a bwd that needs it)
//   h2d:      W1  W2 ... head         W  x(reload) ...     (the next layer's weights while this one computes)
//   d2h:          x(offload) ...  dHead dW(L-1)   ... dW0 dE rows
//   host:                         acc   acc       ... acc  embedding backward
//   (compute's last op, the embedding rows: dx0[N, C] summed per token id into rows[P, C], P ids present, so that
//   P rows go down instead of N; the host adds them into the table — ops/embedding.h's two halves)
//   (a frozen run's backward ends at lowest_backward_layer, model/finetune.h: its windows below are empty)
//
// Lanes: the device's three streams (compute, h2d, d2h), each in order; three host threads, each in order — the host
// lane (gradient accumulation, the embedding backward), the optimizer lane (the previous step's update, slab by
// slab, pipelined into this forward) and the NVMe lane; and the issuing thread (the embedding lookup), whose work
// is done before anything issued after it. An operation starts when its lane is free and its deps have finished.
// Every dep is an earlier operation, and each lane runs in issue order, so a schedule cannot deadlock.
//
// Window fences: a device buffer packed into memory an earlier buffer used waits, at its first writer, for the
// streams that touched the earlier one (WorkingSet::fence_waits); those waits are deps like any other.
//
// Legend: L layers, N = B*T tokens, C hidden.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "exec/working_set.h"
#include "model/config.h"
#include "model/layer_compute.h"
#include "model/layout.h"

namespace lt {

enum class Lane : uint8_t { compute = 0, h2d = 1, d2h = 2, host = 3, optimizer = 4, nvme = 5, issue = 6 };
constexpr int kNumLanes = 7;
const char* lane_name(Lane lane);  // "compute", "h2d", "d2h", "host", "optimizer", "nvme", "issue"
inline bool is_stream(Lane lane) { return lane <= Lane::d2h; }
inline StreamKind stream_of(Lane lane) { return StreamKind(uint8_t(lane)); }

// Which of the embedding's rows an update covers (OpKind::update of the embedding slab).
enum class UpdateRows : uint8_t { all, batch, others };

enum class OpKind : uint8_t {
  update,               // optimizer: the previous step's update of one slab (`slab`, `layer`)
  embed,                // issue: the embedding lookup of the token ids into boundary 0 on the host (`out`)
  upload_tokens,        // h2d: positions, targets, document ids, the embedding's token groups (and the RoPE table)
  upload_weights,       // h2d: layer `layer`'s compute copy into weight buffer `slot` (`out`)
  upload_head,          // h2d: the head's weights (with the tied embedding) into `out`
  upload_boundary,      // h2d: boundary `layer` (bytes at `offset` of it) from the host (`in`) into `out`
  forward,              // compute: layer `layer`, boundary `in` -> `out`, its internals into `internals` if kept
  recompute,            // compute: layer `layer`'s output again for a recompute segment, `in` -> `out`
  recompute_internals,  // compute: the internals of a layer that did not keep them, from boundary `in`
  backward_mlp,         // compute: the MLP half's gradients into `grads`, from the output's gradient `in`
  backward_attention,   // compute: the attention half's into `grads` and the input's gradient `out`, from `in`
  head,                 // compute: loss and gradients of the head from boundary L (`in`), dx into `out`
  download_boundary,    // d2h: boundary `layer` (bytes at `offset`) from `in` to the host (`out`)
  nvme_write,           // nvme: boundary `layer` from write staging `in` to its region `out`
  nvme_read,            // nvme: boundary `layer` from its region `in` into read staging `out`
  download_loss,        // d2h: the CUDA head's loss
  download_head_grads,  // d2h: the head's gradients into their host staging `out`
  download_grads,       // d2h: layer `layer`'s gradients, bytes at `offset` (an MLP or attention half), from
                        //      `in` to host staging `out`, or straight into the host gradients (out < 0)
  embedding_rows,       // compute: dx0 (`in`, [N, C] f32) summed per present token id into `out` ([P, C], P <= N),
                        //          by the token groups uploaded with the tokens (`aux`, TokenBuffer's layout)
  download_embedding_rows,  // d2h: the embedding rows `in` to the host (`out`): `bytes` is the bound N·C·4, the
                            //      executor moves the step's P·C·4
  accumulate_head,      // host: the head's gradients (staging `in`) into the host gradients
  accumulate_grads,     // host: layer `layer`'s (staging `in`), or in place (in < 0): their sum of squares
  embedding_backward,   // host: the embedding rows (`in`) added into the embedding table's gradient
};

struct StepOp {
  OpKind kind;
  Lane lane;
  int window = 0;             // the window open when it was issued (exec/working_set.h's indices)
  std::string name;           // as traces show it: "fwd L3", "h2d W3", "d2h dW3 mlp", ...
  int64_t layer = -1;         // the layer, or the boundary of a boundary transfer; -1: none
  SlabKind slab = SlabKind::layer;  // update: which slab
  UpdateRows rows = UpdateRows::all;  // update of the embedding: all its rows, this batch's ids', or the others
  int slot = -1;              // weight buffer, gradient buffer or staging slot index, where one is named
  int in = -1, out = -1;      // buffers read and written (indices into StepSchedule::buffers); -1: none
  int aux = -1;               // head: the f32 widening of its input (an activation gradient buffer)
  int weights = -1;           // compute: the weight buffer it runs on
  int grads = -1;             // backward and head: the gradient buffer it accumulates into
  int internals = -1;         // forward and backward: the layer's kept internals (-1: recomputed)
  size_t offset = 0, bytes = 0;  // copies: the byte range moved (the same offset at both ends)
  int part = -1, parts = 0;   // a boundary copy placed in windows: part `part` of `parts` (-1: the whole copy)
  double fraction = 1.0;      // of the boundary's bytes (parts; 1 for the whole)
  std::vector<int> deps;      // earlier operations it waits for
  std::vector<int> fences;    // ... and the window fences it carries (derived from the memory's packing)
  std::vector<int> waits_for() const;  // deps and fences, ascending
};

// A buffer's plan term: what the planner's linear memory model (memory_terms) charges it to.
enum class PlanTerm : uint8_t {
  fixed,       // every plan has it
  boundary,    // boundary `index` kept in this memory (on the device: index < L; boundary L is fixed)
  internals,   // layer `index` keeps its internals
  recompute,   // some layer recomputes its internals (the compute's recompute buffers)
  cache,       // the recompute cache's slot `index`: a run of more than `index` dropped boundaries
};

enum class Memory : uint8_t { device, host, nvme };

struct StepBuffer {
  std::string tag;        // "weights 1", "boundary 3", "boundary ring 0", "grad staging 1", ...
  Memory memory = Memory::device;
  size_t bytes = 0;       // device: rounded up to kDeviceAlign; NVMe: to kPageAlign
  PlanTerm term = PlanTerm::fixed;
  int64_t index = -1;     // the boundary, layer or slot its tag names
  bool present = true;    // false: declared for the memory model's terms, not used by this plan
  bool bound = false;     // bound to the compute for the whole step (ComputeBinding's buffers, the token ids):
                          // every compute operation may touch it, within the span it reserves
  int compute = -1;       // a compute buffer: its entry in StepSchedule::compute
  int reserve_first = -1, reserve_last = -1;  // windows it is held for whatever uses it (-1: none)
  // Derived from the operations that use it (and the reserve):
  int first_op = -1, last_op = -1;            // the first and last operation using it
  int first_window = -1, last_window = -1;    // its lifetime
  unsigned streams = 0;                       // a bit per StreamKind whose operations touch it
  Lane first_lane = Lane::compute;            // the lane of the first operation using it
  int device_index = -1;                      // device: its entry in StepSchedule::memory.buffers
};

struct StepScheduleOptions {
  bool update = false;          // the previous step's optimizer update runs pipelined into this forward
  bool grads_in_place = false;  // gradients go straight into the host gradients (a step's first micro-batch
                                // without a reducer): the host lane only sums their squares
  std::vector<int64_t> carried; // [weight buffer] the layer the previous micro-batch left there (-1: none)
  bool head_carried = false;    // the head's weights are still on the device (ExecOptions::resident_head)
  bool doc_ids = false;         // the batch carries document ids (packed rows)
  // The embedding's update in two parts (with `update`): the rows of this batch's ids, which the lookup waits for,
  // then after the layers' the rest (HybridAdamW::update_embedding_rows). Not under data parallelism.
  bool split_embedding_update = false;
};

// Whether the step has an embedding gradient (the table is trained: model/finetune.h), and whether its pending
// update is split at the batch's rows (StepScheduleOptions::split_embedding_update): a trained table in one
// process — data parallel, the owners' updated parts are exchanged slab by slab (dist/data_parallel.h).
bool embedding_trained(const ModelConfig& cfg);
inline bool splits_embedding_update(const ModelConfig& cfg, bool data_parallel) {
  return !data_parallel && embedding_trained(cfg);
}

// The device's "tokens" buffer, int32 throughout: positions [N], targets [N], document ids [N] (packed batches);
// then, when the embedding is trained, its backward's token groups (ops/embedding.h group_tokens_by_id): start
// [P + 1] and order [N], at most 2N + 1 entries. Offsets and sizes in int32 elements.
struct TokenBuffer {
  int64_t N = 0;
  bool groups = false;  // the token groups are uploaded (a trained embedding)
  int64_t targets() const { return N; }
  int64_t doc_ids() const { return 2 * N; }
  int64_t group_start() const { return 3 * N; }
  int64_t group_order() const { return 4 * N + 1; }
  size_t bytes() const { return size_t(groups ? 5 * N + 1 : 3 * N) * 4; }
};

struct StepSchedule {
  int64_t L = 0, B = 0, T = 0;
  TokenBuffer tokens;            // the "tokens" buffer's layout
  ExecOptions options;
  StepScheduleOptions schedule_options;
  Plan plan;
  size_t boundary_bytes = 0;     // one boundary [N, C] in the activation storage dtype (unrounded)
  std::vector<ComputeBuffer> compute;  // the layer compute's buffers (its declaration; `present` per buffer below)
  std::vector<StepOp> ops;
  std::vector<StepBuffer> buffers;
  WorkingSet memory;             // the device buffers packed by lifetime, with the fences the ops wait on
  int64_t recompute_depth = 0;   // the longest run of dropped boundaries a backward rebuilds at once
  std::vector<int64_t> weights_after;  // [weight buffer] the layer it holds when the step ends (-1: none)

  int num_windows() const { return int(2 * L + 1); }
  const StepBuffer& buffer(const std::string& tag) const;  // error naming the tag if absent
  int find(const std::string& tag) const;                  // -1 if absent
};

// The step's schedule for `plan` at batch B x T. Throws naming the plan if its windows cannot be issued with the
// boundary ring (Plan::validate_windows) or hold every ring slot at once.
StepSchedule build_step_schedule(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o,
                                 const StepScheduleOptions& so = {});

// What the schedule derives from its operations, again: the buffers' lifetimes and streams, the packed memory and
// the window fences (after a change to the operations).
void finish_schedule(StepSchedule& s);

// Moves operation `op` to just before operation `before` (ops.size(): to the end), issued in `window`, renumbering
// every dep, then finishes the schedule again: what a change of the executor's order does to the step's timeline
// and memory. Throws if an operation would then wait for a later one, or windows would no longer rise in issue order.
void move_operation(StepSchedule& s, int op, int before, int window);

// The present device buffers of `buffers` packed by their lifetimes into one block (exec/working_set.h).
WorkingSet pack_working_set(const std::vector<StepBuffer>& buffers, int windows);

// Device bytes of `buffers` that live in each window (size `windows`): Σ of the present device buffers alive there,
// a downloaded one (touched by the d2h stream) counted one window past its last, which nothing starting then may
// reuse while its download may run. The one function behind every per-window memory figure.
std::vector<size_t> window_device_bytes(const std::vector<StepBuffer>& buffers, int windows);

}  // namespace lt
