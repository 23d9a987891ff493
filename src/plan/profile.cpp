#include "plan/profile.h"

#include <cmath>

#include "core/error.h"
#include "io/json_file.h"
#include "model/block.h"

namespace lt {

nlohmann::json Profile::to_json() const {
  nlohmann::json link_j = {{"h2d_gbps", link.h2d_gbps},
                           {"d2h_gbps", link.d2h_gbps},
                           {"h2d_duplex_gbps", link.h2d_duplex_gbps},
                           {"d2h_duplex_gbps", link.d2h_duplex_gbps},
                           {"latency_s", link.latency_s}};
  return {{"format", "lazytrain-profile"},
          {"version", 1},
          {"name", name},
          {"source", source},
          {"model", model},
          {"batch", batch},
          {"seq", seq},
          {"compute", compute},
          {"activations", activations},
          {"layer_kernels", layer_kernels == LayerKernels::cuda ? "cuda" : "cpu"},
          {"forward_s", forward_s},
          {"backward_s", backward_s},
          {"recompute_s", recompute_s},
          {"head_s", head_s},
          {"embed_forward_s", embed_forward_s},
          {"embed_rows_s", embed_rows_s},
          {"embed_backward_s", embed_backward_s},
          {"accumulate_gbps", accumulate_gbps},
          {"optimizer_params_per_s", optimizer_params_per_s},
          {"optimizer_note", optimizer_note},
          {"link", link_j},
          {"nvme_read_gbps", nvme_read_gbps},
          {"nvme_write_gbps", nvme_write_gbps},
          {"nvme_note", nvme_note},
          {"device_memory_bytes", device_memory_bytes},
          {"sustained_tflops", sustained_tflops}};
}

Profile Profile::from_json(const nlohmann::json& j, const std::string& src) {
  LT_CHECK(j.is_object() && j.value("format", "") == "lazytrain-profile",
           "{}: not a LazyTrain profile (expected \"format\": \"lazytrain-profile\"; make one with `lazytrain profile`)",
           src);
  auto num = [&](const char* key, double def) -> double {
    if (!j.contains(key)) return def;
    LT_CHECK(j[key].is_number(), "{}: \"{}\" must be a number", src, key);
    return j[key].get<double>();
  };
  // A count (batch, seq, bytes): a whole number from 0 to 2^53, so the conversion to an integer is defined.
  auto count = [&](const char* key) -> int64_t {
    const double v = num(key, 0);
    LT_CHECK(v >= 0 && v <= 9007199254740992.0 && v == std::floor(v), "{}: \"{}\" is {}, expected a whole number >= 0",
             src, key, v);
    return int64_t(v);
  };
  auto arr = [&](const char* key) {
    LT_CHECK(j.contains(key) && j[key].is_array(), "{}: missing \"{}\" (a list of seconds per layer)", src, key);
    std::vector<double> v;
    for (const auto& x : j[key]) {
      LT_CHECK(x.is_number(), "{}: \"{}\" must hold numbers", src, key);
      v.push_back(x.get<double>());
    }
    return v;
  };
  Profile p;
  p.name = j.value("name", std::string("profile"));
  p.source = j.value("source", src);
  p.model = j.value("model", std::string());
  p.batch = count("batch");
  p.seq = count("seq");
  p.compute = j.value("compute", std::string("f32"));
  p.activations = j.value("activations", std::string("f32"));
  const std::string kernels = j.value("layer_kernels", std::string("cpu"));
  LT_CHECK(kernels == "cpu" || kernels == "cuda" || kernels == "gpu",  // "gpu": the name before it was settled
           "{}: \"layer_kernels\" is '{}' (expected cpu or cuda)", src, kernels);
  p.layer_kernels = kernels == "cpu" ? LayerKernels::cpu : LayerKernels::cuda;
  p.forward_s = arr("forward_s");
  p.backward_s = arr("backward_s");
  p.recompute_s = j.contains("recompute_s") ? arr("recompute_s") : p.forward_s;
  p.head_s = num("head_s", 0);
  p.embed_forward_s = num("embed_forward_s", 0);
  p.embed_rows_s = num("embed_rows_s", 0);  // files before the device half existed: none
  p.embed_backward_s = num("embed_backward_s", 0);
  p.accumulate_gbps = num("accumulate_gbps", 0);
  p.optimizer_params_per_s = num("optimizer_params_per_s", 0);
  p.optimizer_note = j.value("optimizer_note", std::string());
  if (j.contains("link")) {
    const auto& l = j["link"];
    LT_CHECK(l.is_object(), "{}: \"link\" must be an object", src);
    p.link.h2d_gbps = l.value("h2d_gbps", 0.0);
    p.link.d2h_gbps = l.value("d2h_gbps", 0.0);
    p.link.h2d_duplex_gbps = l.value("h2d_duplex_gbps", 0.0);
    p.link.d2h_duplex_gbps = l.value("d2h_duplex_gbps", 0.0);
    p.link.latency_s = l.value("latency_s", 0.0);
  }
  p.nvme_read_gbps = num("nvme_read_gbps", 0);
  p.nvme_write_gbps = num("nvme_write_gbps", 0);
  p.nvme_note = j.value("nvme_note", std::string());
  p.device_memory_bytes = size_t(count("device_memory_bytes"));
  p.sustained_tflops = num("sustained_tflops", 0);
  p.validate(p.num_layers());
  return p;
}

Profile Profile::load(const std::string& path) {
  return with_json_errors(path, [&] { return from_json(read_json_file(path), path); });
}

void Profile::save(const std::string& path) const { write_json_file(path, to_json(), 2); }

void Profile::apply_to(ExecOptions& e, const std::string& activation_dtype, const std::string& what) const {
  if (layer_kernels == LayerKernels::cpu) {
    e.kernels = LayerKernels::cpu;
    e.activations = activation_storage(activation_dtype, e.compute, what);
    return;
  }
  LT_CHECK(activation_dtype == "auto" || activation_dtype == "bf16",
           "{} {}: profile '{}' is of the CUDA block, which stores bf16 activations (use bf16 or auto)", what,
           activation_dtype, name);
  e.kernels = LayerKernels::cuda;
  e.activations = DType::bf16;
}

void Profile::validate(int64_t L) const {
  LT_CHECK(int64_t(forward_s.size()) == L && int64_t(backward_s.size()) == L && int64_t(recompute_s.size()) == L,
           "profile '{}' has times for {} / {} / {} layers (forward / backward / recompute), the model has {}", name,
           forward_s.size(), backward_s.size(), recompute_s.size(), L);
  auto ok = [](double x) { return std::isfinite(x) && x >= 0; };
  for (int64_t l = 0; l < L; ++l)
    LT_CHECK(ok(forward_s[size_t(l)]) && ok(backward_s[size_t(l)]) && ok(recompute_s[size_t(l)]),
             "profile '{}': layer {} has a negative or non-finite time", name, l);
  LT_CHECK(ok(head_s) && ok(embed_forward_s) && ok(embed_rows_s) && ok(embed_backward_s),
           "profile '{}': head/embedding times must be >= 0", name);
  LT_CHECK(link.h2d_gbps > 0 && link.d2h_gbps > 0,
           "profile '{}': link bandwidths must be > 0 GB/s (h2d {}, d2h {})", name, link.h2d_gbps, link.d2h_gbps);
  LT_CHECK(ok(link.h2d_duplex_gbps) && ok(link.d2h_duplex_gbps) && ok(link.latency_s),
           "profile '{}': duplex bandwidths and latency must be >= 0", name);
  LT_CHECK(accumulate_gbps > 0, "profile '{}': accumulate_gbps must be > 0", name);
  LT_CHECK(ok(optimizer_params_per_s) && ok(nvme_read_gbps) && ok(nvme_write_gbps),
           "profile '{}': optimizer and NVMe rates must be >= 0", name);
}

Profile scale_profile(const Profile& p, int64_t B, int64_t T) {
  if (p.batch == B && p.seq == T) return p;
  LT_CHECK(p.batch > 0 && p.seq > 0, "profile '{}' does not say which batch shape it was measured at", p.name);
  Profile q = p;
  const double f = double(B * T) / double(p.batch * p.seq);
  for (auto* v : {&q.forward_s, &q.backward_s, &q.recompute_s})
    for (double& x : *v) x *= f;
  q.head_s *= f;
  q.embed_forward_s *= f;
  q.embed_rows_s *= f;
  q.embed_backward_s *= f;
  q.batch = B;
  q.seq = T;
  q.source += fmt::format("; times scaled x{:.3g} from B={} T={} (linear in tokens{})", f, p.batch, p.seq,
                          T != p.seq ? ", attention's T^2 term not rescaled: measure at this T for accuracy" : "");
  return q;
}

}  // namespace lt
