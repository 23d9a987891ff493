#!/usr/bin/python3
"""LazyTrain's independent PyTorch reference for whole-model correctness tests.

Runs with Debian's PyTorch (/usr/bin/python3; torch 1.13, numpy). No transformers, no safetensors package: the
Qwen2 / Qwen3 / Llama decoder forward and the Qwen3.5 hybrid (Gated DeltaNet + gated attention) text model are
written here in plain torch following transformers' modeling code (modeling_qwen2.py, modeling_qwen3.py,
modeling_llama.py, modeling_qwen3_5.py), and autograd gives the gradients.

Subcommands (see tests/reference/README.md):
  make             write a tiny random Hugging Face model directory (config.json + safetensors) and a batch.json
  grad             loss and every parameter's gradient for a batch, gradients as F32 safetensors under HF names
  compare          relative-L2 comparison of two gradient files (and optionally two losses)
  selfcheck-delta  the chunked gated delta rule against the step-by-step recurrence (float64), prints PASS
  fdcheck          whole-model autograd gradients against central finite differences (float64)
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
    """st_dtype: one safetensors dtype for all tensors, or a dict name -> dtype."""
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
    itemsize = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}
    sizes = [params[n].numel() * itemsize[st_dtype[n] if isinstance(st_dtype, dict) else st_dtype] for n in names]
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
        gd = {n: st_dtype[n] for n in g} if isinstance(st_dtype, dict) else st_dtype
        written += write_safetensors(os.path.join(out, fn), {n: params[n] for n in g}, dtype=gd)
        for n in g:
            weight_map[n] = fn
    assert written == total
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def load_model_dir(d):
    """Returns (Cfg or Qwen35Cfg, {name: tensor}, {name: stored dtype}). Single file or sharded with an index.
    Tensors the text model does not use (Qwen3.5: model.visual.*, mtp.*) are dropped."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = parse_config(json.load(f))
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
    ignored = getattr(cfg, "is_ignored", None)
    extra = sorted(n for n in set(tensors) - set(shapes) if not (ignored and ignored(n)))
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


# LazyTrain's bf16 GEMM mode, emulated (grad --emulate-bf16). ComputeType::bf16 rounds the two operands of every
# GEMM to bf16 (nearest-even) and accumulates in f32; nothing else is rounded (norms, softmax, attention's QKᵀ/PV,
# conv, the delta rule, gates, embedding lookup, loss stay f32). Its GEMMs are exactly the linear layers
# (src/ops/cpu/linear.cpp) and the head's logits (src/ops/cpu/head.cpp); both follow one pattern, for
# y = x·Wᵀ (+ b):
#   forward   y  = bf16(x) · bf16(W)ᵀ (+ b, the bias f32 and added after the GEMM)
#   backward  dx = bf16(dy) · bf16(W);   dW = bf16(dy)ᵀ · bf16(x);   db = Σ_rows dy (unrounded dy)
# The weight operand is the compute copy: the f32 master rounded to bf16 (matrices only; vectors stay f32), and
# the gradient goes to the master (straight through the rounding). The head: x = the final norm's output (f32),
# dy = dlogits = (softmax − onehot)/count; a tied lm_head is the embedding matrix rounded in this GEMM only (the
# embedding lookup reads the f32 master). Here every product of two bf16 values is exact and the sums are in
# the compute dtype (float64 by default), so what remains between this and LazyTrain is its f32 arithmetic.


def bf16_round(t):
    """t rounded to bf16 (nearest-even) and back, in t's dtype. Through f32 first, as LazyTrain rounds its f32
    values (torch's f64 -> bf16 conversion goes through f32 as well; spelled out so it does not depend on that)."""
    return t.to(torch.float32).to(torch.bfloat16).to(t.dtype)


class Bf16Linear(torch.autograd.Function):
    """F.linear with LazyTrain's bf16 GEMM rounding points in forward and backward (see above)."""

    @staticmethod
    def forward(ctx, x, w, b):
        xr, wr = bf16_round(x), bf16_round(w)
        ctx.save_for_backward(xr, wr)
        ctx.has_bias = b is not None
        y = torch.matmul(xr, wr.t())
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        dyr = bf16_round(dy)
        dx = torch.matmul(dyr, wr) if ctx.needs_input_grad[0] else None
        dw = dyr.reshape(-1, dyr.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1]) if ctx.needs_input_grad[1] else None
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def bf16_linear(x, w, b=None):
    return Bf16Linear.apply(x, w, b)


def gemm_for(emulate_bf16):
    """The linear-layer function the forwards use: F.linear, or bf16_linear (LazyTrain's bf16 GEMM mode)."""
    return bf16_linear if emulate_bf16 else F.linear


# LazyTrain's bf16 activation storage, emulated (grad --emulate-bf16-storage). At --activation-dtype bf16 the
# CPU block (src/model/block.cpp stored_fields) rounds each activation its backward reads to bf16 IN PLACE as soon
# as it is computed, so the rest of the forward, a recompute and the backward all read the rounded value; the
# layer boundaries (the embedding's output and every layer's output) are bf16 buffers. Statistics and gates stay
# f32 (rstd, the L2 norms' inverse norms, lse, Gated DeltaNet's b, a, β, g). keep() is that rounding with the
# gradient passed straight through (the backward differentiates the math at the rounded values). The one place
# autograd would read an exact value where LazyTrain reads the rounded one is attention's backward: its
# D = rowsum(dO ∘ O) reads the stored (rounded) output — attention_core below. Rounded, per layer:
#   boundary x, n1, x_mid, n2, gate, up, h (every layer);
#   attention: q_raw (Qwen3.5: with the gate rows) and k_raw where q/k are normed, q and k after RoPE, v, att;
#   Gated DeltaNet: in_proj_qkv's output, the conv's output, the L2-normalised q and k, z, the delta rule's
#   output and the gated norm's output.


