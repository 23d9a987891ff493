// exec/weight_buffers.h — which device weight buffer holds which layer, and which acquisitions upload.
//
// One rule, used by the executor and by the planner's simulator (so their h2d bytes agree by construction),
// and counted by the planner's cost model, MILP and DP (plan/cost_model.cpp: backward_weight_upload):
//   * forward: a layer already in a buffer is used there (layers carried over from the previous micro-batch);
//   * backward: until the backward's first upload, any layer the forward left in a buffer is used there (the
//     top weight_buffers layers: the step's first backward windows upload nothing); after it, only the layer
//     acquired last is reused (a layer's recompute-internals and backward share one upload).
//   * an upload goes into the least recently used buffer (its last user finished earliest).
// Why the backward stops reusing after its first upload: later hits would depend on which recompute segments
// evicted what, which makes the planner's byte count non-linear in the plan; before it, the hits depend only
// on the source boundary of each window (source >= L - weight_buffers), a linear term.
#pragma once

#include <cstdint>
#include <vector>

namespace lt {

class WeightBuffers {
 public:
  explicit WeightBuffers(int n);

  // The layers the previous step left, buffer by buffer (-1: none); they are evicted lowest layer first.
  void carry(const std::vector<int64_t>& layers);
  // From here on the backward rule applies.
  void begin_backward() { backward_ = true; }

  struct Slot {
    int buffer = 0;
    bool upload = false;  // the caller uploads the layer into `buffer` (after its previous user is done)
  };
  Slot acquire(int64_t layer);

  int size() const { return int(layer_.size()); }
  const std::vector<int64_t>& layers() const { return layer_; }  // [buffer] the layer it holds (-1: none)

 private:
  std::vector<int64_t> layer_;
  std::vector<int64_t> stamp_;  // [buffer] when it was last acquired
  int64_t clock_ = 0;
  int last_ = -1;
  bool backward_ = false;
  bool backward_uploaded_ = false;
};

}  // namespace lt
