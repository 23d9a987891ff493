// exec/plan.h — what the streaming executor does with each activation: the policy of one step.
//
// Boundaries 0..L: boundary i is the input of layer i (boundary 0 = the embedding output, boundary L =
// the final hidden state fed to the head). For each boundary the plan picks a tier:
//   device   kept in device memory from its forward until its layer's backward
//   host     copied to host memory in the forward, fetched back for the backward
//   nvme     copied to host, written to the NVMe store, read back and fetched for the backward
//   drop     freed after use; rebuilt in the backward by recomputing forward from the nearest stored
//            boundary below (boundary 0 is rebuilt from the token ids by the embedding lookup)
// Boundary L is consumed by the head right after the forward, so it is always "device".
// Per layer, keep_internals keeps every activation the layer's backward needs, so that layer does no
// recompute; it requires the layer's input boundary not to be dropped.
//
// Built-in policies: keep-all, every:K, host:K, nvme:K (boundaries i % K == 0 stored on that tier,
// the rest dropped); or a JSON plan file (docs/plan-format.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lt {

enum class Tier : uint8_t { device, host, nvme, drop };

// Part of a host-tier boundary's copy placed in a window of the step (window indices as the working set's:
// F(l) = l, H = L, B(k) = 2L - k), carrying `fraction` of its bytes. The parts of one copy are in window
// order and their fractions sum to 1.
struct TransferPart {
  int window = 0;
  double fraction = 1.0;
};
const char* tier_name(Tier t);
Tier tier_parse(const std::string& s, const std::string& where);

struct Plan {
  std::string name;                 // "keep-all", "every:4", "lazytrain", a file name
  std::vector<Tier> boundary;       // [L + 1]
  std::vector<bool> keep_internals; // [L]
  // When host-tier copies run (a plan file's "windows"; docs/plan-format.md). Empty, or [L + 1] with an
  // empty list for a boundary whose copy runs in its natural window: the offload (device to host) right
  // after the boundary is produced, the reload (host to device) in the window before its backward.
  std::vector<std::vector<TransferPart>> offload_parts, reload_parts;
  // The planner's MLP chunk (tokens, a multiple of kTokenSlice; model/block.h), a plan file's
  // "mlp_chunk_tokens": what the executor runs with when the user does not say (0: not given). Memory only:
  // every chunk gives the same bits.
  int64_t mlp_chunk_tokens = 0;

  int64_t num_layers() const { return int64_t(keep_internals.size()); }
  bool stored(int64_t i) const { return boundary[size_t(i)] != Tier::drop; }
  // Nearest stored boundary at or below i (boundary 0 counts as stored: the embedding rebuilds it).
  int64_t source_below(int64_t i) const;
  // Throws naming the offending boundary or layer if the plan is inconsistent for L layers.
  void validate(int64_t L) const;
  // Whether a boundary the executor places (1 .. L-1) is on tier t: boundary 0, the embedding's output, stays on
  // the host whatever the plan says (nvme:K names it on NVMe), and boundary L on the device.
  bool uses(Tier t) const;
  // Throws unless the transfer parts fit a boundary ring of `ring` slots: an offload within F(i) ..
  // F(i + ring - 2), a reload within B(i) - (ring - 1) .. B(i) - 1 and not before H (boundary 0: natural).
  void validate_windows(int64_t L, int ring) const;
  bool has_windows() const { return !offload_parts.empty() || !reload_parts.empty(); }

  static Plan keep_all(int64_t L);
  static Plan every(int64_t L, int64_t K, Tier tier = Tier::device);
  // "keep-all", "every:K", "host:K", "nvme:K", or a path to a plan JSON file.
  static Plan parse(const std::string& name_or_file, int64_t L);
  static Plan from_json(const nlohmann::json& j, const std::string& source, int64_t L);
  nlohmann::json to_json() const;
};

}  // namespace lt