class _KeepBf16(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return bf16_round(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def keep_bf16(x):
    return _KeepBf16.apply(x)


def keep_f32(x):
    return x


def keep_for(emulate_storage):
    """The activation-storage function the forwards use: identity (f32 storage) or keep_bf16."""
    return keep_bf16 if emulate_storage else keep_f32


class _AttentionKeptOut(torch.autograd.Function):
    """Masked softmax attention whose output is kept in bf16 and whose backward reads that kept output, as
    ops/attention.h's backward does (D = rowsum(dO ∘ O) with the stored O; dS = P ∘ (dP − D)). q [B, H, T, D],
    k and v [B, H, T, D] (already repeated over the query heads), mask [B, 1, T, T]."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, sm_dt):
        s = torch.matmul(q, k.transpose(2, 3)) * scale
        p = F.softmax(s.masked_fill(~mask, float("-inf")), dim=-1, dtype=sm_dt).to(q.dtype)
        o = bf16_round(torch.matmul(p, v))
        ctx.save_for_backward(q, k, v, p, o)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, p, o = ctx.saved_tensors
        dv = torch.matmul(p.transpose(2, 3), do)
        dp = torch.matmul(do, v.transpose(2, 3))
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        dq = torch.matmul(ds, k) * ctx.scale
        dk = torch.matmul(ds.transpose(2, 3), q) * ctx.scale
        return dq, dk, dv, None, None, None


def attention_core(q, k, v, mask, scale, sm_dt, keep):
    """softmax(q kᵀ · scale, masked) v; q [B, H, T, D], k, v [B, H, T, D]. With bf16 storage (keep_bf16) the
    output is kept in bf16 and the backward reads it (_AttentionKeptOut)."""
    if keep is keep_bf16:
        return _AttentionKeptOut.apply(q, k, v, mask, scale, sm_dt)
    s = torch.matmul(q, k.transpose(2, 3)) * scale
    p = F.softmax(s.masked_fill(~mask, float("-inf")), dim=-1, dtype=sm_dt).to(q.dtype)
    return torch.matmul(p, v)


def linear(x, P, name, has_bias, lin=F.linear):
    return lin(x, P[name + ".weight"], P[name + ".bias"] if has_bias else None)


def forward(cfg, P, input_ids, position_ids, packed, rope_precision="hf", lin=F.linear, keep=keep_f32):
    """Logits [B, T, V] in the compute dtype of P. lin: the linear layers' (and lm_head's) function; keep: the
    activation storage's (keep_for)."""
    dt = P["model.embed_tokens.weight"].dtype
    B, T = input_ids.shape
    H, K, D = cfg.heads, cfg.kv_heads, cfg.head_dim
    x = keep(F.embedding(input_ids, P["model.embed_tokens.weight"]))
    cos, sin = rope_cos_sin(cfg, position_ids, dt, rope_precision)
    cos, sin = cos[:, None], sin[:, None]  # unsqueeze_dim=1 over [B, heads, T, D]
    mask = attention_mask(position_ids, packed)
    scaling = D ** -0.5
    sm_dt = torch.promote_types(dt, torch.float32)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        residual = x
        h = keep(rms_norm(x, P[p + "input_layernorm.weight"], cfg.eps))
        q = linear(h, P, p + "self_attn.q_proj", cfg.qkv_bias, lin).view(B, T, H, D)
        k = linear(h, P, p + "self_attn.k_proj", cfg.qkv_bias, lin).view(B, T, K, D)
        v = keep(linear(h, P, p + "self_attn.v_proj", cfg.qkv_bias, lin).view(B, T, K, D))
        if cfg.qk_norm:  # Qwen3: RMSNorm over head_dim, per head, before RoPE
            q = rms_norm(keep(q), P[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rms_norm(keep(k), P[p + "self_attn.k_norm.weight"], cfg.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = keep(q * cos + rotate_half(q) * sin)
        k = keep(k * cos + rotate_half(k) * sin)
        k = repeat_kv(k, H // K)
        v = repeat_kv(v, H // K)
        o = attention_core(q, k, v, mask, scaling, sm_dt, keep).transpose(1, 2).reshape(B, T, H * D)
        x = keep(residual + linear(o, P, p + "self_attn.o_proj", cfg.o_bias, lin))
        residual = x
        h = keep(rms_norm(x, P[p + "post_attention_layernorm.weight"], cfg.eps))
        g = keep(linear(h, P, p + "mlp.gate_proj", cfg.mlp_bias, lin))
        u = keep(linear(h, P, p + "mlp.up_proj", cfg.mlp_bias, lin))
        x = keep(residual + linear(keep(F.silu(g) * u), P, p + "mlp.down_proj", cfg.mlp_bias, lin))
    x = rms_norm(x, P["model.norm.weight"], cfg.eps)
    lm = P["model.embed_tokens.weight"] if cfg.tie else P["lm_head.weight"]
    return lin(x, lm)


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
    if a.arch in QWEN35_FORMS:
        return cmd_make_qwen35(a)
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
    logits = model_forward(cfg, P, ids, pos, packed, a.rope_precision, a.delta, a.emulate_bf16,
                           a.emulate_bf16_storage)
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
# Qwen3.5 / Qwen3.6 hybrid text model (transformers models/qwen3_5): Gated DeltaNet ("linear_attention") and
# gated softmax attention ("full_attention") layers, zero-centred RMSNorms. Two checkpoint forms:
#   qwen3_5     text-only: model_type qwen3_5_text, Qwen3_5ForCausalLM, weights under model.
#   qwen3_5_vl  released:  model_type qwen3_5 (text in text_config), Qwen3_5ForConditionalGeneration, text weights
#               under model.language_model., plus model.visual.* and mtp.* that the text model never uses.

QWEN35_FORMS = {
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", "model."),
    "qwen3_5_vl": ("qwen3_5", "Qwen3_5ForConditionalGeneration", "model.language_model."),
}
LINEAR_ATTN, FULL_ATTN = "linear_attention", "full_attention"
# Tensors that stay float32 in a half-precision Qwen3.5 checkpoint (as the released ones store them).
QWEN35_F32_SUFFIXES = (".linear_attn.A_log", ".linear_attn.norm.weight")


def qwen35_layer_types_from_interval(layers, interval):
    """transformers' default when layer_types is absent: layer i is full attention iff (i+1) % interval == 0."""
    return [FULL_ATTN if (i + 1) % interval == 0 else LINEAR_ATTN for i in range(layers)]


def qwen35_mrope_section(rotary_dim):
    """A mrope_section summing to rotary_dim / 2 split like the released [11, 11, 10] (for 64 rotary dims)."""
    half = rotary_dim // 2
    return [(half + 2) // 3, (half + 1) // 3, half // 3]


class Qwen35Cfg:
    """A Qwen3.5 text model parsed from config.json (either form), with Qwen3_5TextConfig's defaults."""

    def __init__(self, c):
        self.raw = c
        mt = c.get("model_type")
        if mt == "qwen3_5":
            t = c.get("text_config")
            if not isinstance(t, dict):
                raise RefError("model_type qwen3_5 without a text_config object")
            if t.get("model_type", "qwen3_5_text") != "qwen3_5_text":
                raise RefError(f"text_config.model_type {t.get('model_type')!r}, expected qwen3_5_text")
            self.form, self.prefix = "qwen3_5_vl", "model.language_model."
            # The outer config owns tie_word_embeddings for Qwen3_5ForConditionalGeneration; fall back to
            # text_config's (make writes the same value in both).
            self.tie = bool(c.get("tie_word_embeddings", t.get("tie_word_embeddings", False)))
        elif mt == "qwen3_5_text":
            t = c
            self.form, self.prefix = "qwen3_5", "model."
            self.tie = bool(t.get("tie_word_embeddings", False))
        else:
            raise RefError(f"model_type {mt!r} is not a Qwen3.5 model")
        self.arch = self.form
        self.text = t
        self.vocab = int(t.get("vocab_size", 248320))
        self.hidden = int(t.get("hidden_size", 4096))
        self.inter = int(t.get("intermediate_size", 12288))
        self.layers = int(t.get("num_hidden_layers", 32))
        self.heads = int(t.get("num_attention_heads", 16))
        self.kv_heads = int(t.get("num_key_value_heads") or 4)
        self.head_dim = int(t.get("head_dim") or 256)
        self.lin_k_heads = int(t.get("linear_num_key_heads", 16))
        self.lin_v_heads = int(t.get("linear_num_value_heads", 32))
        self.lin_k_dim = int(t.get("linear_key_head_dim", 128))
        self.lin_v_dim = int(t.get("linear_value_head_dim", 128))
        self.conv_kernel = int(t.get("linear_conv_kernel_dim", 4))
        self.eps = float(t.get("rms_norm_eps", 1e-6))
        self.attention_bias = bool(t.get("attention_bias", False))
        if self.heads % self.kv_heads:
            raise RefError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.lin_v_heads % self.lin_k_heads:
            raise RefError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if min(self.lin_k_heads, self.lin_v_heads, self.lin_k_dim, self.lin_v_dim, self.conv_kernel) < 1:
            raise RefError("linear attention sizes must be >= 1")
        lt = t.get("layer_types")
        if lt is None:
            lt = qwen35_layer_types_from_interval(self.layers, int(t.get("full_attention_interval", 4)))
        lt = list(lt)
        if len(lt) != self.layers or any(x not in (LINEAR_ATTN, FULL_ATTN) for x in lt):
            raise RefError(f"layer_types must list {self.layers} of {LINEAR_ATTN!r}/{FULL_ATTN!r}, got {lt}")
        self.layer_types = lt
        rp = t.get("rope_parameters") or {}
        rs = t.get("rope_scaling") or {}
        rtype = rp.get("rope_type", rp.get("type")) or rs.get("rope_type", rs.get("type")) or "default"
        if rtype != "default":
            raise RefError(f"rope type {rtype!r} not supported by the reference")
        self.rope_theta = float(rp.get("rope_theta", t.get("rope_theta", 10000.0)))
        self.partial_rotary_factor = float(rp.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25)))
        self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)  # transformers: int(head_dim * factor)
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise RefError(f"rotary dims int(head_dim * partial_rotary_factor) = {self.rotary_dim}: must be even "
                           f"and <= head_dim (transformers silently rotates {2 * ((self.rotary_dim + 1) // 2)} dims "
                           "for an odd value; not modelled)")
        act = t.get("hidden_act", "silu")
        if act != "silu":
            raise RefError(f"hidden_act {act!r} not supported")

    def is_ignored(self, name):
        """Checkpoint tensors the text model does not use (transformers: _keys_to_ignore_on_load_unexpected)."""
        return name.startswith("mtp.") or name.startswith("model.visual.")

    def param_shapes(self):
        C, D, H, K, I, V = self.hidden, self.head_dim, self.heads, self.kv_heads, self.inter, self.vocab
        Hk, Hv, dk, dv, ck = self.lin_k_heads, self.lin_v_heads, self.lin_k_dim, self.lin_v_dim, self.conv_kernel
        conv_dim = 2 * Hk * dk + Hv * dv
        m = self.prefix
        s = {m + "embed_tokens.weight": (V, C)}
        for i, lt in enumerate(self.layer_types):
            p = f"{m}layers.{i}."
            s[p + "input_layernorm.weight"] = (C,)
            if lt == LINEAR_ATTN:
                a = p + "linear_attn."
                s[a + "in_proj_qkv.weight"] = (conv_dim, C)
                s[a + "in_proj_z.weight"] = (Hv * dv, C)
                s[a + "in_proj_b.weight"] = (Hv, C)
                s[a + "in_proj_a.weight"] = (Hv, C)
                s[a + "conv1d.weight"] = (conv_dim, 1, ck)
                s[a + "dt_bias"] = (Hv,)
                s[a + "A_log"] = (Hv,)
                s[a + "norm.weight"] = (dv,)
                s[a + "out_proj.weight"] = (C, Hv * dv)
            else:
                a = p + "self_attn."
                s[a + "q_proj.weight"] = (2 * H * D, C)
                if self.attention_bias:
                    s[a + "q_proj.bias"] = (2 * H * D,)
                s[a + "k_proj.weight"] = (K * D, C)
                if self.attention_bias:
                    s[a + "k_proj.bias"] = (K * D,)
                s[a + "v_proj.weight"] = (K * D, C)
                if self.attention_bias:
                    s[a + "v_proj.bias"] = (K * D,)
                s[a + "o_proj.weight"] = (C, H * D)
                if self.attention_bias:
                    s[a + "o_proj.bias"] = (C,)
                s[a + "q_norm.weight"] = (D,)
                s[a + "k_norm.weight"] = (D,)
            s[p + "post_attention_layernorm.weight"] = (C,)
            s[p + "mlp.gate_proj.weight"] = (I, C)
            s[p + "mlp.up_proj.weight"] = (I, C)
            s[p + "mlp.down_proj.weight"] = (C, I)
        s[m + "norm.weight"] = (C,)
        if not self.tie:
            s["lm_head.weight"] = (V, C)
        return s


def qwen35_vision_config(text_hidden):
    """A tiny vision_config in the released layout (the released one has depth 27 / 24, hidden 1152 / 1024 ...)."""
    return {"deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 16,
            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 32, "model_type": "qwen3_5",
            "num_heads": 2, "num_position_embeddings": 16, "out_hidden_size": text_hidden, "patch_size": 4,
            "spatial_merge_size": 2, "temporal_patch_size": 2}


def qwen35_extra_shapes(cfg, vis):
    """model.visual.* (Qwen3_5VisionModel) and mtp.* (the multi-token-prediction head of the released
    checkpoints: one full-attention layer) tensor shapes; stored, never used by the text model."""
    vh, vi, ps, tp, ch = vis["hidden_size"], vis["intermediate_size"], vis["patch_size"], vis["temporal_patch_size"], \
        vis["in_channels"]
    mh = vh * vis["spatial_merge_size"] ** 2
    s = {"model.visual.patch_embed.proj.weight": (vh, ch, tp, ps, ps), "model.visual.patch_embed.proj.bias": (vh,),
         "model.visual.pos_embed.weight": (vis["num_position_embeddings"], vh)}
    for b in range(vis["depth"]):
        p = f"model.visual.blocks.{b}."
        s.update({p + "norm1.weight": (vh,), p + "norm1.bias": (vh,), p + "attn.qkv.weight": (3 * vh, vh),
                  p + "attn.qkv.bias": (3 * vh,), p + "attn.proj.weight": (vh, vh), p + "attn.proj.bias": (vh,),
                  p + "norm2.weight": (vh,), p + "norm2.bias": (vh,), p + "mlp.linear_fc1.weight": (vi, vh),
                  p + "mlp.linear_fc1.bias": (vi,), p + "mlp.linear_fc2.weight": (vh, vi),
                  p + "mlp.linear_fc2.bias": (vh,)})
    s.update({"model.visual.merger.norm.weight": (vh,), "model.visual.merger.norm.bias": (vh,),
              "model.visual.merger.linear_fc1.weight": (mh, mh), "model.visual.merger.linear_fc1.bias": (mh,),
              "model.visual.merger.linear_fc2.weight": (vis["out_hidden_size"], mh),
              "model.visual.merger.linear_fc2.bias": (vis["out_hidden_size"],)})
    C, D, H, K, I = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.inter
    s.update({"mtp.fc.weight": (C, 2 * C), "mtp.pre_fc_norm_embedding.weight": (C,),
              "mtp.pre_fc_norm_hidden.weight": (C,)})
    p = "mtp.layers.0."
    s.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (2 * H * D, C),
              p + "self_attn.k_proj.weight": (K * D, C), p + "self_attn.v_proj.weight": (K * D, C),
              p + "self_attn.o_proj.weight": (C, H * D), p + "self_attn.q_norm.weight": (D,),
              p + "self_attn.k_norm.weight": (D,), p + "post_attention_layernorm.weight": (C,),
              p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C), p + "mlp.down_proj.weight": (C, I)})
    s["mtp.norm.weight"] = (C,)
    return s


def qwen35_make_config(form, a, layer_types, write_layer_types):
    """config.json as the released Qwen3.5 checkpoints / transformers 5 write it (sorted keys, indent 2)."""
    hd = a.head_dim if a.head_dim is not None else a.hidden // a.heads
    kv = a.kv_heads if a.kv_heads is not None else a.heads
    rdim = int(hd * a.partial_rotary_factor)
    V = a.vocab
    t = {
        "attention_bias": bool(a.attention_bias),
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": V - 2,  # real ids (248044 ...) do not fit a tiny vocabulary: the last ids
        "dtype": a.dtype,
        "eos_token_id": V - 1,
        "full_attention_interval": a.full_attention_interval,
        "head_dim": hd,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.intermediate,
        "linear_conv_kernel_dim": a.conv_kernel,
        "linear_key_head_dim": a.linear_key_dim,
        "linear_num_key_heads": a.linear_key_heads,
        "linear_num_value_heads": a.linear_value_heads,
        "linear_value_head_dim": a.linear_value_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": a.max_position_embeddings,
        "model_type": "qwen3_5_text",
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": kv,
        "rms_norm_eps": a.rms_norm_eps if a.rms_norm_eps is not None else 1e-6,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": qwen35_mrope_section(rdim),
            "partial_rotary_factor": a.partial_rotary_factor,
            "rope_theta": a.rope_theta if a.rope_theta is not None else 10000000.0,
            "rope_type": "default",
        },
        "tie_word_embeddings": a.tie,
        "use_cache": True,
        "vocab_size": V,
    }
    if write_layer_types:
        t["layer_types"] = list(layer_types)
    version = "4.57.0.dev0"
    if form == "qwen3_5":
        t["architectures"] = ["Qwen3_5ForCausalLM"]
        t["transformers_version"] = version
        return t
    t["mtp_num_hidden_layers"] = 1
    t["mtp_use_dedicated_embeddings"] = False
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": V - 4,
        "model_type": "qwen3_5",
        "text_config": t,
        "tie_word_embeddings": a.tie,
        "transformers_version": version,
        "video_token_id": V - 3,
        "vision_config": qwen35_vision_config(a.hidden),
        "vision_end_token_id": V - 5,
        "vision_start_token_id": V - 6,
    }


