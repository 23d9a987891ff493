"""LoRA adapters in PEFT's format for the PyTorch reference (LazyTrain's model/lora.h, model/peft.h).

Each adapted linear y = x Wᵀ + b becomes y + s · (drop(x) Aᵀ) Bᵀ with A [r, in], B [out, r], s = α / r (α / √r with
rsLoRA): PEFT's LoraLayer. The dropout mask is LazyTrain's deterministic one, recomputed here from the same hash
(splitmix64 of the batch key, the layer, the linear and the element), so gradients with dropout compare too.

Files: DIR/adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout, target_modules, use_rslora,
modules_to_save) and DIR/adapter_model.safetensors with base_model.model.<HF name> keys."""
import json
import math
import os

import torch

from safetensors_py import read_safetensors, write_safetensors

PREFIX = "base_model.model."
# model/lora.h's Adapted order: the dropout key of a linear mixes its index (a routed expert's linear is the dense
# MLP's gate_proj / up_proj / down_proj, its key mixed with the expert: expert_key).
ADAPTED = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
           "gate_proj", "up_proj", "down_proj", "gate", "shared_expert.gate_proj", "shared_expert.up_proj",
           "shared_expert.down_proj", "shared_expert_gate"]
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _signed(c):
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x, k):  # logical right shift of int64 tensors holding 64-bit patterns
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64_t(x):
    """splitmix64 of an int64 tensor of 64-bit patterns (wrapping arithmetic)."""
    x = x + _signed(0x9E3779B97F4A7C15)
    x = (x ^ _shr(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _signed(0x94D049BB133111EB)
    return x ^ _shr(x, 31)


def site_key(batch_key, layer, linear, expert=None):
    key = splitmix64(batch_key ^ splitmix64((layer * 32 + ADAPTED.index(linear) + 1) & M64))
    return key if expert is None else splitmix64(key ^ splitmix64(~expert & M64))


def keep_mask(key, rows, cols, p):
    """[rows, cols] bool: element (r, i) kept when lora_keep(key, r·cols + i, p) (model/lora.cpp); rows a count
    (rows 0 .. rows − 1) or a tensor of token indices (an expert's tokens)."""
    if not torch.is_tensor(rows):
        rows = torch.arange(rows, dtype=torch.int64)
    idx = (rows.to(torch.int64)[:, None] * cols + torch.arange(cols, dtype=torch.int64)[None, :]).reshape(-1)
    h = splitmix64_t(torch.full_like(idx, _signed(key)) ^ splitmix64_t(idx))
    u = _shr(h, 40).to(torch.float64) * 2.0 ** -24
    return (u >= float(torch.tensor(p, dtype=torch.float32))).reshape(len(rows), cols)


def load_adapter(d):
    """(config dict, {HF name without the PEFT prefix: f32 tensor})."""
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    if cfg.get("peft_type") != "LORA":
        raise ValueError(f"{d}: peft_type {cfg.get('peft_type')}")
    t, _, _ = read_safetensors(os.path.join(d, "adapter_model.safetensors"))
    out = {}
    for k, v in t.items():
        if not k.startswith(PREFIX):
            raise ValueError(f"{d}: tensor {k} without the {PREFIX} prefix")
        out[k[len(PREFIX):]] = v.to(torch.float32)
    return cfg, out


def scale(cfg):
    r, a = cfg["r"], cfg.get("lora_alpha", 8)
    return a / math.sqrt(r) if cfg.get("use_rslora") else a / r


def attach(P, acfg, A, dtype):
    """Adds the adapter's tensors to P (as leaves that take gradients), replaces the modules_to_save tensors with the
    adapter's, and returns {id(W): (A name, B name, layer, linear)} for the adapted weights."""
    adapters = {}
    for n, t in A.items():
        if n.endswith(".lora_A.weight") or n.endswith(".lora_B.weight"):
            P[n] = t.to(dtype).clone().requires_grad_(True)
        else:  # a whole module trained beside the adapters
            if n not in P:
                raise ValueError(f"adapter module {n} is not a tensor of the model")
            P[n] = t.to(dtype).clone().requires_grad_(True)
    for n in A:
        if not n.endswith(".lora_A.weight"):
            continue
        base = n[: -len(".lora_A.weight")]
        w = base + ".weight"
        parts = base.split(".")
        layer = int(parts[parts.index("layers") + 1])
        linear = "shared_expert." + parts[-1] if parts[-2] == "shared_expert" else parts[-1]
        expert = int(parts[parts.index("experts") + 1]) if "experts" in parts else None
        adapters[id(P[w])] = (n, base + ".lora_B.weight", layer, linear, expert)
    return adapters


def with_lora(lin, P, adapters, acfg, batch_key=0):
    """`lin` (F.linear or the bf16 emulation) with each adapted weight's update added; the adapter's two GEMMs run on
    `lin` too, as LazyTrain's run on its linear op. f(x, w, b, rows): rows, an expert's token indices (x holds their
    rows) for its dropout mask; f.update(x, w, rows) the adapter's update alone (None: no adapter), for the expert
    down projections the reference computes without `lin`."""
    s, p = scale(acfg), float(acfg.get("lora_dropout", 0.0))

    def update(x, w, rows=None):
        ad = adapters.get(id(w))
        if ad is None:
            return None
        an, bn, layer, linear, expert = ad
        xd = x
        if p > 0:
            shape = x.shape
            rows = x.numel() // shape[-1] if rows is None else rows
            m = keep_mask(site_key(batch_key, layer, linear, expert), rows, shape[-1], p).reshape(shape)
            xd = torch.where(m, x * (1.0 / (1.0 - p)), torch.zeros_like(x))
        return lin(lin(xd, P[an]) * s, P[bn])  # the scale on the rank-r intermediate, where LazyTrain applies it

    def f(x, w, b=None, rows=None):
        y = lin(x, w, b)
        u = update(x, w, rows)
        return y if u is None else y + u

    f.update = update
    f.base = lin
    return f


def make_adapter(P, out, r, alpha, targets, rslora, dropout, modules_to_save, gen, base_model=""):
    """A random adapter for model tensors P (B not zero, so it counts): A, B ~ U(-0.5, 0.5)·scale-ish; modules_to_save
    copied from P and perturbed."""
    tensors = {}
    for n, w in P.items():
        if not n.endswith(".weight") or w.dim() != 2:
            continue
        leaf = n[: -len(".weight")].split(".")[-1]
        if ".layers." not in n or leaf not in targets:
            continue
        base = n[: -len(".weight")]
        out_f, in_f = w.shape
        tensors[PREFIX + base + ".lora_A.weight"] = (torch.rand(r, in_f, generator=gen, dtype=torch.float64) - 0.5) / math.sqrt(in_f)
        tensors[PREFIX + base + ".lora_B.weight"] = (torch.rand(out_f, r, generator=gen, dtype=torch.float64) - 0.5) * 0.2
    saved = []
    for m in modules_to_save:
        m = "model.norm" if m == "norm" else m  # the final norm alone (PEFT matches modules_to_save by suffix)
        name = {"embed_tokens": "model.embed_tokens.weight", "lm_head": "lm_head.weight"}.get(m, m + ".weight")
        t = P[name].to(torch.float64)
        tensors[PREFIX + name] = t + 0.01 * (torch.rand(t.shape, generator=gen, dtype=torch.float64) - 0.5)
        saved.append(m)
    os.makedirs(out, exist_ok=True)
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": dropout,
           "target_modules": sorted(targets), "use_rslora": rslora, "bias": "none",
           "modules_to_save": saved or None, "base_model_name_or_path": base_model}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(out, "adapter_model.safetensors"), {k: v.to(torch.float32) for k, v in tensors.items()},
                      dtype="F32")
