#include "exec/working_set.h"

#include <algorithm>
#include <charconv>
#include <fmt/format.h>
#include <numeric>

#include "core/aligned.h"
#include "core/error.h"
#include "exec/step_schedule.h"

namespace lt {
namespace {

constexpr unsigned bit(StreamKind k) { return 1u << unsigned(k); }

// Whether x and y may not share memory: their lifetimes overlap, or y is downloaded (the d2h stream reads
// it) and ends in the window just before x starts — its download may still be running when x's writer
// starts, and waiting for it would stall the compute stream (the head gradients before B(L-1)).
bool conflict(const DeviceBuffer& x, const DeviceBuffer& y) {
  if (!(y.last_window < x.first_window || x.last_window < y.first_window)) return true;
  const unsigned d2h = bit(StreamKind::d2h);
  if ((y.streams & d2h) && y.last_window + 1 == x.first_window) return true;
  if ((x.streams & d2h) && x.last_window + 1 == y.first_window) return true;
  return false;
}

// First-fit packing of buffers with lifetimes in the given order: each buffer goes at the lowest offset where
// it overlaps no placed buffer it conflicts with. Returns the peak.
size_t first_fit(std::vector<DeviceBuffer>& bufs, const std::vector<size_t>& order) {
  std::vector<size_t> placed;
  size_t peak = 0;
  for (size_t idx : order) {
    DeviceBuffer& x = bufs[idx];
    // Ranges of placed buffers alive at the same time, sorted by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (size_t p : placed) {
      const DeviceBuffer& y = bufs[p];
      if (!conflict(x, y)) continue;
      busy.push_back({y.offset, y.offset + y.bytes});
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (auto [b, e] : busy) {
      if (offset + x.bytes <= b) break;
      offset = std::max(offset, e);
    }
    x.offset = offset;
    placed.push_back(idx);
    peak = std::max(peak, offset + x.bytes);
  }
  return peak;
}

// The packing: first fit in three orders — largest first; by first window (stack-like lifetimes, the device
// boundaries and kept internals, nest without holes that way); longest-lived first — each with ties by size
// and then creation order, keeping the smallest peak (the first on a tie). Deterministic.
void pack(std::vector<DeviceBuffer>& bufs, size_t* peak) {
  std::vector<size_t> base(bufs.size());
  std::iota(base.begin(), base.end(), size_t(0));
  auto by_size = [&](size_t a, size_t b) { return bufs[a].bytes > bufs[b].bytes; };
  auto by_start = [&](size_t a, size_t b) {
    if (bufs[a].first_window != bufs[b].first_window) return bufs[a].first_window < bufs[b].first_window;
    return by_size(a, b);
  };
  auto by_life = [&](size_t a, size_t b) {
    const int la = bufs[a].last_window - bufs[a].first_window, lb = bufs[b].last_window - bufs[b].first_window;
    if (la != lb) return la > lb;
    return by_size(a, b);
  };
  std::vector<size_t> best_offsets;
  *peak = SIZE_MAX;
  for (int k = 0; k < 3; ++k) {
    std::vector<size_t> order = base;
    if (k == 0) std::stable_sort(order.begin(), order.end(), by_size);
    if (k == 1) std::stable_sort(order.begin(), order.end(), by_start);
    if (k == 2) std::stable_sort(order.begin(), order.end(), by_life);
    const size_t p = first_fit(bufs, order);
    if (p < *peak) {
      *peak = p;
      best_offsets.clear();
      for (const DeviceBuffer& b : bufs) best_offsets.push_back(b.offset);
    }
  }
  for (size_t i = 0; i < bufs.size(); ++i) bufs[i].offset = best_offsets[i];
  // Memory reuse: the earlier buffers that overlap x's range (and the latest window they end in).
  for (DeviceBuffer& x : bufs) {
    for (size_t j = 0; j < bufs.size(); ++j) {
      const DeviceBuffer& y = bufs[j];
      if (&x == &y || y.last_window >= x.first_window) continue;
      if (y.offset < x.offset + x.bytes && x.offset < y.offset + y.bytes) {
        x.reuse_after = std::max(x.reuse_after, y.last_window);
        x.previous.push_back(int(j));
      }
    }
  }
}

}  // namespace

std::vector<std::vector<FenceWait>> WorkingSet::fence_waits() const {
  std::vector<std::vector<FenceWait>> out(window_bytes.size());
  for (const DeviceBuffer& x : buffers) {
    if (x.previous.empty()) continue;
    const StreamKind writer = x.first_writer;
    std::vector<FenceWait>& waits = out[size_t(x.first_window)];
    for (int j : x.previous) {
      const DeviceBuffer& y = buffers[size_t(j)];
      for (StreamKind on : {StreamKind::compute, StreamKind::h2d, StreamKind::d2h}) {
        if (on == writer || !(y.streams & bit(on))) continue;
        auto it = std::find_if(waits.begin(), waits.end(),
                               [&](const FenceWait& f) { return f.writer == writer && f.on == on; });
        if (it == waits.end()) waits.push_back(FenceWait{writer, on, y.last_window});
        else it->after = std::max(it->after, y.last_window);
      }
    }
  }
  return out;
}

std::string window_name(int w, int64_t L) {
  if (w < L) return fmt::format("F{}", w);
  if (w == L) return "H";
  return fmt::format("B{}", 2 * L - w);
}

int window_parse(const std::string& s, int64_t L) {
  if (s == "H") return int(L);
  if (s.size() < 2 || (s[0] != 'F' && s[0] != 'B')) return -1;
  int64_t k = -1;
  auto [end, ec] = std::from_chars(s.data() + 1, s.data() + s.size(), k);
  if (ec != std::errc() || end != s.data() + s.size() || k < 0 || k >= L) return -1;
  return s[0] == 'F' ? forward_window(k) : backward_window(L, k);
}

const DeviceBuffer& WorkingSet::buffer(const std::string& tag) const {
  for (const auto& b : buffers)
    if (b.tag == tag) return b;
  LT_FAIL("working set has no buffer '{}'", tag);
}

WorkingSet pack_working_set(const std::vector<StepBuffer>& buffers, int windows) {
  WorkingSet ws;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const StepBuffer& b = buffers[i];
    if (!b.present || b.memory != Memory::device) continue;
    DeviceBuffer d;
    d.tag = b.tag;
    d.bytes = b.bytes;
    d.first_window = b.first_window;
    d.last_window = b.last_window;
    d.streams = b.streams;
    d.first_writer = is_stream(b.first_lane) ? stream_of(b.first_lane) : StreamKind::compute;
    d.source = int(i);
    ws.buffers.push_back(std::move(d));
  }
  pack(ws.buffers, &ws.peak_bytes);
  ws.window_bytes = window_device_bytes(buffers, windows);
  return ws;
}

