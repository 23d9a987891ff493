#include "exec/plan.h"

#include <charconv>
#include <cmath>
#include <fmt/format.h>
#include <filesystem>

#include "core/error.h"
#include "exec/working_set.h"
#include "io/json_file.h"
#include "io/paths.h"

namespace lt {

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::device: return "device";
    case Tier::host: return "host";
    case Tier::nvme: return "nvme";
    case Tier::drop: return "drop";
  }
  return "?";
}

Tier tier_parse(const std::string& s, const std::string& where) {
  if (s == "device") return Tier::device;
  if (s == "host") return Tier::host;
  if (s == "nvme") return Tier::nvme;
  if (s == "drop" || s == "recompute") return Tier::drop;
  LT_FAIL("{}: tier '{}' is not one of device, host, nvme, drop", where, s);
}

int64_t Plan::source_below(int64_t i) const {
  while (i > 0 && !stored(i)) --i;
  return i;
}

bool Plan::uses(Tier t) const {
  for (size_t i = 1; i + 1 < boundary.size(); ++i)
    if (boundary[i] == t) return true;
  return false;
}

void Plan::validate(int64_t L) const {
  LT_CHECK(int64_t(keep_internals.size()) == L, "plan '{}' has keep_internals for {} layers, the model has {}", name,
           keep_internals.size(), L);
  LT_CHECK(int64_t(boundary.size()) == L + 1, "plan '{}' has {} boundaries, the model needs {} (layers + 1)", name,
           boundary.size(), L + 1);
  LT_CHECK(boundary[size_t(L)] == Tier::device,
           "plan '{}': boundary {} (the head's input) must be 'device', not '{}'", name, L, tier_name(boundary[size_t(L)]));
  for (int64_t l = 0; l < L; ++l)
    LT_CHECK(!keep_internals[size_t(l)] || stored(l),
             "plan '{}': layer {} keeps its internals but its input boundary {} is dropped", name, l, l);
}

void Plan::validate_windows(int64_t L, int ring) const {
  auto check = [&](const std::vector<std::vector<TransferPart>>& parts, const char* kind, bool offload) {
    if (parts.empty()) return;
    LT_CHECK(int64_t(parts.size()) == L + 1, "plan '{}': {} windows for {} boundaries, the model has {}", name, kind,
             parts.size(), L + 1);
    for (int64_t i = 0; i <= L; ++i) {
      const auto& ps = parts[size_t(i)];
      if (ps.empty()) continue;
      const Tier t = boundary[size_t(i)];
      LT_CHECK(t == Tier::host || (!offload && i == 0 && t == Tier::drop),
               "plan '{}': boundary {} is '{}' but has {} windows (only host-tier copies are placed)", name, i,
               tier_name(t), kind);
      int lo, hi;
      if (offload) {
        lo = int(i), hi = int(std::min<int64_t>(i + ring - 2, L - 1));
      } else {
        hi = int(2 * L - i) - 1;
        lo = i == 0 ? hi : std::max(int(L), hi - (ring - 2));
      }
      double sum = 0;
      int prev = -1;
      for (const TransferPart& p : ps) {
        LT_CHECK(p.window >= lo && p.window <= hi,
                 "plan '{}': boundary {}'s {} part in window {} is outside {}..{} (what a boundary ring of {} slots "
                 "allows)", name, i, kind, window_name(p.window, L), window_name(lo, L), window_name(hi, L), ring);
        LT_CHECK(p.window > prev, "plan '{}': boundary {}'s {} parts must be in increasing window order, one per window",
                 name, i, kind);
        LT_CHECK(p.fraction > 0 && p.fraction <= 1, "plan '{}': boundary {}'s {} part has fraction {} (expected (0, 1])",
                 name, i, kind, p.fraction);
        prev = p.window;
        sum += p.fraction;
      }
      LT_CHECK(std::abs(sum - 1.0) < 1e-4, "plan '{}': boundary {}'s {} fractions sum to {}, not 1", name, i, kind, sum);
    }
  };
  check(offload_parts, "offload", true);
  check(reload_parts, "reload", false);
}

Plan Plan::keep_all(int64_t L) {
  Plan p;
  p.name = "keep-all";
  p.boundary.assign(size_t(L + 1), Tier::device);
  p.keep_internals.assign(size_t(L), true);
  return p;
}

Plan Plan::every(int64_t L, int64_t K, Tier tier) {
  LT_CHECK(K >= 1, "every:K needs K >= 1, got {}", K);
  Plan p;
  p.name = (tier == Tier::device ? "every:" : std::string(tier_name(tier)) + ":") + std::to_string(K);
  p.boundary.resize(size_t(L + 1));
  for (int64_t i = 0; i <= L; ++i) p.boundary[size_t(i)] = i % K == 0 ? tier : Tier::drop;
  p.boundary[size_t(L)] = Tier::device;
  p.keep_internals.assign(size_t(L), false);
  return p;
}

Plan Plan::parse(const std::string& spec, int64_t L) {
  if (spec == "keep-all") return keep_all(L);
  for (auto [prefix, tier] : {std::pair{"every:", Tier::device}, {"host:", Tier::host}, {"nvme:", Tier::nvme}}) {
    std::string_view p(prefix);
    if (spec.rfind(p, 0) == 0) {
      int64_t K = 0;
      auto digits = std::string_view(spec).substr(p.size());
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), K);
      LT_CHECK(ec == std::errc() && end == digits.data() + digits.size() && K >= 1,
               "policy '{}': expected {}K with K a positive integer", spec, prefix);
      return every(L, K, tier);
    }
  }
  LT_CHECK(path_exists(spec),
           "policy '{}' is not keep-all, every:K, host:K, nvme:K, nor an existing plan file", spec);
  return with_json_errors(spec, [&] { return from_json(read_json_file(spec), spec, L); });
}