def zc_rms_norm(x, w, eps):
    """Qwen3_5RMSNorm (zero-centred): x·rsqrt(mean x² + eps)·(1 + w), in at least f32, back to x's dtype."""
    up = torch.promote_types(x.dtype, torch.float32)
    h = x.to(up)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.to(up))).to(x.dtype)


def gated_rms_norm(x, z, w, eps):
    """Qwen3_5RMSNormGated: RMSNorm over the last dim with a plain weight, then × silu(z)."""
    in_dt = x.dtype
    up = torch.promote_types(in_dt, torch.float32)
    h = x.to(up)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = w * h.to(in_dt)
    return (h * F.silu(z.to(up))).to(in_dt)


def l2_normalize(x, eps=1e-6):
    """FLA / transformers l2norm: x·rsqrt(Σx² + eps) over the last dim."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def doc_starts(position_ids, packed):
    """[B, T] bool: True where a document starts (t = 0, and where position_ids is 0 in a packed row)."""
    B, T = position_ids.shape
    if packed:
        s = position_ids == 0
    else:
        s = torch.zeros(B, T, dtype=torch.bool)
    s = s.clone()
    s[:, 0] = True
    return s


def causal_depthwise_conv(x, w, starts):
    """Causal depthwise conv1d without bias over time, left zero padding, restarted at each document.
    x [B, T, C], w [C, 1, K] (nn.Conv1d(groups=C) layout), starts [B, T] bool. out[t] = Σ_k w[k]·x[t-(K-1-k)]
    over the taps inside x's document (taps before the document start read zeros, as transformers'
    F.conv1d(padding=K-1)[..., :T] does at t = 0)."""
    B, T, C = x.shape
    K = w.shape[-1]
    doc = torch.cumsum(starts.to(torch.int64), dim=1)
    out = torch.zeros_like(x)
    for j in range(K):  # tap reading x[t - j]
        if j >= T:
            break
        xs = F.pad(x, (0, 0, j, 0))[:, :T]
        ds = F.pad(doc, (j, 0), value=-1)[:, :T]
        valid = (ds == doc).to(x.dtype)[:, :, None]
        out = out + xs * valid * w[:, 0, K - 1 - j]
    return out


def delta_rule_recurrent(q, k, v, g, beta, starts=None):
    """The gated delta rule, one step at a time (the reference). q, k [B, T, H, dk] (already expanded to the
    value heads, normalised and q scaled), v [B, T, H, dv], g, beta [B, T, H]. Per head, state S [dk, dv] from 0
    (and reset to 0 wherever starts [B, T] is True): S ← e^{g_t} S; S ← S + k_t ((v_t − Sᵀk_t) β_t)ᵀ; o_t = Sᵀ q_t.
    Returns o [B, T, H, dv]."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    S = torch.zeros(B, H, dk, dv, dtype=v.dtype)
    outs = []
    for t in range(T):
        if starts is not None and t > 0:
            S = S * (~starts[:, t]).to(S.dtype)[:, None, None, None]
        S = S * torch.exp(g[:, t])[:, :, None, None]
        kt = k[:, t]
        pred = torch.einsum("bhkv,bhk->bhv", S, kt)
        delta = (v[:, t] - pred) * beta[:, t][:, :, None]
        S = S + kt[:, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, dim=1)