WorkingSet plan_working_set(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o) {
  return build_step_schedule(cfg, B, T, plan, o).memory;
}

std::vector<double> MemoryTerms::stored_bytes(const Plan& plan) const {
  const int64_t L = int64_t(boundary.size());
  std::vector<double> bytes = fixed;
  for (int w = 0; w < num_windows(); ++w)
    for (int64_t i = 0; i < L; ++i) {
      if (plan.boundary[size_t(i)] == Tier::device && boundary_span[size_t(i)].contains(w))
        bytes[size_t(w)] += boundary[size_t(i)];
      if (plan.keep_internals[size_t(i)] && internals_span[size_t(i)].contains(w)) bytes[size_t(w)] += internals[size_t(i)];
    }
  return bytes;
}

std::vector<double> MemoryTerms::window_bytes(const Plan& plan) const {
  const int64_t L = int64_t(boundary.size());
  bool recomputes = false;
  int64_t depth = 0;
  for (int64_t i = 0; i < L; ++i) {
    recomputes |= !plan.keep_internals[size_t(i)];
    if (!plan.stored(i)) depth = std::max(depth, i - plan.source_below(i));
  }
  std::vector<double> bytes = stored_bytes(plan);
  for (int w = 0; w < num_windows(); ++w) {
    if (recomputes && recompute_span.contains(w)) bytes[size_t(w)] += recompute;
    if (cache_span.contains(w)) bytes[size_t(w)] += cache_slot * double(depth);
  }
  return bytes;
}

MemoryTerms memory_terms(const ModelConfig& cfg, int64_t B, int64_t T, const ExecOptions& o) {
  // Keep-all has every boundary and every layer's internals on the device; the buffers it does not use (the
  // recompute buffers, the cache) are declared all the same, with their spans.
  const int64_t L = cfg.num_layers;
  const StepSchedule s = build_step_schedule(cfg, B, T, Plan::keep_all(L), o);
  MemoryTerms t;
  std::vector<StepBuffer> fixed;
  t.boundary.assign(size_t(L), 0);
  t.boundary_span.assign(size_t(L), WindowSpan{});
  t.internals.assign(size_t(L), 0);
  t.internals_span.assign(size_t(L), WindowSpan{});
  for (const StepBuffer& b : s.buffers) {
    if (b.memory != Memory::device) continue;
    const WindowSpan span{b.first_window, b.last_window};
    switch (b.term) {
      case PlanTerm::fixed:
        fixed.push_back(b);
        break;
      case PlanTerm::boundary:
        t.boundary[size_t(b.index)] = double(b.bytes);
        t.boundary_span[size_t(b.index)] = span;
        break;
      case PlanTerm::internals:
        t.internals[size_t(b.index)] = double(b.bytes);
        t.internals_span[size_t(b.index)] = span;
        break;
      case PlanTerm::recompute:
        LT_CHECK(t.recompute == 0 || (span.first == t.recompute_span.first && span.last == t.recompute_span.last),
                 "memory terms: the compute's recompute buffers must share one span ('{}')", b.tag);
        t.recompute += double(b.bytes);
        t.recompute_span = span;
        break;
      case PlanTerm::cache:
        t.cache_slot = double(b.bytes);
        t.cache_span = span;
        break;
    }
  }
  const std::vector<size_t> f = window_device_bytes(fixed, s.num_windows());
  t.fixed.assign(f.begin(), f.end());
  for (const StepOp& op : s.ops) {
    if (op.kind == OpKind::download_embedding_rows) t.dx0_download = double(op.bytes);
    if (op.kind == OpKind::upload_tokens) t.token_upload = double(op.bytes);
  }
  return t;
}

}  // namespace lt
