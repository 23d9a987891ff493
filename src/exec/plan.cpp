#include "exec/plan.h"

#include <charconv>
#include <filesystem>

#include "core/error.h"
#include "io/json_file.h"

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
  for (Tier b : boundary)
    if (b == t) return true;
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
  LT_CHECK(std::filesystem::exists(spec),
           "policy '{}' is not keep-all, every:K, host:K, nvme:K, nor an existing plan file", spec);
  return from_json(read_json_file(spec), spec, L);
}

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
  return p;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json b = nlohmann::json::array();
  for (Tier t : boundary) b.push_back(tier_name(t));
  return {{"format", "lazytrain-plan"}, {"version", 1}, {"name", name}, {"layers", num_layers()},
          {"boundaries", b}, {"keep_internals", keep_internals}};
}

}  // namespace lt
