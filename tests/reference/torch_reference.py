#!/usr/bin/python3
"""LazyTrain's independent PyTorch reference for whole-model correctness tests.

Runs with Debian's PyTorch (/usr/bin/python3; torch 1.13, numpy). No transformers, no safetensors package: the
Qwen2 / Qwen3 / Llama decoder forward is written here in plain torch following transformers' modeling code
(modeling_qwen2.py, modeling_qwen3.py, modeling_llama.py), and autograd gives the gradients.

Subcommands (see tests/reference/README.md):
  make     write a tiny random Hugging Face model directory (config.json + safetensors) and a batch.json
  grad     loss and every parameter's gradient for a batch, gradients as F32 safetensors under HF names
  compare  relative-L2 comparison of two gradient files (and optionally two losses)
"""

import argparse
import json
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the python3 on PATH may not be Debian's
    sys.exit("torch_reference.py: `import torch` failed; run it with /usr/bin/python3 (Debian's python3-torch)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_py import SafetensorsError, read_safetensors, write_safetensors  # noqa: E402

IGNORE_INDEX = -100

ARCHS = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}

ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class RefError(Exception):
    pass


# --------------------------------------------------------------------------------------------------------
# config.json


def make_config(arch, layers, hidden, heads, kv_heads, head_dim, inter, vocab, tie, dtype,
                rms_eps, rope_theta, max_pos, attention_bias, mlp_bias, style):
    """config.json as transformers (4.4x/4.5x) writes it for the model_type (json sort_keys, indent 2).
    style "v5" writes the newer layout: "dtype" instead of "torch_dtype" and rope_theta inside
    "rope_parameters" (what transformers >= 4.56 / 5 writes)."""
    c = {
        "architectures": [ARCHS[arch]],
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": max_pos,
        "model_type": arch,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": rms_eps,
        "rope_scaling": None,
        "rope_theta": rope_theta,
        "tie_word_embeddings": tie,
        "torch_dtype": dtype,
        "transformers_version": "4.51.3",
        "use_cache": True,
        "vocab_size": vocab,
    }
    if arch == "llama":
        # LlamaConfig defaults bos 1 / eos 2.
        c.update({"bos_token_id": 1, "eos_token_id": 2, "head_dim": head_dim, "attention_bias": attention_bias,
                  "mlp_bias": mlp_bias, "pretraining_tp": 1})
    else:
        # Real Qwen ids (151643...) do not fit a tiny vocabulary: use the last ids.
        c.update({"bos_token_id": vocab - 2 if arch == "qwen3" else vocab - 1, "eos_token_id": vocab - 1,
                  "max_window_layers": layers, "sliding_window": None, "use_sliding_window": False})
        if arch == "qwen3":
            c.update({"head_dim": head_dim, "attention_bias": attention_bias})
    if style == "v5":
        c["dtype"] = c.pop("torch_dtype")
        c["rope_parameters"] = {"rope_theta": c.pop("rope_theta"), "rope_type": "default"}
        c.pop("rope_scaling")
        c["transformers_version"] = "4.57.1"
    return c