def _delta_rule_chunked_core(q, k, v, g, beta, chunk):
    """Chunked (WY / UT-transform) gated delta rule over whole rows, state from 0. Same layout as
    delta_rule_recurrent. Within a chunk with inclusive cumulative gates γ:
      A = (I + strictly-lower(diag(β) K Kᵀ ⊙ e^{γi−γj}))⁻¹, W = A (β e^{γ} K), U = A (β V);
    per chunk: V' = U − W S, O = (Q e^{γ}) S + (Q Kᵀ ⊙ e^{γi−γj}, j ≤ i) V', S ← e^{γ_last} S + (K e^{γ_last−γ})ᵀ V'."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    dt = v.dtype
    pad = (-T) % chunk
    N = (T + pad) // chunk

    def blocks(x):  # [B, T, H, ...] -> [B, H, N, chunk, ...], zero-padded at the end
        x = x.transpose(1, 2)
        if pad:
            x = F.pad(x, (0, 0, 0, pad)) if x.dim() == 4 else F.pad(x, (0, pad))
        return x.reshape(B, H, N, chunk, *x.shape[3:])

    Q, Kc, Vc, G, Bt = blocks(q), blocks(k), blocks(v), blocks(g), blocks(beta)
    gam = torch.cumsum(G, dim=-1)  # [B, H, N, C]
    incl = torch.ones(chunk, chunk, dtype=torch.bool).tril()  # j <= i
    strict = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)  # j < i
    diff = gam[..., :, None] - gam[..., None, :]  # γi − γj, ≤ 0 where j <= i
    # Zero the masked (upper) triangle before the exponential: there γi − γj > 0 may overflow.
    decay = torch.where(incl, torch.exp(torch.where(incl, diff, torch.zeros_like(diff))), torch.zeros_like(diff))
    kk = Kc @ Kc.transpose(-1, -2)
    lower = torch.where(strict, Bt[..., :, None] * kk * decay, torch.zeros_like(kk))
    M = torch.eye(chunk, dtype=dt) + lower  # unit lower triangular; A = M⁻¹
    W = torch.linalg.solve_triangular(M, (Bt * torch.exp(gam))[..., None] * Kc, upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(M, Bt[..., None] * Vc, upper=False, unitriangular=True)
    Qg = Q * torch.exp(gam)[..., None]
    Kd = Kc * torch.exp(gam[..., -1:] - gam)[..., None]
    intra = (Q @ Kc.transpose(-1, -2)) * decay
    S = torch.zeros(B, H, dk, dv, dtype=dt)
    outs = []
    for n in range(N):
        Vn = U[:, :, n] - W[:, :, n] @ S
        outs.append(Qg[:, :, n] @ S + intra[:, :, n] @ Vn)
        S = torch.exp(gam[:, :, n, -1])[:, :, None, None] * S + Kd[:, :, n].transpose(-1, -2) @ Vn
    o = torch.stack(outs, dim=2).reshape(B, H, N * chunk, dv)[:, :, :T]
    return o.transpose(1, 2)


def delta_rule_chunked(q, k, v, g, beta, starts=None, chunk=64):
    """The chunked form; documents (starts) are handled by running each document segment on its own."""
    B, T = q.shape[:2]
    if starts is None or not bool(starts[:, 1:].any()):
        return _delta_rule_chunked_core(q, k, v, g, beta, chunk)
    rows = []
    for b in range(B):
        cuts = [t for t in range(T) if t == 0 or bool(starts[b, t])] + [T]
        segs = [_delta_rule_chunked_core(q[b:b + 1, s:e], k[b:b + 1, s:e], v[b:b + 1, s:e], g[b:b + 1, s:e],
                                         beta[b:b + 1, s:e], chunk) for s, e in zip(cuts[:-1], cuts[1:])]
        rows.append(torch.cat(segs, dim=1))
    return torch.cat(rows, dim=0)


def gated_deltanet(cfg, P, a, h, starts, delta_impl, lin=F.linear, keep=keep_f32):
    """Qwen3_5GatedDeltaNet (training path). h [B, T, C] (normed input); a = 'model.layers.i.linear_attn.'."""
    B, T, _ = h.shape
    Hk, Hv, dk, dv = cfg.lin_k_heads, cfg.lin_v_heads, cfg.lin_k_dim, cfg.lin_v_dim
    qkv = keep(lin(h, P[a + "in_proj_qkv.weight"]))
    qkv = keep(F.silu(causal_depthwise_conv(qkv, P[a + "conv1d.weight"], starts)))
    q, k, v = torch.split(qkv, [Hk * dk, Hk * dk, Hv * dv], dim=-1)
    q = q.reshape(B, T, Hk, dk)
    k = k.reshape(B, T, Hk, dk)
    v = v.reshape(B, T, Hv, dv)
    z = keep(lin(h, P[a + "in_proj_z.weight"])).reshape(B, T, Hv, dv)
    b = lin(h, P[a + "in_proj_b.weight"])
    araw = lin(h, P[a + "in_proj_a.weight"])
    up = torch.promote_types(h.dtype, torch.float32)
    beta = torch.sigmoid(b).to(up)
    g = -torch.exp(P[a + "A_log"].to(up)) * F.softplus(araw.to(up) + P[a + "dt_bias"].to(up))
    q = keep(l2_normalize(q.to(up))) * (dk ** -0.5)
    k = keep(l2_normalize(k.to(up)))
    # Value head j reads key/query head j // (Hv / Hk) (repeat_interleave over heads).
    idx = torch.arange(Hv) // (Hv // Hk)
    q, k = q[:, :, idx], k[:, :, idx]
    rule = delta_rule_recurrent if delta_impl == "recurrent" else delta_rule_chunked
    o = keep(rule(q, k, v.to(up), g, beta, starts).to(h.dtype))
    o = keep(gated_rms_norm(o, z, P[a + "norm.weight"], cfg.eps))
    return lin(o.reshape(B, T, Hv * dv), P[a + "out_proj.weight"])


def qwen35_rope_cos_sin(cfg, position_ids, dtype, rope_precision):
    """cos, sin [B, T, rotary_dim]: inv_freq over the rotary dims only (1/θ^(arange(0, R, 2)/R)), f32 as HF."""
    R = cfg.rotary_dim
    rdt = torch.float32 if rope_precision == "hf" else torch.float64
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, R, 2, dtype=torch.int64).to(rdt) / R))
    freqs = position_ids[:, :, None].to(rdt) * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def gated_attention(cfg, P, a, h, cos, sin, mask, lin=F.linear, keep=keep_f32):
    """Qwen3_5Attention: q_proj gives per head [query | gate]; zero-centred q/k norms; partial RoPE; causal GQA
    softmax; output × sigmoid(gate) before o_proj."""
    B, T, _ = h.shape
    H, K, D, R = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.rotary_dim
    dt = h.dtype
    ab = cfg.attention_bias
    qg = keep(linear(h, P, a + "q_proj", ab, lin)).view(B, T, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(B, T, H * D)
    q = zc_rms_norm(q, P[a + "q_norm.weight"], cfg.eps).transpose(1, 2)
    k = zc_rms_norm(keep(linear(h, P, a + "k_proj", ab, lin)).view(B, T, K, D), P[a + "k_norm.weight"],
                    cfg.eps).transpose(1, 2)
    v = keep(linear(h, P, a + "v_proj", ab, lin)).view(B, T, K, D).transpose(1, 2)
    q = keep(torch.cat((q[..., :R] * cos + rotate_half(q[..., :R]) * sin, q[..., R:]), dim=-1))
    k = keep(torch.cat((k[..., :R] * cos + rotate_half(k[..., :R]) * sin, k[..., R:]), dim=-1))
    k = repeat_kv(k, H // K)
    v = repeat_kv(v, H // K)
    sm_dt = torch.promote_types(dt, torch.float32)
    o = attention_core(q, k, v, mask, D ** -0.5, sm_dt, keep).transpose(1, 2).reshape(B, T, H * D)
    o = o * torch.sigmoid(gate)
    return linear(o, P, a + "o_proj", ab, lin)


def qwen35_forward(cfg, P, input_ids, position_ids, packed, rope_precision="hf", delta_impl="recurrent",
                   lin=F.linear, keep=keep_f32):
    """Logits [B, T, V] of the Qwen3.5 text model in the compute dtype of P. lin: the linear layers' (and
    lm_head's) function; keep: the activation storage's (keep_for)."""
    m = cfg.prefix
    dt = P[m + "embed_tokens.weight"].dtype
    x = keep(F.embedding(input_ids, P[m + "embed_tokens.weight"]))
    cos, sin = qwen35_rope_cos_sin(cfg, position_ids, dt, rope_precision)
    cos, sin = cos[:, None], sin[:, None]
    mask = attention_mask(position_ids, packed)
    starts = doc_starts(position_ids, packed)
    for i, lt in enumerate(cfg.layer_types):
        p = f"{m}layers.{i}."
        h = keep(zc_rms_norm(x, P[p + "input_layernorm.weight"], cfg.eps))
        if lt == LINEAR_ATTN:
            x = keep(x + gated_deltanet(cfg, P, p + "linear_attn.", h, starts, delta_impl, lin, keep))
        else:
            x = keep(x + gated_attention(cfg, P, p + "self_attn.", h, cos, sin, mask, lin, keep))
        h = keep(zc_rms_norm(x, P[p + "post_attention_layernorm.weight"], cfg.eps))
        gt = keep(lin(h, P[p + "mlp.gate_proj.weight"]))
        u = keep(lin(h, P[p + "mlp.up_proj.weight"]))
        x = keep(x + lin(keep(F.silu(gt) * u), P[p + "mlp.down_proj.weight"]))
    x = zc_rms_norm(x, P[m + "norm.weight"], cfg.eps)
    lm = P[m + "embed_tokens.weight"] if cfg.tie else P["lm_head.weight"]
    return lin(x, lm)


def qwen35_random_params(cfg, gen):
    """Seeded random weights (f32). As random_params, plus: the zero-centred norms (decoder, final, q/k) 0.1·N(0,1)
    (around 0, i.e. a scale around 1); the gated norm 1 + 0.1·N(0,1); A_log = log U(1, 16); dt_bias −4 + 0.5·N(0,1)
    (softplus(a + dt_bias) mostly 0.01–0.1, so per-token decays e^g ≈ 0.5–0.95: the state carries tens of tokens,
    across chunk boundaries); conv1d weights N(0, 1/K); out_proj like o_proj (half std)."""
    P = {}
    for n, shape in cfg.param_shapes().items():
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if n.endswith("linear_attn.norm.weight"):
            t = 1.0 + 0.1 * z
        elif n.endswith("norm.weight"):
            t = 0.1 * z
        elif n.endswith(".A_log"):
            t = torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen, dtype=torch.float32))
        elif n.endswith(".dt_bias"):
            t = -4.0 + 0.5 * z
        elif n.endswith("conv1d.weight"):
            t = z / math.sqrt(shape[-1])
        elif n.endswith(".bias"):
            t = 0.1 * z
        elif n.endswith("embed_tokens.weight") or n == "lm_head.weight":
            t = z / math.sqrt(cfg.hidden)
        else:
            scale = 0.5 if n.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")) else 1.0
            t = z * (scale / math.sqrt(shape[1]))
        P[n] = t.contiguous()
    return P


def qwen35_random_extras(shapes, gen):
    """Untrained stand-ins for model.visual.* and mtp.*: weights 0.02·N(0,1), LayerNorm weights 1 + 0.1·N(0,1),
    zero-centred (mtp) norms 0.1·N(0,1), biases 0.1·N(0,1)."""
    P = {}
    for n, shape in shapes.items():
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if "norm" in n and n.endswith(".weight"):
            t = 1.0 + 0.1 * z if n.startswith("model.visual.") else 0.1 * z
        elif n.endswith(".bias"):
            t = 0.1 * z
        else:
            t = 0.02 * z
        P[n] = t.contiguous()
    return P


def parse_layer_types(s, layers):
    names = {"linear": LINEAR_ATTN, "linear_attention": LINEAR_ATTN, "full": FULL_ATTN, "full_attention": FULL_ATTN}
    out = []
    for x in s.split(","):
        x = x.strip()
        if x not in names:
            raise RefError(f"--layer-types: {x!r} is not linear_attention / full_attention (or linear / full)")
        out.append(names[x])
    if len(out) != layers:
        raise RefError(f"--layer-types lists {len(out)} layers, --layers is {layers}")
    return out


def cmd_make_qwen35(a):
    form = a.arch
    if a.vocab < (8 if form == "qwen3_5_vl" else 3):
        raise RefError("--vocab must be >= 3 (qwen3_5_vl: >= 8, for the special token ids)")
    if a.seq < 2 or a.batch < 1:
        raise RefError("--seq must be >= 2 and --batch >= 1")
    if not 1 <= a.docs <= a.seq:
        raise RefError("--docs must be in [1, seq]")
    if a.shards < 1:
        raise RefError("--shards must be >= 1")
    if a.mlp_bias:
        raise RefError("qwen3_5 has no mlp_bias")
    if a.hidden % a.heads and a.head_dim is None:
        raise RefError("--hidden not divisible by --heads: give --head-dim")
    if a.full_attention_interval < 1:
        raise RefError("--full-attention-interval must be >= 1")
    derived = qwen35_layer_types_from_interval(a.layers, a.full_attention_interval)
    layer_types = parse_layer_types(a.layer_types, a.layers) if a.layer_types else derived
    if a.omit_layer_types and layer_types != derived:
        raise RefError("--omit-layer-types: the layer types must then be the --full-attention-interval pattern")
    conf = qwen35_make_config(form, a, layer_types, not a.omit_layer_types)
    cfg = Qwen35Cfg(conf)  # validates (head multiples, even rotary dims ...)
    assert cfg.layer_types == layer_types
    gen = torch.Generator().manual_seed(a.seed)
    P = qwen35_random_params(cfg, gen)
    extras = {}
    if form == "qwen3_5_vl":
        extras = qwen35_random_extras(qwen35_extra_shapes(cfg, conf["vision_config"]), gen)
    allp = dict(P)
    allp.update(extras)
    st = ST_DTYPE[a.dtype]
    dtypes = {n: ("F32" if st != "F32" and n.endswith(QWEN35_F32_SUFFIXES) else st) for n in allp}
    save_model_dir(a.out, conf, allp, dtypes, a.shards)
    batch = make_batch(gen, a.batch, a.seq, a.vocab, a.docs)
    with open(os.path.join(a.out, "batch.json"), "w") as f:
        f.write(json.dumps(batch, separators=(",", ":")) + "\n")
    print(json.dumps({"out": a.out, "arch": form, "params": sum(t.numel() for t in P.values()), "tensors": len(P),
                      "ignored_tensors": len(extras), "layer_types": layer_types,
                      "counted": sum(1 for r in batch["labels"] for l in r[1:] if l != IGNORE_INDEX)}))


def parse_config(c):
    """Cfg (qwen2 / qwen3 / llama) or Qwen35Cfg (qwen3_5_text / qwen3_5) from a config.json dict."""
    if c.get("model_type") in ("qwen3_5", "qwen3_5_text"):
        return Qwen35Cfg(c)
    return Cfg(c)


def model_forward(cfg, P, ids, pos, packed, rope_precision="hf", delta_impl="recurrent", emulate_bf16=False,
                  emulate_storage=False):
    """Logits [B, T, V]. emulate_bf16: every linear layer and the lm_head with LazyTrain's bf16 GEMM rounding
    (bf16_linear); emulate_storage: its bf16 activation storage (keep_bf16); everything else in the compute
    dtype of P."""
    lin, keep = gemm_for(emulate_bf16), keep_for(emulate_storage)
    if isinstance(cfg, Qwen35Cfg):
        return qwen35_forward(cfg, P, ids, pos, packed, rope_precision, delta_impl, lin, keep)
    return forward(cfg, P, ids, pos, packed, rope_precision, lin, keep)


# --------------------------------------------------------------------------------------------------------
# selfcheck-delta and fdcheck


def _max_rel(a, b):
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-300)


def cmd_selfcheck_delta(a):
    """Chunked == recurrent gated delta rule (outputs and autograd gradients), float64, on random inputs."""
    torch.manual_seed(a.seed)
    dt = torch.float64
    worst = 0.0
    lines = []
    # (B, T, H, dk, dv, chunk, packed): T never a multiple of the chunk; one case under a single chunk.
    cases = [(2, 150, 3, 12, 10, 64, False), (2, 70, 4, 12, 10, 64, True), (1, 5, 2, 7, 3, 64, False),
             (2, 70, 2, 12, 10, 16, True), (1, 130, 2, 8, 6, 64, False)]
    for B, T, H, dk, dv, chunk, packed in cases:
        q = l2_normalize(torch.randn(B, T, H, dk, dtype=dt)) * dk ** -0.5
        k = l2_normalize(torch.randn(B, T, H, dk, dtype=dt))
        v = torch.randn(B, T, H, dv, dtype=dt)
        beta = torch.sigmoid(torch.randn(B, T, H, dtype=dt))
        # Decay rates from none (long memory) to strong (e^-40 per step); head 0 almost no decay.
        A = torch.exp(torch.empty(H, dtype=dt).uniform_(math.log(0.01), math.log(16.0)))
        A[0] = 1e-3
        g = -A * F.softplus(torch.randn(B, T, H, dtype=dt))
        g[:, T // 3, -1] = -40.0
        starts = None
        if packed:
            starts = torch.zeros(B, T, dtype=torch.bool)
            starts[:, 0] = True
            for b in range(B):
                for t in torch.randperm(T - 1)[:2].add(1).tolist():
                    starts[b, t] = True
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        leaves2 = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        o1 = delta_rule_recurrent(*leaves, starts)
        o2 = delta_rule_chunked(*leaves2, starts, chunk=chunk)
        r = torch.randn_like(o1)
        (o1 * r).sum().backward()
        (o2 * r).sum().backward()
        e_out = _max_rel(o2.detach(), o1.detach())
        e_grad = max(_max_rel(y.grad, x.grad) for x, y in zip(leaves, leaves2))
        if packed:  # the resets really separate documents: each segment alone gives the same outputs
            b = 0
            cuts = [t for t in range(T) if bool(starts[b, t])] + [T]
            seg = torch.cat([delta_rule_recurrent(q[:1, s:e], k[:1, s:e], v[:1, s:e], g[:1, s:e], beta[:1, s:e])
                             for s, e in zip(cuts[:-1], cuts[1:])], dim=1)
            e_out = max(e_out, _max_rel(seg, o1.detach()[:1]))
        worst = max(worst, e_out, e_grad)
        lines.append(f"delta B={B} T={T} H={H} dk={dk} dv={dv} chunk={chunk} packed={packed}: "
                     f"out max rel {e_out:.2e}, grad max rel {e_grad:.2e}")
    # The conv: plain F.conv1d(padding=K-1)[..., :T] without documents, per-document F.conv1d with them.
    x = torch.randn(2, 70, 9, dtype=dt)
    w = torch.randn(9, 1, 4, dtype=dt)
    ref = F.conv1d(x.transpose(1, 2), w, padding=3, groups=9)[..., :70].transpose(1, 2)
    e_conv = _max_rel(causal_depthwise_conv(x, w, doc_starts(torch.zeros(2, 70, dtype=torch.int64), False)), ref)
    pos = torch.cat([torch.arange(30), torch.arange(2), torch.arange(38)])[None].expand(2, 70)
    segs = [F.conv1d(x[:, s:e].transpose(1, 2), w, padding=3, groups=9)[..., :e - s].transpose(1, 2)
            for s, e in ((0, 30), (30, 32), (32, 70))]
    e_conv = max(e_conv, _max_rel(causal_depthwise_conv(x, w, doc_starts(pos, True)), torch.cat(segs, dim=1)))
    worst = max(worst, e_conv)
    lines.append(f"conv (plain and packed) vs F.conv1d: max rel {e_conv:.2e}")
    for ln in lines:
        print(ln)
    ok = worst <= a.tol
    print(f"{'PASS' if ok else 'FAIL'}: chunked vs recurrent gated delta rule, worst max rel {worst:.2e} "
          f"(tol {a.tol:.0e})")
    return 0 if ok else 1


def cmd_fdcheck(a):
    """Autograd gradients of the whole model against central finite differences, float64."""
    cfg, W, _ = load_model_dir(a.model)
    ids, labels, pos, packed = load_batch(a.batch, cfg.vocab)
    P = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in W.items()}
    loss, _ = causal_lm_loss(model_forward(cfg, P, ids, pos, packed, a.rope_precision, a.delta), labels)
    loss.backward()
    G = {n: t.grad.detach().clone() for n, t in P.items()}
    X = {n: t.detach().clone() for n, t in P.items()}
    gen = torch.Generator().manual_seed(a.seed)

    def loss_at():
        with torch.no_grad():
            return float(causal_lm_loss(model_forward(cfg, X, ids, pos, packed, a.rope_precision, a.delta),
                                        labels)[0])

    import re
    names = [n for n in X if re.search(a.names, n)] if a.names else list(X)
    worst, fails, n_checked = 0.0, 0, 0
    print(f"{'name':<58} {'index':>8} {'autograd':>13} {'finite diff':>13} {'abs err':>9} {'rel err':>9}")
    for n in names:
        g = G[n].reshape(-1)
        numel = g.numel()
        picks = [int(g.abs().argmax())]
        for j in range(a.random):  # stratified over the flat range (so e.g. q_proj's query and gate rows)
            lo, hi = numel * j // a.random, max(numel * (j + 1) // a.random, numel * j // a.random + 1)
            picks.append(lo + int(torch.randint(0, hi - lo, (1,), generator=gen)))
        for idx in dict.fromkeys(picks):
            flat = X[n].view(-1)
            old = float(flat[idx])
            flat[idx] = old + a.h
            lp = loss_at()
            flat[idx] = old - a.h
            lm = loss_at()
            flat[idx] = old
            fd = (lp - lm) / (2 * a.h)
            ad = float(g[idx])
            err = abs(fd - ad)
            rel = err / max(abs(ad), abs(fd), 1e-300)
            ok = err <= a.atol + a.rtol * max(abs(ad), abs(fd))
            fails += not ok
            n_checked += 1
            if abs(ad) > 10 * a.atol:
                worst = max(worst, rel)
            print(f"{n:<58} {idx:>8} {ad:13.6e} {fd:13.6e} {err:9.2e} {rel:9.2e}{'' if ok else '  FAIL'}")
    print(f"{'PASS' if not fails else 'FAIL'}: {n_checked} entries of {len(names)} tensors, {fails} failures, "
          f"worst rel err {worst:.2e} (entries |g| > {10 * a.atol:.0e}); loss {float(loss):.12g}; "
          f"criterion |fd - ad| <= {a.atol:.0e} + {a.rtol:.0e}·|g|, h = {a.h:.0e}")
    return 1 if fails else 0


# --------------------------------------------------------------------------------------------------------
# compare


def rel_l2(x, y):
    """‖x − y‖ / ‖y‖ in float64 (absolute ‖x − y‖ for an all-zero y)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    dn, rn = float((x - y).norm()), float(y.norm())
    return dn / rn if rn > 0 else dn


