#include "exec/weight_buffers.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace lt {

WeightBuffers::WeightBuffers(int n) : layer_(size_t(n), -1), stamp_(size_t(n), 0) {
  LT_CHECK(n >= 1, "weight buffers: need at least 1, got {}", n);
  for (int b = 0; b < n; ++b) stamp_[size_t(b)] = clock_++;  // round-robin order while all are empty
}

void WeightBuffers::carry(const std::vector<int64_t>& layers) {
  LT_CHECK(layers.size() == layer_.size(), "weight buffers: carried {} layers into {} buffers", layers.size(),
           layer_.size());
  layer_ = layers;
  // Empty buffers are filled first (in index order), then the carried layers are overwritten lowest first:
  // the forward uses them in that order.
  std::vector<int> order(layer_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return layer_[size_t(a)] < layer_[size_t(b)]; });
  for (int b : order) stamp_[size_t(b)] = clock_++;
}

WeightBuffers::Slot WeightBuffers::acquire(int64_t layer) {
  const int n = size();
  int hit = -1;
  if (last_ >= 0 && layer_[size_t(last_)] == layer) hit = last_;
  if (hit < 0 && (!backward_ || !backward_uploaded_))
    for (int b = 0; b < n; ++b)
      if (layer_[size_t(b)] == layer) hit = b;
  Slot s;
  if (hit >= 0) {
    s.buffer = hit;
  } else {
    s.buffer = int(std::min_element(stamp_.begin(), stamp_.end()) - stamp_.begin());
    s.upload = true;
    layer_[size_t(s.buffer)] = layer;
    if (backward_) backward_uploaded_ = true;
  }
  stamp_[size_t(s.buffer)] = clock_++;
  last_ = s.buffer;
  return s;
}

}  // namespace lt