class Cfg:
    """What the forward needs, parsed from a config.json with transformers' defaults for missing keys."""

    def __init__(self, c):
        self.raw = c
        mt = c.get("model_type")
        if mt not in ARCHS:
            raise RefError(f"model_type {mt!r} not supported (qwen2, qwen3, llama)")
        self.arch = mt
        self.vocab = int(c["vocab_size"])
        self.hidden = int(c["hidden_size"])
        self.inter = int(c["intermediate_size"])
        self.layers = int(c["num_hidden_layers"])
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
        hd = c.get("head_dim") if mt != "qwen2" else None  # Qwen2 has no head_dim: hidden / heads
        self.head_dim = int(hd) if hd else self.hidden // self.heads
        if self.heads % self.kv_heads:
            raise RefError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise RefError("head_dim must be even for RoPE")
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        rp = c.get("rope_parameters") or {}
        rs = c.get("rope_scaling") or {}
        rtype = rp.get("rope_type", rp.get("type")) or rs.get("rope_type", rs.get("type")) or "default"
        if rtype != "default":
            raise RefError(f"rope type {rtype!r} not supported by the reference")
        self.rope_theta = float(rp.get("rope_theta", c.get("rope_theta", 10000.0)))
        # All three configs default tie_word_embeddings to False.
        self.tie = bool(c.get("tie_word_embeddings", False))
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise RefError(f"hidden_act {act!r} not supported")
        if c.get("use_sliding_window", False):
            raise RefError("use_sliding_window true is not supported by the reference")
        if mt == "qwen2":
            self.qkv_bias, self.o_bias, self.mlp_bias = True, False, False
        elif mt == "qwen3":
            ab = bool(c.get("attention_bias", False))
            self.qkv_bias, self.o_bias, self.mlp_bias = ab, ab, False
        else:
            ab = bool(c.get("attention_bias", False))
            self.qkv_bias, self.o_bias, self.mlp_bias = ab, ab, bool(c.get("mlp_bias", False))
        self.qk_norm = mt == "qwen3"

    def param_shapes(self):
        """Ordered {HF name: shape} of every parameter (model order)."""
        C, D, H, K, I, V = self.hidden, self.head_dim, self.heads, self.kv_heads, self.inter, self.vocab
        s = {"model.embed_tokens.weight": (V, C)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = (C,)
            s[p + "self_attn.q_proj.weight"] = (H * D, C)
            if self.qkv_bias:
                s[p + "self_attn.q_proj.bias"] = (H * D,)
            s[p + "self_attn.k_proj.weight"] = (K * D, C)
            if self.qkv_bias:
                s[p + "self_attn.k_proj.bias"] = (K * D,)
            s[p + "self_attn.v_proj.weight"] = (K * D, C)
            if self.qkv_bias:
                s[p + "self_attn.v_proj.bias"] = (K * D,)
            s[p + "self_attn.o_proj.weight"] = (C, H * D)
            if self.o_bias:
                s[p + "self_attn.o_proj.bias"] = (C,)
            if self.qk_norm:
                s[p + "self_attn.q_norm.weight"] = (D,)
                s[p + "self_attn.k_norm.weight"] = (D,)
            s[p + "post_attention_layernorm.weight"] = (C,)
            s[p + "mlp.gate_proj.weight"] = (I, C)
            if self.mlp_bias:
                s[p + "mlp.gate_proj.bias"] = (I,)
            s[p + "mlp.up_proj.weight"] = (I, C)
            if self.mlp_bias:
                s[p + "mlp.up_proj.bias"] = (I,)
            s[p + "mlp.down_proj.weight"] = (C, I)
            if self.mlp_bias:
                s[p + "mlp.down_proj.bias"] = (C,)
        s["model.norm.weight"] = (C,)
        if not self.tie:
            s["lm_head.weight"] = (V, C)
        return s


# --------------------------------------------------------------------------------------------------------
# Hugging Face model directory I/O


def shard_name(k, n):
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def save_model_dir(out, config, params, st_dtype, shards):
    if shards > len(params):
        raise RefError(f"--shards {shards} > {len(params)} tensors")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    names = list(params)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), params, dtype=st_dtype)
        return
    # Contiguous groups in model order, cut where the running byte count passes k/N of the total
    # (each shard gets at least one tensor), like transformers' max_shard_size splitting.
    itemsize = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}[st_dtype]
    sizes = [params[n].numel() * itemsize for n in names]
    total = sum(sizes)
    groups, cur, run = [], [], 0
    for i, n in enumerate(names):
        cur.append(n)
        run += sizes[i]
        left_names = len(names) - i - 1
        left_groups = shards - len(groups) - 1
        if left_groups > 0 and (run >= total * (len(groups) + 1) / shards or left_names == left_groups):
            groups.append(cur)
            cur = []
    groups.append(cur)
    assert len(groups) == shards and all(groups), [len(g) for g in groups]
    weight_map = {}
    written = 0
    for k, g in enumerate(groups, 1):
        fn = shard_name(k, shards)
        written += write_safetensors(os.path.join(out, fn), {n: params[n] for n in g}, dtype=st_dtype)
        for n in g:
            weight_map[n] = fn
    assert written == total
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def load_model_dir(d):
    """Returns (Cfg, {name: tensor}, {name: stored dtype}). Single file or sharded with an index."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = Cfg(json.load(f))
    idx = os.path.join(d, "model.safetensors.index.json")
    tensors, dtypes = {}, {}
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        wm = index["weight_map"]
        for fn in sorted(set(wm.values())):
            t, dt, meta = read_safetensors(os.path.join(d, fn))
            for n in t:
                if wm.get(n) != fn:
                    raise RefError(f"{fn}: tensor {n} not mapped to this file in the index")
                if n in tensors:
                    raise RefError(f"tensor {n} appears in two shards")
            tensors.update(t)
            dtypes.update(dt)
        missing = set(wm) - set(tensors)
        if missing:
            raise RefError(f"index names tensors absent from the shards: {sorted(missing)[:5]}")
    else:
        single = os.path.join(d, "model.safetensors")
        if not os.path.exists(single):
            raise RefError(f"{d}: neither model.safetensors nor model.safetensors.index.json")
        tensors, dtypes, _ = read_safetensors(single)
    shapes = cfg.param_shapes()
    extra = sorted(set(tensors) - set(shapes))
    # A tied checkpoint may still carry lm_head.weight (some exporters write it); transformers ignores it.
    if cfg.tie and "lm_head.weight" in extra:
        extra.remove("lm_head.weight")
        tensors.pop("lm_head.weight")
    missing = sorted(set(shapes) - set(tensors))
    if missing or extra:
        raise RefError(f"tensor names: missing {missing[:8]} unexpected {extra[:8]}")
    for n, s in shapes.items():
        if tuple(tensors[n].shape) != tuple(s):
            raise RefError(f"{n}: shape {tuple(tensors[n].shape)}, config implies {tuple(s)}")
    return cfg, {n: tensors[n] for n in shapes}, dtypes


# --------------------------------------------------------------------------------------------------------
# The forward (transformers semantics)


def rms_norm(x, w, eps):
    # HF: x.to(float32); x * rsqrt(mean(x^2) + eps); weight * x.to(input_dtype). Statistics in at least f32
    # (a float64 reference keeps float64 rather than narrowing to f32).
    in_dt = x.dtype
    up = torch.promote_types(in_dt, torch.float32)
    h = x.to(up)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(in_dt)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(cfg, position_ids, dtype, rope_precision):
    """cos, sin [B, T, D]. HF: inv_freq = 1/(base^(arange(0,D,2).float()/D)) in f32, freqs = inv_freq x pos
    in f32, emb = cat(freqs, freqs), cos/sin in f32, then cast to the activation dtype. rope_precision
    "exact" does the same in float64 (for studying the f32 rounding only; not the HF semantics)."""
    D = cfg.head_dim
    rdt = torch.float32 if rope_precision == "hf" else torch.float64
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).to(rdt) / D))
    freqs = position_ids[:, :, None].to(rdt) * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def repeat_kv(x, n_rep):
    b, k, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, k, n_rep, t, d).reshape(b, k * n_rep, t, d)


def attention_mask(position_ids, packed):
    """Boolean [B, 1, T, T], True where query t may attend to key s. Causal; when packed, also same
    document, a document starting at each position whose position id is 0 (transformers' packed-sequence
    detection from position_ids / flash-attention varlen semantics)."""
    B, T = position_ids.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    m = causal[None].expand(B, T, T)
    if packed:
        starts = (position_ids == 0)
        starts[:, 0] = True
        doc = torch.cumsum(starts.to(torch.int64), dim=1)
        m = m & (doc[:, :, None] == doc[:, None, :])
    return m[:, None]


def linear(x, P, name, has_bias):
    return F.linear(x, P[name + ".weight"], P[name + ".bias"] if has_bias else None)


def forward(cfg, P, input_ids, position_ids, packed, rope_precision="hf"):
    """Logits [B, T, V] in the compute dtype of P."""
    dt = P["model.embed_tokens.weight"].dtype
    B, T = input_ids.shape
    H, K, D = cfg.heads, cfg.kv_heads, cfg.head_dim
    x = F.embedding(input_ids, P["model.embed_tokens.weight"])
    cos, sin = rope_cos_sin(cfg, position_ids, dt, rope_precision)
    cos, sin = cos[:, None], sin[:, None]  # unsqueeze_dim=1 over [B, heads, T, D]
    mask = attention_mask(position_ids, packed)
    scaling = D ** -0.5
    sm_dt = torch.promote_types(dt, torch.float32)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        residual = x
        h = rms_norm(x, P[p + "input_layernorm.weight"], cfg.eps)
        q = linear(h, P, p + "self_attn.q_proj", cfg.qkv_bias).view(B, T, H, D)
        k = linear(h, P, p + "self_attn.k_proj", cfg.qkv_bias).view(B, T, K, D)
        v = linear(h, P, p + "self_attn.v_proj", cfg.qkv_bias).view(B, T, K, D)
        if cfg.qk_norm:  # Qwen3: RMSNorm over head_dim, per head, before RoPE
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], cfg.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, H // K)
        v = repeat_kv(v, H // K)
        s = torch.matmul(q, k.transpose(2, 3)) * scaling
        s = s.masked_fill(~mask, float("-inf"))
        a = F.softmax(s, dim=-1, dtype=sm_dt).to(dt)
        o = torch.matmul(a, v).transpose(1, 2).reshape(B, T, H * D)
        x = residual + linear(o, P, p + "self_attn.o_proj", cfg.o_bias)
        residual = x
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], cfg.eps)
        g = linear(h, P, p + "mlp.gate_proj", cfg.mlp_bias)
        u = linear(h, P, p + "mlp.up_proj", cfg.mlp_bias)
        x = residual + linear(F.silu(g) * u, P, p + "mlp.down_proj", cfg.mlp_bias)
    x = rms_norm(x, P["model.norm.weight"], cfg.eps)
    lm = P["model.embed_tokens.weight"] if cfg.tie else P["lm_head.weight"]
    return F.linear(x, lm)


def causal_lm_loss(logits, labels):
    """transformers ForCausalLMLoss: logits upcast (at least f32), shift, CE with ignore_index -100,
    mean over counted tokens. Returns (loss, counted)."""
    V = logits.shape[-1]
    lg = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32)).reshape(-1, V)
    tg = labels[:, 1:].reshape(-1)
    n = int((tg != IGNORE_INDEX).sum())
    if n == 0:
        raise RefError("no counted tokens in labels[:, 1:]")
    loss = F.cross_entropy(lg, tg, ignore_index=IGNORE_INDEX, reduction="sum") / n
    return loss, n


# --------------------------------------------------------------------------------------------------------
# make


def random_params(cfg, gen):
    """Seeded random weights (f32), scaled so activations are O(1), the initial loss is a little above
    log(V), and every gradient is non-trivial: linear weights N(0, std 1/sqrt(fan_in)) (o/down: half that std),
    embedding N(0, 1/C) (so a tied lm_head gives O(1) logits), norm weights 1 + 0.1 N(0,1), biases 0.1 N(0,1)."""
    P = {}
    for n, shape in cfg.param_shapes().items():
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if n.endswith("norm.weight"):
            t = 1.0 + 0.1 * z
        elif n.endswith(".bias"):
            t = 0.1 * z
        elif n in ("model.embed_tokens.weight", "lm_head.weight"):
            t = z / math.sqrt(cfg.hidden)
        else:
            fan_in = shape[1]
            scale = 0.5 if (n.endswith("o_proj.weight") or n.endswith("down_proj.weight")) else 1.0
            t = z * (scale / math.sqrt(fan_in))
        P[n] = t.contiguous()
    return P


def make_batch(gen, B, T, V, docs):
    ids = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    labels = ids.clone()
    # A masked "prompt": the first 3 tokens of each row (labels[:, 0] never counts anyway after the shift),
    # plus 2 random positions inside the row when long enough (a masked turn in the middle).
    n_prompt = 3 if T > 4 else 1
    labels[:, :n_prompt] = IGNORE_INDEX
    if T > 10:
        for b in range(B):
            pos = torch.randint(n_prompt + 1, T, (2,), generator=gen)
            labels[b, pos] = IGNORE_INDEX
    out = {"input_ids": ids.tolist()}
    if docs > 1:
        # Packed rows: `docs` documents per row with per-document positions starting at 0.
        pids = []
        for _ in range(B):
            cuts = sorted(torch.randperm(T - 1, generator=gen)[: docs - 1].add(1).tolist())
            row, start = [], 0
            for c in cuts + [T]:
                row += list(range(c - start))
                start = c
            pids.append(row)
        # As transformers' DataCollatorWithFlattening: a document's first token is not a target (no
        # prediction across the document boundary).
        for b in range(B):
            for t in range(1, T):
                if pids[b][t] == 0:
                    labels[b, t] = IGNORE_INDEX
        out["position_ids"] = pids
    if T >= 2 and int((labels[:, 1:] != IGNORE_INDEX).sum()) == 0:
        labels[0, T - 1] = ids[0, T - 1]  # always at least one counted token
    out["labels"] = labels.tolist()
    return out


def cmd_make(a):
    if a.vocab < 3:
        raise RefError("--vocab must be >= 3")
    if a.seq < 2 or a.batch < 1:
        raise RefError("--seq must be >= 2 and --batch >= 1")
    if not 1 <= a.docs <= a.seq:
        raise RefError("--docs must be in [1, seq]")
    if a.shards < 1:
        raise RefError("--shards must be >= 1")
    if a.hidden % a.heads and a.head_dim is None:
        raise RefError("--hidden not divisible by --heads: give --head-dim (qwen3/llama)")
    hd = a.head_dim if a.head_dim is not None else a.hidden // a.heads
    if a.arch == "qwen2" and hd * a.heads != a.hidden:
        raise RefError("qwen2 has no head_dim key: head_dim must be hidden / heads")
    if a.arch == "qwen2" and (a.attention_bias or a.mlp_bias):
        raise RefError("qwen2 biases are fixed (q/k/v yes, o no, mlp no)")
    if a.arch == "qwen3" and a.mlp_bias:
        raise RefError("qwen3 has no mlp_bias")
    kv = a.kv_heads if a.kv_heads is not None else a.heads
    eps = a.rms_norm_eps if a.rms_norm_eps is not None else (1e-5 if a.arch == "llama" else 1e-6)
    theta = a.rope_theta if a.rope_theta is not None else (500000.0 if a.arch == "llama" else 1000000.0)
    conf = make_config(a.arch, a.layers, a.hidden, a.heads, kv, hd, a.intermediate, a.vocab, a.tie, a.dtype,
                       eps, theta, a.max_position_embeddings, a.attention_bias, a.mlp_bias, a.config_style)
    cfg = Cfg(conf)
    gen = torch.Generator().manual_seed(a.seed)
    P = random_params(cfg, gen)
    save_model_dir(a.out, conf, P, ST_DTYPE[a.dtype], a.shards)
    batch = make_batch(gen, a.batch, a.seq, a.vocab, a.docs)
    with open(os.path.join(a.out, "batch.json"), "w") as f:
        f.write(json.dumps(batch, separators=(",", ":")) + "\n")
    n_params = sum(t.numel() for t in P.values())
    print(json.dumps({"out": a.out, "arch": a.arch, "params": n_params, "tensors": len(P),
                      "counted": sum(1 for r in batch["labels"] for l in r[1:] if l != IGNORE_INDEX)}))


# --------------------------------------------------------------------------------------------------------
# grad


def load_batch(path, V):
    with open(path) as f:
        b = json.load(f)
    ids = torch.tensor(b["input_ids"], dtype=torch.int64)
    labels = torch.tensor(b.get("labels", b["input_ids"]), dtype=torch.int64)
    if ids.dim() != 2 or labels.shape != ids.shape:
        raise RefError("batch: input_ids and labels must be equal-shape [B, T] lists")
    if ids.min() < 0 or ids.max() >= V:
        raise RefError(f"batch: input_ids outside [0, {V})")
    ok = (labels == IGNORE_INDEX) | ((labels >= 0) & (labels < V))
    if not bool(ok.all()):
        raise RefError(f"batch: labels must be -100 or in [0, {V})")
    packed = "position_ids" in b
    if packed:
        pos = torch.tensor(b["position_ids"], dtype=torch.int64)
        if pos.shape != ids.shape:
            raise RefError("batch: position_ids shape differs from input_ids")
    else:
        pos = torch.arange(ids.shape[1], dtype=torch.int64)[None].expand_as(ids)
    return ids, labels, pos, packed


def cmd_grad(a):
    cdt = {"float32": torch.float32, "float64": torch.float64}[a.dtype]
    cfg, W, _ = load_model_dir(a.model)
    ids, labels, pos, packed = load_batch(a.batch, cfg.vocab)
    P = {n: t.to(cdt).clone().requires_grad_(True) for n, t in W.items()}
    logits = forward(cfg, P, ids, pos, packed, a.rope_precision)
    loss, n = causal_lm_loss(logits, labels)
    loss.backward()
    grads = {}
    for name, t in P.items():
        g = t.grad if t.grad is not None else torch.zeros_like(t)
        grads[name] = g.detach().to(torch.float32)
    d = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(d, exist_ok=True)
    write_safetensors(a.out, grads, dtype="F32")
    if a.logits_out:
        write_safetensors(a.logits_out, {"logits": logits.detach().to(torch.float32)}, dtype="F32")
    print(json.dumps({"loss": float(loss.item()), "tokens": n}))


# --------------------------------------------------------------------------------------------------------
# compare


def cmd_compare(a):
    A, _, _ = read_safetensors(a.ours)
    Bt, _, _ = read_safetensors(a.ref)
    fails = []
    missing = sorted(set(Bt) - set(A))
    extra = sorted(set(A) - set(Bt))
    for n in missing:
        fails.append(f"{n}: missing from {a.ours}")
    for n in extra:
        fails.append(f"{n}: not in the reference {a.ref}")
    rows = []
    worst = 0.0
    names = [n for n in Bt if n in A]
    # Model order when the names look like HF names, otherwise sorted.
    names.sort(key=_name_key)
    for n in names:
        x = A[n].to(torch.float64)
        y = Bt[n].to(torch.float64)
        if tuple(x.shape) != tuple(y.shape):
            fails.append(f"{n}: shape {tuple(x.shape)} vs reference {tuple(y.shape)}")
            rows.append((n, f"{tuple(x.shape)}!={tuple(y.shape)}", float("nan"), float("nan"), "FAIL"))
            continue
        diff = x - y
        ref_norm = float(y.norm())
        dn = float(diff.norm())
        rel = dn / ref_norm if ref_norm > 0 else dn  # an all-zero reference: absolute L2
        mad = float(diff.abs().max()) if diff.numel() else 0.0
        finite = bool(torch.isfinite(x).all())
        ok = finite and math.isfinite(rel) and rel <= a.rtol_l2
        if not ok:
            fails.append(f"{n}: rel L2 {rel:.3e} > {a.rtol_l2:.1e}" if finite else f"{n}: non-finite values")
        worst = max(worst, rel) if math.isfinite(rel) else float("inf")
        rows.append((n, "x".join(map(str, y.shape)) or "scalar", rel, mad, "ok" if ok else "FAIL"))
    w = max([len(r[0]) for r in rows] + [4])
    print(f"{'name':<{w}}  {'shape':>12}  {'rel_l2':>10}  {'max_abs':>10}")
    for n, s, rel, mad, st in rows:
        print(f"{n:<{w}}  {s:>12}  {rel:10.3e}  {mad:10.3e}  {st}")
    loss_msg = ""
    if a.loss_ours is not None or a.loss_ref is not None:
        if a.loss_ours is None or a.loss_ref is None:
            fails.append("loss: give both --loss-ours and --loss-ref")
        else:
            lr = abs(a.loss_ours - a.loss_ref) / max(abs(a.loss_ref), 1e-30)
            ok = math.isfinite(a.loss_ours) and lr <= a.loss_rtol
            loss_msg = f"; loss ours {a.loss_ours:.9g} ref {a.loss_ref:.9g} rel {lr:.3e}"
            print(f"loss: ours {a.loss_ours:.9g} ref {a.loss_ref:.9g} rel {lr:.3e} (tol {a.loss_rtol:.1e})"
                  f"  {'ok' if ok else 'FAIL'}")
            if not ok:
                fails.append(f"loss: rel {lr:.3e} > {a.loss_rtol:.1e}")
    for f_ in fails:
        print("FAIL " + f_)
    status = "FAIL" if fails else "PASS"
    print(f"{status}: {len(rows)} tensors compared, {len(fails)} failures, worst rel L2 {worst:.3e} "
          f"(tol {a.rtol_l2:.1e}){loss_msg}")
    return 1 if fails else 0


def _name_key(n):
    if n.startswith("model.embed_tokens"):
        return (0, 0, n)
    if n.startswith("model.layers."):
        parts = n.split(".")
        try:
            return (1, int(parts[2]), n)
        except ValueError:
            return (1, 0, n)
    if n.startswith("model.norm"):
        return (2, 0, n)
    return (3, 0, n)


# --------------------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("make", help="write a tiny random HF model directory + batch.json")
    m.add_argument("--arch", required=True, choices=sorted(ARCHS))
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, required=True)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--hidden", type=int, default=48)
    m.add_argument("--heads", type=int, default=6)
    m.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    m.add_argument("--head-dim", type=int, default=None, help="default: hidden / heads (qwen2: must be)")
    m.add_argument("--intermediate", type=int, default=96)
    m.add_argument("--vocab", type=int, default=101)
    m.add_argument("--tie", dest="tie", action="store_true", default=False)
    m.add_argument("--no-tie", dest="tie", action="store_false")
    m.add_argument("--attention-bias", action="store_true", help="qwen3/llama: bias on q,k,v,o")
    m.add_argument("--mlp-bias", action="store_true", help="llama: bias on gate,up,down")
    m.add_argument("--rms-norm-eps", type=float, default=None, help="default 1e-6 (qwen), 1e-5 (llama)")
    m.add_argument("--rope-theta", type=float, default=None, help="default 1e6 (qwen), 5e5 (llama)")
    m.add_argument("--max-position-embeddings", type=int, default=4096)
    m.add_argument("--batch", type=int, default=2)
    m.add_argument("--seq", type=int, default=37)
    m.add_argument("--docs", type=int, default=1, help=">1: packed rows, batch.json gets position_ids")
    m.add_argument("--dtype", choices=sorted(ST_DTYPE), default="float32", help="stored weight dtype")
    m.add_argument("--shards", type=int, default=1)
    m.add_argument("--config-style", choices=["classic", "v5"], default="classic",
                   help="v5: 'dtype' and 'rope_parameters' keys (newer transformers)")

    g = sub.add_parser("grad", help="loss + all parameter gradients (F32 safetensors)")
    g.add_argument("--model", required=True)
    g.add_argument("--batch", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--dtype", choices=["float32", "float64"], default="float64", help="compute dtype")
    g.add_argument("--rope-precision", choices=["hf", "exact"], default="hf",
                   help="hf: cos/sin in f32 as transformers (default); exact: float64")
    g.add_argument("--logits-out", default=None, help="also write logits [B, T, V] (F32) here")

    c = sub.add_parser("compare", help="relative-L2 comparison of two gradient files")
    c.add_argument("--ours", required=True)
    c.add_argument("--ref", required=True)
    c.add_argument("--rtol-l2", type=float, required=True)
    c.add_argument("--loss-ours", type=float, default=None)
    c.add_argument("--loss-ref", type=float, default=None)
    c.add_argument("--loss-rtol", type=float, default=1e-5)

    a = ap.parse_args(argv)
    try:
        if a.cmd == "make":
            return cmd_make(a) or 0
        if a.cmd == "grad":
            return cmd_grad(a) or 0
        return cmd_compare(a)
    except (RefError, SafetensorsError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"torch_reference.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