def cmd_compare(a):
    A, _, _ = read_safetensors(a.ours)
    Bt, _, _ = read_safetensors(a.ref)
    Wd = None
    if a.widen_by is not None:
        Wd, _, _ = read_safetensors(a.widen_by)
    fails = []
    missing = sorted(set(Bt) - set(A))
    extra = sorted(set(A) - set(Bt))
    for n in missing:
        fails.append(f"{n}: missing from {a.ours}")
    for n in extra:
        fails.append(f"{n}: not in the reference {a.ref}")
    rows = []
    worst = 0.0
    n_widened = 0
    names = [n for n in Bt if n in A]
    # Model order when the names look like HF names, otherwise sorted.
    names.sort(key=_name_key)
    for n in names:
        x = A[n].to(torch.float64)
        y = Bt[n].to(torch.float64)
        if tuple(x.shape) != tuple(y.shape):
            fails.append(f"{n}: shape {tuple(x.shape)} vs reference {tuple(y.shape)}")
            rows.append((n, f"{tuple(x.shape)}!={tuple(y.shape)}", float("nan"), float("nan"), "FAIL", ""))
            continue
        tol, note = a.rtol_l2, ""
        if Wd is not None:
            if n not in Wd or tuple(Wd[n].shape) != tuple(y.shape):
                fails.append(f"{n}: missing from (or another shape in) --widen-by {a.widen_by}")
            else:
                noise = rel_l2(Wd[n], y)
                if a.widen_factor * noise > tol:
                    tol = a.widen_factor * noise
                    n_widened += 1
                    note = f"  (tol {tol:.2e} = {a.widen_factor:g} x {noise:.2e} of --widen-by)"
        diff = x - y
        rel = rel_l2(x, y)
        mad = float(diff.abs().max()) if diff.numel() else 0.0
        finite = bool(torch.isfinite(x).all())
        ok = finite and math.isfinite(rel) and rel <= tol
        if not ok:
            fails.append(f"{n}: rel L2 {rel:.3e} > {tol:.1e}" if finite else f"{n}: non-finite values")
        worst = max(worst, rel) if math.isfinite(rel) else float("inf")
        rows.append((n, "x".join(map(str, y.shape)) or "scalar", rel, mad, "ok" if ok else "FAIL", note))
    w = max([len(r[0]) for r in rows] + [4])
    print(f"{'name':<{w}}  {'shape':>12}  {'rel_l2':>10}  {'max_abs':>10}")
    for n, s, rel, mad, st, note in rows:
        print(f"{n:<{w}}  {s:>12}  {rel:10.3e}  {mad:10.3e}  {st}{note}")
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
    widened = f", {n_widened} widened by --widen-by" if Wd is not None else ""
    print(f"{status}: {len(rows)} tensors compared, {len(fails)} failures, worst rel L2 {worst:.3e} "
          f"(tol {a.rtol_l2:.1e}{widened}){loss_msg}")
    return 1 if fails else 0