namespace {

// The plan file's "windows" (written by `lazytrain plan --out`): host-tier offload and reload parts. NVMe
// entries (nvme_write, nvme_read) are accepted and not used: the executor paces its NVMe lane itself, and
// the offload/reload entries of NVMe-tier boundaries (their d2h/h2d legs) run where that path runs them.
void parse_windows(Plan& p, const nlohmann::json& w, const std::string& source, int64_t L) {
  LT_CHECK(w.is_array(), "{}: \"windows\" must be a list of {{boundary, kind, window, fraction}}", source);
  p.offload_parts.assign(size_t(L + 1), {});
  p.reload_parts.assign(size_t(L + 1), {});
  for (size_t k = 0; k < w.size(); ++k) {
    const auto& e = w[k];
    LT_CHECK(e.is_object() && e.contains("boundary") && e["boundary"].is_number_integer() && e.contains("kind") &&
                 e["kind"].is_string() && e.contains("window") && e["window"].is_string(),
             "{}: windows[{}] needs boundary (an integer), kind and window (strings)", source, k);
    const int64_t i = e["boundary"].get<int64_t>();
    LT_CHECK(i >= 0 && i <= L, "{}: windows[{}]: boundary {} is not in 0..{}", source, k, i, L);
    const std::string kind = e["kind"].get<std::string>(), wname = e["window"].get<std::string>();
    LT_CHECK(kind == "offload" || kind == "reload" || kind == "nvme_write" || kind == "nvme_read",
             "{}: windows[{}]: kind '{}' is not offload, reload, nvme_write or nvme_read", source, k, kind);
    const int win = window_parse(wname, L);
    LT_CHECK(win >= 0, "{}: windows[{}]: '{}' is not a window (F0..F{}, H, B{}..B0)", source, k, wname, L - 1, L - 1);
    LT_CHECK(e.contains("fraction") && e["fraction"].is_number(), "{}: windows[{}] needs a numeric fraction", source, k);
    if (kind.rfind("nvme", 0) == 0 || p.boundary[size_t(i)] == Tier::nvme) continue;
    if (e["fraction"].get<double>() <= 1e-9) continue;  // a solver's zero
    auto& dst = kind == "offload" ? p.offload_parts : p.reload_parts;
    dst[size_t(i)].push_back(TransferPart{win, e["fraction"].get<double>()});
  }
  auto all_empty = [](const std::vector<std::vector<TransferPart>>& v) {
    for (const auto& x : v)
      if (!x.empty()) return false;
    return true;
  };
  if (all_empty(p.offload_parts)) p.offload_parts.clear();
  if (all_empty(p.reload_parts)) p.reload_parts.clear();
}

}  // namespace

Plan Plan::from_json(const nlohmann::json& j, const std::string& source, int64_t L) {
  LT_CHECK(j.is_object(), "{}: a plan is a JSON object", source);
  Plan p;
  p.name = j.value("name", std::filesystem::path(source).filename().string());
  LT_CHECK(j.contains("boundaries") && j["boundaries"].is_array(),
           "{}: missing \"boundaries\" (a list of L + 1 tiers: device, host, nvme or drop)", source);
  for (size_t i = 0; i < j["boundaries"].size(); ++i) {
    const auto& b = j["boundaries"][i];
    LT_CHECK(b.is_string(), "{}: boundaries[{}] must be a string tier", source, i);
    p.boundary.push_back(tier_parse(b.get<std::string>(), fmt::format("{}: boundaries[{}]", source, i)));
  }
  if (j.contains("keep_internals")) {
    LT_CHECK(j["keep_internals"].is_array(), "{}: \"keep_internals\" must be a list of booleans", source);
    for (size_t i = 0; i < j["keep_internals"].size(); ++i) {
      LT_CHECK(j["keep_internals"][i].is_boolean(), "{}: keep_internals[{}] must be true or false", source, i);
      p.keep_internals.push_back(j["keep_internals"][i].get<bool>());
    }
  } else {
    p.keep_internals.assign(p.boundary.empty() ? 0 : p.boundary.size() - 1, false);
  }
  p.validate(L);
  if (j.contains("windows")) parse_windows(p, j["windows"], source, L);
  if (j.contains("mlp_chunk_tokens")) {
    const auto& c = j["mlp_chunk_tokens"];
    LT_CHECK(c.is_number_integer() && c.get<int64_t>() >= 0 && c.get<int64_t>() % kTokenSlice == 0,
             "{}: \"mlp_chunk_tokens\" must be a multiple of {} (0: the MLP in one chunk), got {}", source,
             kTokenSlice, c.dump());
    p.mlp_chunk_tokens = c.get<int64_t>();
  }
  return p;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json b = nlohmann::json::array();
  for (Tier t : boundary) b.push_back(tier_name(t));
  nlohmann::json j = {{"format", "lazytrain-plan"}, {"version", 1}, {"name", name}, {"layers", num_layers()},
                      {"boundaries", b}, {"keep_internals", keep_internals}};
  if (mlp_chunk_tokens > 0) j["mlp_chunk_tokens"] = mlp_chunk_tokens;
  if (has_windows()) {
    const int64_t L = num_layers();
    nlohmann::json w = nlohmann::json::array();
    for (auto [parts, kind] : {std::pair{&offload_parts, "offload"}, {&reload_parts, "reload"}})
      for (size_t i = 0; i < parts->size(); ++i)
        for (const TransferPart& p : (*parts)[i])
          w.push_back({{"boundary", i}, {"kind", kind}, {"window", window_name(p.window, L)}, {"fraction", p.fraction}});
    j["windows"] = w;
  }
  return j;
}

}  // namespace lt