def _name_key(n):
    if n.startswith("model.language_model."):  # Qwen3.5 released form: order as the text-only names
        n = "model." + n[len("model.language_model."):]
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
    m.add_argument("--arch", required=True, choices=sorted(ARCHS) + sorted(QWEN35_FORMS))
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
    m.add_argument("--attention-bias", action="store_true", help="qwen3/llama/qwen3_5: bias on q,k,v,o")
    m.add_argument("--mlp-bias", action="store_true", help="llama: bias on gate,up,down")
    m.add_argument("--rms-norm-eps", type=float, default=None, help="default 1e-6 (qwen), 1e-5 (llama)")
    m.add_argument("--rope-theta", type=float, default=None, help="default 1e6 (qwen), 5e5 (llama), 1e7 (qwen3_5)")
    m.add_argument("--max-position-embeddings", type=int, default=4096)
    m.add_argument("--batch", type=int, default=2)
    m.add_argument("--seq", type=int, default=37)
    m.add_argument("--docs", type=int, default=1, help=">1: packed rows, batch.json gets position_ids")
    m.add_argument("--dtype", choices=sorted(ST_DTYPE), default="float32", help="stored weight dtype")
    m.add_argument("--shards", type=int, default=1)
    m.add_argument("--config-style", choices=["classic", "v5"], default="classic",
                   help="v5: 'dtype' and 'rope_parameters' keys (newer transformers); qwen3_5 always v5")
    q5 = m.add_argument_group("qwen3_5 / qwen3_5_vl (hybrid Gated DeltaNet + gated attention)")
    q5.add_argument("--layer-types", default=None,
                    help="comma list of linear_attention|full_attention (or linear|full), one per layer; "
                         "default: the --full-attention-interval pattern")
    q5.add_argument("--full-attention-interval", type=int, default=4,
                    help="layer i is full attention iff (i+1) %% N == 0 (default 4); written as full_attention_interval")
    q5.add_argument("--omit-layer-types", action="store_true",
                    help="do not write layer_types (the loader derives it from full_attention_interval)")
    q5.add_argument("--linear-key-heads", type=int, default=2, help="linear_num_key_heads (default 2)")
    q5.add_argument("--linear-value-heads", type=int, default=4, help="linear_num_value_heads (default 4)")
    q5.add_argument("--linear-key-dim", type=int, default=16, help="linear_key_head_dim (default 16)")
    q5.add_argument("--linear-value-dim", type=int, default=16, help="linear_value_head_dim (default 16)")
    q5.add_argument("--conv-kernel", type=int, default=4, help="linear_conv_kernel_dim (default 4)")
    q5.add_argument("--partial-rotary-factor", type=float, default=0.25,
                    help="rope_parameters.partial_rotary_factor (default 0.25); int(head_dim * f) must be even")

    g = sub.add_parser("grad", help="loss + all parameter gradients (F32 safetensors)")
    g.add_argument("--model", required=True)
    g.add_argument("--batch", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--dtype", choices=["float32", "float64"], default="float64", help="compute dtype")
    g.add_argument("--rope-precision", choices=["hf", "exact"], default="hf",
                   help="hf: cos/sin in f32 as transformers (default); exact: float64")
    g.add_argument("--logits-out", default=None, help="also write logits [B, T, V] (F32) here")
    g.add_argument("--delta", choices=["recurrent", "chunked"], default="recurrent",
                   help="qwen3_5: gated delta rule step by step (default, the reference) or chunked (WY, 64)")
    g.add_argument("--emulate-bf16", action="store_true",
                   help="LazyTrain's --dtype bf16 GEMM rounding: every linear layer and lm_head rounds its GEMM "
                        "operands to bf16 (forward x, W; backward dy, W and dy, x); the rest in --dtype")
    g.add_argument("--emulate-bf16-storage", action="store_true",
                   help="LazyTrain's --activation-dtype bf16: each activation its backward reads, and each layer "
                        "boundary, rounded to bf16 where it is computed (see keep_bf16)")

    c = sub.add_parser("compare", help="relative-L2 comparison of two gradient files")
    c.add_argument("--ours", required=True)
    c.add_argument("--ref", required=True)
    c.add_argument("--rtol-l2", type=float, required=True)
    c.add_argument("--loss-ours", type=float, default=None)
    c.add_argument("--loss-ref", type=float, default=None)
    c.add_argument("--loss-rtol", type=float, default=1e-5)
    c.add_argument("--widen-by", default=None, metavar="FILE",
                   help="a second gradient file (e.g. grad --emulate-bf16): a tensor's tolerance becomes "
                        "max(--rtol-l2, --widen-factor x its rel L2 to --ref)")
    c.add_argument("--widen-factor", type=float, default=2.0)

    sc = sub.add_parser("selfcheck-delta", help="chunked vs recurrent gated delta rule (float64), prints PASS")
    sc.add_argument("--seed", type=int, default=0)
    sc.add_argument("--tol", type=float, default=1e-10, help="max relative difference (outputs and gradients)")

    fd = sub.add_parser("fdcheck", help="whole-model gradients vs central finite differences (float64)")
    fd.add_argument("--model", required=True)
    fd.add_argument("--batch", required=True)
    fd.add_argument("--names", default=None, help="regex: only tensors whose name matches (default: all)")
    fd.add_argument("--random", type=int, default=2, help="random entries per tensor besides the largest |g|")
    fd.add_argument("--h", type=float, default=1e-6, help="finite-difference step")
    fd.add_argument("--rtol", type=float, default=1e-5)
    fd.add_argument("--atol", type=float, default=1e-8)
    fd.add_argument("--seed", type=int, default=0)
    fd.add_argument("--rope-precision", choices=["hf", "exact"], default="hf")
    fd.add_argument("--delta", choices=["recurrent", "chunked"], default="recurrent")

    a = ap.parse_args(argv)
    try:
        if a.cmd == "make":
            return cmd_make(a) or 0
        if a.cmd == "grad":
            return cmd_grad(a) or 0
        if a.cmd == "selfcheck-delta":
            return cmd_selfcheck_delta(a)
        if a.cmd == "fdcheck":
            return cmd_fdcheck(a)
        return cmd_compare(a)
    except (RefError, SafetensorsError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"torch_reference.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
