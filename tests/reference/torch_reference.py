#!/usr/bin/python3
"""LazyTrain's independent PyTorch reference for whole-model correctness tests.

Runs with Debian's PyTorch (/usr/bin/python3; torch 1.13, numpy). No transformers, no safetensors package: the
Qwen2 / Qwen3 / Llama decoder forward, the Qwen3-MoE decoder (Qwen3 attention, routed SwiGLU experts), the
Qwen3.5 hybrid (Gated DeltaNet + gated attention) text model and its MoE variant (Qwen3.5 / Qwen3.6 MoE: a sparse
block with routed experts and a gated shared expert in every layer) are written here in plain torch following
transformers' modeling code (modeling_qwen2.py, modeling_qwen3.py, modeling_llama.py, modeling_qwen3_moe.py,
modeling_qwen3_5.py, modeling_qwen3_5_moe.py / qwen3_next's sparse block), and autograd gives the gradients.

Subcommands (see tests/reference/README.md):
  make             write a tiny random Hugging Face model directory (config.json + safetensors) and a batch.json
  grad             loss and every parameter's gradient for a batch, gradients as F32 safetensors under HF names
  compare          relative-L2 comparison of two gradient files (and optionally two losses)
  selfcheck-delta  the chunked gated delta rule against the step-by-step recurrence (float64), prints PASS
  fdcheck          whole-model autograd gradients against central finite differences (float64)
  selfcheck-moe    qwen3_moe and qwen3_5_moe: the routed experts (+ the shared expert) against a dense all-experts
                   formulation, per-expert against fused checkpoints (and qwen3_5_moe's text-only against its
                   vision-language form), the bf16 down/combine emulation against autograd (float64), prints PASS
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
import gpt_oss  # noqa: E402
import lora  # noqa: E402

IGNORE_INDEX = -100

ARCHS = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}

ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class RefError(Exception):
    pass


# --------------------------------------------------------------------------------------------------------
# config.json


def make_config(arch, layers, hidden, heads, kv_heads, head_dim, inter, vocab, tie, dtype,
                rms_eps, rope_theta, max_pos, attention_bias, mlp_bias, style, moe=None):
    """config.json as transformers (4.4x/4.5x) writes it for the model_type (json sort_keys, indent 2).
    style "v5" writes the newer layout: "dtype" instead of "torch_dtype" and rope_theta inside
    "rope_parameters" (what transformers >= 4.56 / 5 writes). moe (qwen3_moe): {num_experts, num_experts_per_tok,
    moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers}."""
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
        c.update({"bos_token_id": vocab - 2 if arch in ("qwen3", "qwen3_moe") else vocab - 1,
                  "eos_token_id": vocab - 1, "max_window_layers": layers, "sliding_window": None,
                  "use_sliding_window": False})
        if arch in ("qwen3", "qwen3_moe"):
            c.update({"head_dim": head_dim, "attention_bias": attention_bias})
        if arch == "qwen3_moe":
            # As the released Qwen3-30B-A3B config.json has them (router_aux_loss_coef 0.001; no aux loss while
            # output_router_logits is false).
            c.update({"num_experts": moe["num_experts"], "num_experts_per_tok": moe["num_experts_per_tok"],
                      "moe_intermediate_size": moe["moe_intermediate_size"], "norm_topk_prob": moe["norm_topk_prob"],
                      "decoder_sparse_step": moe["decoder_sparse_step"],
                      "mlp_only_layers": list(moe["mlp_only_layers"]), "output_router_logits": False,
                      "router_aux_loss_coef": 0.001})
    if style == "v5":
        c["dtype"] = c.pop("torch_dtype")
        c["rope_parameters"] = {"rope_theta": c.pop("rope_theta"), "rope_type": "default"}
        c.pop("rope_scaling")
        c["transformers_version"] = "4.57.1"
    return c


class Cfg:
    """What the forward needs, parsed from a config.json with transformers' defaults for missing keys."""

    def __init__(self, c, fused_experts=False):
        self.raw = c
        mt = c.get("model_type")
        if mt not in ARCHS:
            raise RefError(f"model_type {mt!r} not supported (qwen2, qwen3, llama, qwen3_moe)")
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
        elif mt in ("qwen3", "qwen3_moe"):
            ab = bool(c.get("attention_bias", False))
            self.qkv_bias, self.o_bias, self.mlp_bias = ab, ab, False
        else:
            ab = bool(c.get("attention_bias", False))
            self.qkv_bias, self.o_bias, self.mlp_bias = ab, ab, bool(c.get("mlp_bias", False))
        self.qk_norm = mt in ("qwen3", "qwen3_moe")
        # qwen3_moe (Qwen3MoeConfig's defaults). fused_experts: the checkpoint holds the transformers 5.x fused
        # expert tensors (load_model_dir detects it from the tensor names).
        self.fused_experts = bool(fused_experts)
        self.sparse = [False] * self.layers
        if mt == "qwen3_moe":
            self.experts = int(c.get("num_experts", 128))
            self.top_k = int(c.get("num_experts_per_tok", 8))
            self.moe_inter = int(c.get("moe_intermediate_size", 768))
            self.norm_topk_prob = bool(c.get("norm_topk_prob", False))
            self.sparse_step = int(c.get("decoder_sparse_step", 1))
            self.mlp_only_layers = [int(x) for x in (c.get("mlp_only_layers") or [])]
            if self.sparse_step < 1:
                raise RefError("decoder_sparse_step must be >= 1")
            if self.experts > 0 and not (1 <= self.top_k <= self.experts and self.moe_inter >= 1):
                raise RefError("qwen3_moe needs 1 <= num_experts_per_tok <= num_experts and moe_intermediate_size >= 1")
            if c.get("output_router_logits", False) and float(c.get("router_aux_loss_coef", 0.001)) != 0.0:
                raise RefError("output_router_logits true (the router auxiliary loss) is not supported by the "
                               "reference")
            # transformers: layer l is sparse iff l not in mlp_only_layers, num_experts > 0, (l+1) % step == 0.
            self.sparse = [i not in self.mlp_only_layers and self.experts > 0 and (i + 1) % self.sparse_step == 0
                           for i in range(self.layers)]
        elif fused_experts:
            raise RefError(f"fused experts in a {mt} model")

    def with_layout(self, fused):
        """The same config with the per-expert (fused=False) or fused expert tensor layout."""
        return Cfg(self.raw, fused_experts=fused)

    def detect_layout(self, names):
        """qwen3_moe: fused iff the checkpoint has transformers 5.x's mlp.experts.gate_up_proj tensors."""
        if self.arch == "qwen3_moe":
            self.fused_experts = any(n.endswith(".mlp.experts.gate_up_proj") for n in names)

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
            if self.sparse[i]:
                E, Ie = self.experts, self.moe_inter
                if self.fused_experts:  # transformers 5.x: Qwen3MoeExperts (gate rows first) before the router
                    s[p + "mlp.experts.gate_up_proj"] = (E, 2 * Ie, C)
                    s[p + "mlp.experts.down_proj"] = (E, C, Ie)
                    s[p + "mlp.gate.weight"] = (E, C)
                else:  # the released checkpoints / transformers 4.x: the router, then one SwiGLU per expert
                    s[p + "mlp.gate.weight"] = (E, C)
                    for e in range(E):
                        s[p + f"mlp.experts.{e}.gate_proj.weight"] = (Ie, C)
                        s[p + f"mlp.experts.{e}.up_proj.weight"] = (Ie, C)
                        s[p + f"mlp.experts.{e}.down_proj.weight"] = (C, Ie)
                continue
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
    if getattr(cfg, "mxfp4", False):
        gpt_oss.dequantize_checkpoint(cfg, tensors, dtypes)
    if hasattr(cfg, "detect_layout"):
        cfg.detect_layout(tensors)
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


class _ExpertDown(torch.autograd.Function):
    """One expert's down projection and its routing weight, as LazyTrain's bf16 GEMM mode computes them
    (model/moe_ffn.cpp moe_down_combine / moe_backward): for the expert's routed rows h [n, Ie], W_down [C, Ie],
    their routing weights w [n]:
      forward   y = w · (bf16(h) · bf16(W_down)ᵀ)           (the combine adds y into its tokens' rows)
      backward  from dz [n, C] (each row's token's dout):   g = bf16(dz) · bf16(W_down)  (linear_backward_input)
                dw = g · h (over Ie, h as stored);  dh = w · g;  dW_down = bf16(w · dz)ᵀ · bf16(h)
    Autograd on the plain formula would round w · dz for dh and read dout · y for dw; LazyTrain never forms
    the expert outputs in the backward, so the rounding points differ and this Function mirrors its. rnd: the
    rounding (bf16_round; selfcheck-moe passes the identity to compare it with autograd)."""

    @staticmethod
    def forward(ctx, h, wd, w, rnd):
        hr, wr = rnd(h), rnd(wd)
        ctx.save_for_backward(h, hr, wr, w)
        ctx.rnd = rnd
        return torch.matmul(hr, wr.t()) * w[:, None]

    @staticmethod
    def backward(ctx, dz):
        h, hr, wr, w = ctx.saved_tensors
        g = torch.matmul(ctx.rnd(dz), wr)
        dh = g * w[:, None]
        dwd = ctx.rnd(dz * w[:, None]).t() @ hr
        dw = (g * h).sum(-1)
        return dh, dwd, dw, None


def expert_weights(cfg, P, p, e):
    """(gate [Ie, C], up [Ie, C], down [C, Ie]) of expert e of layer prefix p, per-expert or fused (transformers
    5.x: gate_up_proj [E, 2·Ie, C], gate rows [0, Ie), up rows [Ie, 2·Ie); down_proj [E, C, Ie]); views, so
    autograd's gradients land in the fused tensors."""
    if cfg.fused_experts:
        gu = P[p + "mlp.experts.gate_up_proj"][e]
        return gu[: cfg.moe_inter], gu[cfg.moe_inter:], P[p + "mlp.experts.down_proj"][e]
    q = p + f"mlp.experts.{e}."
    return P[q + "gate_proj.weight"], P[q + "up_proj.weight"], P[q + "down_proj.weight"]


def moe_route(cfg, logits):
    """Qwen3MoeSparseMoeBlock's router: p = softmax(logits) (in the compute dtype; f32 or wider), the k largest p
    (best first), w = p_sel (÷ Σ p_sel when norm_topk_prob). Returns (probs [N, E], ids [N, k], w [N, k])."""
    probs = F.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    top_p, ids = torch.topk(probs, cfg.top_k, dim=-1, largest=True, sorted=True)
    if cfg.norm_topk_prob:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    return probs, ids, top_p.to(logits.dtype)


def moe_mlp(cfg, P, p, h, lin=F.linear, keep=keep_f32, routes=None):
    """A qwen3_moe sparse layer's MLP (qwen3_5_moe: its routed part) on h [B, T, C] (the kept post-attention norm
    output): the router (a linear layer: bf16 GEMM emulation applies, its logits / probs / weights are never
    rounded), then for each expert its routed rows: gate, up kept, h = silu(gate)·up kept (the dense MLP's storage
    points), the down projection times the routing weight, added into the token's row. routes: a list that gets
    (layer prefix, probs detached, router logits) per call."""
    B, T, C = h.shape
    x = h.reshape(B * T, C)
    logits = lin(x, P[p + "mlp.gate.weight"])
    probs, ids, w = moe_route(cfg, logits)
    if routes is not None:
        routes.append((p, probs.detach(), logits))
    out = torch.zeros_like(x)
    for e in range(cfg.experts):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        wg, wu, wd = expert_weights(cfg, P, p, e)
        xe = x[tok]
        lora = getattr(lin, "update", None)  # LoRA (lora.with_lora): the expert's adapters, masks on its tokens' rows
        g = keep(lin(xe, wg, rows=tok) if lora else lin(xe, wg))
        u = keep(lin(xe, wu, rows=tok) if lora else lin(xe, wu))
        he = keep(F.silu(g) * u)
        we = w[tok, slot]
        bf16 = getattr(lin, "base", lin) is bf16_linear
        y = _ExpertDown.apply(he, wd, we, bf16_round) if bf16 else F.linear(he, wd) * we[:, None]
        ud = lora(he, wd, rows=tok) if lora else None
        if ud is not None:  # the adapter's output joins the expert's, scaled by its routing weight
            y = y + ud * we[:, None]
        out = out.index_add(0, tok, y)
    return out.view(B, T, C)


def forward(cfg, P, input_ids, position_ids, packed, rope_precision="hf", lin=F.linear, keep=keep_f32, routes=None):
    """Logits [B, T, V] in the compute dtype of P. lin: the linear layers' (and lm_head's) function; keep: the
    activation storage's (keep_for); routes (qwen3_moe): a list that gets each sparse layer's router probs."""
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
        if cfg.sparse[i]:
            x = keep(residual + moe_mlp(cfg, P, p, h, lin, keep, routes))
            continue
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


def make_batch(gen, B, T, V, docs, pad=0):
    """pad > 0: right padding as a data collator pads (attention_mask 0, label -100): the last row's last `pad`
    positions, every other row's last pad // 2."""
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
    if pad:
        if docs > 1 or not 0 < pad < T - 1:
            raise RefError(f"--pad {pad}: needs unpacked rows (--docs 1) and 0 < pad < seq - 1")
        mask = torch.ones(B, T, dtype=torch.int64)
        for b in range(B):
            n = pad if b == B - 1 else pad // 2
            if n:
                mask[b, T - n:] = 0
                labels[b, T - n:] = IGNORE_INDEX
        out["attention_mask"] = mask.tolist()
    if T >= 2 and int((labels[:, 1:] != IGNORE_INDEX).sum()) == 0:
        labels[0, 1] = ids[0, 1]  # always at least one counted token
    out["labels"] = labels.tolist()
    return out


def load_balancing_loss_func(gate_logits, num_experts, top_k, attention_mask=None):
    """transformers' load_balancing_loss_func (Switch Transformers eqs. 4-6, as models/qwen3_moe computes it):
    every sparse layer's router logits [B·T, E] pooled; softmax, the top-k of it one-hot; with an attention mask
    [B, T] both means only over its 1s. aux = E · Σ_{j,e} f_{j,e} · P̄_e."""
    logits = torch.cat(list(gate_logits), dim=0)
    routing_weights = F.softmax(logits, dim=-1)
    _, selected = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected, num_experts)  # [R, k, E]
    if attention_mask is None:
        tokens_per_expert = expert_mask.to(logits.dtype).mean(0)
        router_prob_per_expert = routing_weights.mean(0)
    else:
        B, T = attention_mask.shape
        layers = logits.shape[0] // (B * T)
        m = attention_mask.to(logits.dtype)
        em = m[None, :, :, None, None].expand(layers, B, T, top_k, num_experts).reshape(-1, top_k, num_experts)
        tokens_per_expert = (expert_mask.to(logits.dtype) * em).sum(0) / em.sum(0)
        rm = m[None, :, :, None].expand(layers, B, T, num_experts).reshape(-1, num_experts)
        router_prob_per_expert = (routing_weights * rm).sum(0) / rm.sum(0)
    return (tokens_per_expert * router_prob_per_expert[None]).sum() * num_experts


def fuse_experts(cfg, T):
    """Per-expert tensors (cfg per-expert, names as its param_shapes) -> the fused layout's dict, in its order:
    gate_up_proj[e] = cat(gate_proj[e], up_proj[e]) [E, 2·Ie, C]; down_proj[e] = down_proj[e] [E, C, Ie]."""
    fc = cfg.with_layout(True)
    out = {}
    for n in fc.param_shapes():
        if n.endswith(".mlp.experts.gate_up_proj"):
            p = n[: -len("experts.gate_up_proj")]
            out[n] = torch.stack([torch.cat((T[p + f"experts.{e}.gate_proj.weight"],
                                             T[p + f"experts.{e}.up_proj.weight"])) for e in range(cfg.experts)])
        elif n.endswith(".mlp.experts.down_proj"):
            p = n[: -len("experts.down_proj")]
            out[n] = torch.stack([T[p + f"experts.{e}.down_proj.weight"] for e in range(cfg.experts)]).contiguous()
        else:
            out[n] = T[n]
    return out


def unfuse_experts(cfg, T):
    """The fused layout's tensors (names as the fused cfg's param_shapes; e.g. gradients) -> per-expert names in
    the per-expert order: gate_proj = gate_up_proj[e, :Ie], up_proj = gate_up_proj[e, Ie:], down_proj = down_proj[e]."""
    pc = cfg.with_layout(False)
    Ie = cfg.moe_inter
    out = {}
    for n in pc.param_shapes():
        if ".mlp.experts." in n:
            p, rest = n.split(".mlp.experts.")
            e, kind = rest.split(".")[:2]
            e = int(e)
            if kind == "down_proj":
                out[n] = T[p + ".mlp.experts.down_proj"][e].contiguous()
            else:
                gu = T[p + ".mlp.experts.gate_up_proj"][e]
                out[n] = (gu[:Ie] if kind == "gate_proj" else gu[Ie:]).contiguous()
        else:
            out[n] = T[n]
    return out


def route_margins(cfg, P, batch, st_dtype):
    """qwen3_moe, qwen3_5_moe forms: each token's routing distance from a tie, p_(k) − p_(k+1) (the k-th and
    (k+1)-th largest router probs), min over the sparse layers, for each reference variant check_model.py runs
    (float64; with the bf16 GEMM emulation, the bf16 storage emulation, both), on the weights as stored (rounded to
    the stored dtype). A tie closer than LazyTrain's f32 error could route a token to other experts than the
    reference does. None when k >= E (nothing is ever left out) or no layer is sparse. Returns {variant: (margins
    [B, T], the chosen experts [sparse layers, B, T, k] in ascending order)}. st_dtype: one safetensors dtype, or a
    dict name -> dtype."""
    if cfg.top_k >= cfg.experts or not any(cfg.sparse):
        return None
    tdts = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    X = {n: t.to(tdts[st_dtype[n] if isinstance(st_dtype, dict) else st_dtype]).to(torch.float64)
         for n, t in P.items()}
    ids = torch.tensor(batch["input_ids"], dtype=torch.int64)
    if "position_ids" in batch:
        pos, packed = torch.tensor(batch["position_ids"], dtype=torch.int64), True
    else:
        pos, packed = torch.arange(ids.shape[1], dtype=torch.int64)[None].expand_as(ids), False
    out = {}
    variants = (("float64", False, False), ("emulate-bf16", True, False), ("emulate-bf16-storage", False, True),
                ("emulate-both", True, True))
    for name, gemm, storage in variants:
        routes = []
        with torch.no_grad():
            model_forward(cfg, X, ids, pos, packed, emulate_bf16=gemm, emulate_storage=storage, routes=routes)
        m = torch.full(ids.shape, float("inf"), dtype=torch.float64)
        chosen = []
        for _, probs, _ in routes:
            top, idx = torch.topk(probs, cfg.top_k + 1, dim=-1)
            m = torch.minimum(m, (top[:, cfg.top_k - 1] - top[:, cfg.top_k]).view(ids.shape))
            chosen.append(idx[:, : cfg.top_k].sort(-1).values.view(*ids.shape, cfg.top_k))
        out[name] = (m, torch.stack(chosen))
    return out


def fix_route_ties(cfg, P, batch, st_dtype, gen, max_resamples):
    """Resamples input tokens until no token's routing is within ROUTE_MARGIN_MIN of a tie in any variant
    (route_margins) and every variant routes every token to the same experts as float64 (the bf16 roundings could
    otherwise move a token to another expert, a difference of O(1) in that expert's gradient that would dominate
    the case's bf16 noise and so loosen the emulated comparison's bound). Causal: token t's routing depends on
    tokens <= t only, so each row's first offending token is drawn again (its label follows, unless masked) and the
    later ones are looked at after. Returns ({variant: margins [B, T]} or None, tokens resampled, ok)."""
    V = cfg.vocab
    n = 0
    while True:
        stats = route_margins(cfg, P, batch, st_dtype)
        if stats is None:
            return None, n, True
        margins = {k: v[0] for k, v in stats.items()}
        worst = torch.stack(list(margins.values())).amin(0)  # [B, T]
        bad = worst < ROUTE_MARGIN_MIN
        ref = stats["float64"][1]
        for _, chosen in stats.values():
            bad |= (chosen != ref).any(-1).any(0)
        if not bool(bad.any()):
            return margins, n, True
        if n >= max_resamples:
            return margins, n, False
        for b in range(worst.shape[0]):
            if not bool(bad[b].any()):
                continue
            t = int(bad[b].nonzero()[0])
            old = batch["input_ids"][b][t]
            new = (old + 1 + int(torch.randint(0, V - 1, (1,), generator=gen))) % V  # another id, uniformly
            batch["input_ids"][b][t] = new
            if batch["labels"][b][t] != IGNORE_INDEX:
                batch["labels"][b][t] = new
            n += 1


ROUTE_MARGIN_MIN = 1e-3
ROUTE_ATTEMPTS = 50


def parse_int_list(s):
    s = (s or "").strip()
    try:
        return [int(x) for x in s.split(",") if x.strip()] if s else []
    except ValueError:
        raise RefError(f"expected a comma list of integers, got {s!r}")


def cmd_make(a):
    if a.arch in QWEN35_FORMS:
        return cmd_make_qwen35(a)
    if a.arch == "gpt_oss":
        return cmd_make_gpt_oss(a)
    moe = a.arch == "qwen3_moe"
    if not moe and (a.fused_experts or a.norm_topk_prob or a.mlp_only_layers):
        raise RefError("--fused-experts / --norm-topk-prob / --mlp-only-layers: qwen3_moe only")
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
    if a.arch in ("qwen3", "qwen3_moe") and a.mlp_bias:
        raise RefError(f"{a.arch} has no mlp_bias")
    moe_conf = None
    if moe:
        mlp_only = parse_int_list(a.mlp_only_layers)
        if any(not 0 <= l < a.layers for l in mlp_only):
            raise RefError(f"--mlp-only-layers {mlp_only}: layers are 0 .. {a.layers - 1}")
        if a.experts < 1 or not 1 <= a.experts_per_tok <= a.experts or a.moe_intermediate < 1:
            raise RefError("need --experts >= 1, 1 <= --experts-per-tok <= --experts, --moe-intermediate >= 1")
        if a.decoder_sparse_step < 1:
            raise RefError("--decoder-sparse-step must be >= 1")
        moe_conf = {"num_experts": a.experts, "num_experts_per_tok": a.experts_per_tok,
                    "moe_intermediate_size": a.moe_intermediate, "norm_topk_prob": bool(a.norm_topk_prob),
                    "decoder_sparse_step": a.decoder_sparse_step, "mlp_only_layers": mlp_only}
    kv = a.kv_heads if a.kv_heads is not None else a.heads
    eps = a.rms_norm_eps if a.rms_norm_eps is not None else (1e-5 if a.arch == "llama" else 1e-6)
    theta = a.rope_theta if a.rope_theta is not None else (500000.0 if a.arch == "llama" else 1000000.0)
    conf = make_config(a.arch, a.layers, a.hidden, a.heads, kv, hd, a.intermediate, a.vocab, a.tie, a.dtype,
                       eps, theta, a.max_position_embeddings, a.attention_bias, a.mlp_bias, a.config_style, moe_conf)
    cfg = Cfg(conf)  # per-expert layout: the draw is the same for --fused-experts
    extra = {}
    seed = a.seed
    for attempt in range(ROUTE_ATTEMPTS if moe else 1):
        # qwen3_moe: where a token's routing is within ROUTE_MARGIN_MIN of a tie (f32 and float64 might choose
        # different experts) the token is drawn again (fix_route_ties); should that not settle it, parameters and
        # batch are drawn again from a derived seed.
        seed = a.seed + 7919 * attempt
        gen = torch.Generator().manual_seed(seed)
        P = random_params(cfg, gen)
        batch = make_batch(gen, a.batch, a.seq, a.vocab, a.docs, a.pad)
        if not moe:
            break
        margins, resampled, ok = fix_route_ties(cfg, P, batch, ST_DTYPE[a.dtype], gen, 8 * a.batch * a.seq)
        if ok:
            break
        print(f"make: seed {seed}: a routing tie (margin {min(float(m.min()) for m in margins.values()):.3e}, "
              f"bound {ROUTE_MARGIN_MIN:.0e}) or variants routing apart after {resampled} tokens drawn again; "
              f"drawing all again", file=sys.stderr)
    else:
        raise RefError(f"no draw in {ROUTE_ATTEMPTS} (seeds {a.seed} + 7919·i) keeps every token's routing "
                       f"{ROUTE_MARGIN_MIN:.0e} away from a tie; use fewer tokens, experts or another --seed")
    if moe:
        extra = {"seed_used": seed, "attempts": attempt + 1, "tokens_resampled": resampled,
                 "sparse_layers": [i for i in range(cfg.layers) if cfg.sparse[i]],
                 "fused_experts": bool(a.fused_experts)}
        if margins is not None:
            mins = {k: float(v.min()) for k, v in margins.items()}
            extra["min_route_margin"] = min(mins.values())
            extra["route_margins"] = {k: float(f"{v:.6g}") for k, v in mins.items()}
    n_params = sum(t.numel() for t in P.values())
    n_tensors = len(P)
    if moe and a.fused_experts:
        P = fuse_experts(cfg, P)
    save_model_dir(a.out, conf, P, ST_DTYPE[a.dtype], a.shards)
    with open(os.path.join(a.out, "batch.json"), "w") as f:
        f.write(json.dumps(batch, separators=(",", ":")) + "\n")
    out = {"out": a.out, "arch": a.arch, "params": n_params, "tensors": len(P),
           "counted": sum(1 for r in batch["labels"] for l in r[1:] if l != IGNORE_INDEX)}
    if moe:
        out["per_expert_tensors"] = n_tensors
    out.update(extra)
    print(json.dumps(out))


def cmd_make_gpt_oss(a):
    """make --arch gpt_oss: fused input-major experts (bf16 or f32 files), tokens drawn again near routing ties."""
    if a.docs != 1 and a.pad:
        raise RefError("--pad needs unpacked rows")
    conf = gpt_oss.make_config(a)
    cfg = gpt_oss.GptOssCfg(conf)
    for attempt in range(ROUTE_ATTEMPTS):
        seed = a.seed + 7919 * attempt
        gen = torch.Generator().manual_seed(seed)
        P = gpt_oss.random_params(cfg, gen)
        quantized = gpt_oss.mxfp4_experts(cfg, P, gen) if a.mxfp4 else {}
        batch = make_batch(gen, a.batch, a.seq, a.vocab, a.docs, a.pad)
        margins, resampled, ok = fix_route_ties(cfg, P, batch, ST_DTYPE[a.dtype], gen, 8 * a.batch * a.seq)
        if ok:
            break
    else:
        raise RefError(f"no draw in {ROUTE_ATTEMPTS} keeps every token's routing {ROUTE_MARGIN_MIN:.0e} from a tie")
    if quantized:  # the released form: MXFP4 experts (uint8) beside everything else in the file dtype
        P = {n: t for n, t in P.items() if n not in {q[: -len("_blocks")] for q in quantized if q.endswith("_blocks")}}
        P.update(quantized)
        conf["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    save_model_dir(a.out, conf, P, {n: "U8" if n in quantized else ST_DTYPE[a.dtype] for n in P}, a.shards)
    with open(os.path.join(a.out, "batch.json"), "w") as f:
        f.write(json.dumps(batch, separators=(",", ":")) + "\n")
    print(json.dumps({"out": a.out, "arch": "gpt_oss", "params": sum(t.numel() for t in P.values()),
                      "tensors": len(P), "seed_used": seed, "tokens_resampled": resampled,
                      "min_route_margin": min(float(m.min()) for m in margins.values()),
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
    mask = None
    if "attention_mask" in b:  # right padding: causal attention never reads it for a token before it
        mask = torch.tensor(b["attention_mask"], dtype=torch.int64)
        if mask.shape != ids.shape or not bool(((mask == 0) | (mask == 1)).all()):
            raise RefError("batch: attention_mask must be 0/1 of input_ids' shape")
        if bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise RefError("batch: attention_mask must be right padding (1s, then 0s)")
    return ids, labels, pos, packed, mask


def cmd_grad(a):
    cdt = {"float32": torch.float32, "float64": torch.float64}[a.dtype]
    cfg, W, _ = load_model_dir(a.model)
    ids, labels, pos, packed, mask = load_batch(a.batch, cfg.vocab)
    P = {n: t.to(cdt).clone().requires_grad_(True) for n, t in W.items()}
    adapter = None
    if a.adapter:  # LoRA (lora.py): the base frozen, the adapter's tensors the ones whose gradients are written
        acfg, AT = lora.load_adapter(a.adapter)
        adapter = (acfg, lora.attach(P, acfg, AT, cdt))
    moe = getattr(cfg, "experts", 0) > 0 and any(getattr(cfg, "sparse", []))
    if a.moe_aux_loss_coef and not moe:
        raise RefError("--moe-aux-loss-coef: not a Mixture-of-Experts model")
    routes = [] if moe else None
    logits = model_forward(cfg, P, ids, pos, packed, a.rope_precision, a.delta, a.emulate_bf16,
                           a.emulate_bf16_storage, routes=routes, adapter=adapter)
    ce, n = causal_lm_loss(logits, labels)
    # As transformers' *MoeForCausalLM with output_router_logits: loss = CE + router_aux_loss_coef · aux.
    aux = load_balancing_loss_func([r[2] for r in routes], cfg.experts, cfg.top_k, mask) if moe else None
    loss = ce + a.moe_aux_loss_coef * aux if a.moe_aux_loss_coef else ce
    loss.backward()
    grads = {}
    for name, t in P.items():
        g = t.grad if t.grad is not None else torch.zeros_like(t)
        grads[name] = g.detach().to(torch.float32)
    if adapter is not None:  # the adapter's tensors alone, under its file's names
        grads = {lora.PREFIX + n: grads[n] for n in AT}
    elif isinstance(cfg, gpt_oss.GptOssCfg):  # LazyTrain's gradient dumps name experts one by one
        grads = gpt_oss.per_expert(cfg, grads)
    elif getattr(cfg, "fused_experts", False):
        grads = unfuse_experts(cfg, grads)
    d = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(d, exist_ok=True)
    write_safetensors(a.out, grads, dtype="F32")
    if a.logits_out:
        write_safetensors(a.logits_out, {"logits": logits.detach().to(torch.float32)}, dtype="F32")
    line = {"loss": float(loss.item()), "tokens": n}
    if moe:
        line.update({"ce_loss": float(ce.item()), "aux_loss": float(aux.item())})
    print(json.dumps(line))


def cmd_make_adapter(a):
    _, W, _ = load_model_dir(a.model)
    gen = torch.Generator().manual_seed(a.seed)
    lora.make_adapter(W, a.out, a.r, a.alpha, set(a.targets.split(",")), a.rslora, a.dropout,
                      [m for m in a.modules_to_save.split(",") if m], gen, a.model)
    print(json.dumps({"adapter": a.out}))


# --------------------------------------------------------------------------------------------------------
# Qwen3.5 / Qwen3.6 hybrid text model (transformers models/qwen3_5): Gated DeltaNet ("linear_attention") and
# gated softmax attention ("full_attention") layers, zero-centred RMSNorms. Two checkpoint forms:
#   qwen3_5     text-only: model_type qwen3_5_text, Qwen3_5ForCausalLM, weights under model.
#   qwen3_5_vl  released:  model_type qwen3_5 (text in text_config), Qwen3_5ForConditionalGeneration, text weights
#               under model.language_model., plus model.visual.* and mtp.* that the text model never uses.
# The Mixture-of-Experts variant (transformers models/qwen3_5_moe, Qwen3.5 / Qwen3.6 35B-A3B ...; its sparse block is
# qwen3_next's) has the same hybrid layers and the same two forms, with a sparse MLP in every layer: the qwen3_moe
# router and routed SwiGLU experts with the top-k always renormalised, plus a shared SwiGLU expert scaled by
# sigmoid(x · shared_expert_gateᵀ) (qwen35_moe_mlp):
#   qwen3_5_moe_text  text-only: model_type qwen3_5_moe_text, Qwen3_5MoeForCausalLM, weights under model.
#   qwen3_5_moe_vl    released:  model_type qwen3_5_moe (text_config qwen3_5_moe_text),
#                     Qwen3_5MoeForConditionalGeneration, weights under model.language_model. (+ visual, mtp)

QWEN35_FORMS = {
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", "model."),
    "qwen3_5_vl": ("qwen3_5", "Qwen3_5ForConditionalGeneration", "model.language_model."),
    "qwen3_5_moe_text": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "model."),
    "qwen3_5_moe_vl": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "model.language_model."),
}
QWEN35_MOE_FORMS = ("qwen3_5_moe_text", "qwen3_5_moe_vl")
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
    """A Qwen3.5 text model parsed from config.json (any of the four forms), with Qwen3_5TextConfig's defaults
    (Qwen3_5MoeTextConfig's for the MoE forms). fused_experts (MoE forms): the checkpoint holds transformers 5.x's
    fused expert tensors (load_model_dir detects it from the tensor names)."""

    def __init__(self, c, fused_experts=False):
        self.raw = c
        mt = c.get("model_type")
        outer = {"qwen3_5": ("qwen3_5_text", "qwen3_5_vl"), "qwen3_5_moe": ("qwen3_5_moe_text", "qwen3_5_moe_vl")}
        if mt in outer:
            inner, form = outer[mt]
            t = c.get("text_config")
            if not isinstance(t, dict):
                raise RefError(f"model_type {mt} without a text_config object")
            if t.get("model_type", inner) != inner:
                raise RefError(f"text_config.model_type {t.get('model_type')!r}, expected {inner}")
            self.form, self.prefix = form, "model.language_model."
            # The outer config owns tie_word_embeddings for Qwen3_5ForConditionalGeneration; fall back to
            # text_config's (make writes the same value in both).
            self.tie = bool(c.get("tie_word_embeddings", t.get("tie_word_embeddings", False)))
        elif mt in ("qwen3_5_text", "qwen3_5_moe_text"):
            t = c
            self.form, self.prefix = ("qwen3_5" if mt == "qwen3_5_text" else "qwen3_5_moe_text"), "model."
            self.tie = bool(t.get("tie_word_embeddings", False))
        else:
            raise RefError(f"model_type {mt!r} is not a Qwen3.5 model")
        self.arch = self.form
        self.text = t
        self.moe = self.form in QWEN35_MOE_FORMS
        self.fused_experts = bool(fused_experts)
        if self.fused_experts and not self.moe:
            raise RefError(f"fused experts in a {self.form} model")
        if self.moe:  # Qwen3_5MoeTextConfig's defaults (Qwen3.5-35B-A3B)
            self.vocab = int(t.get("vocab_size", 248320))
            self.hidden = int(t.get("hidden_size", 2048))
            self.inter = None  # no dense MLP: every layer is sparse
            self.layers = int(t.get("num_hidden_layers", 40))
            self.heads = int(t.get("num_attention_heads", 16))
            self.kv_heads = int(t.get("num_key_value_heads") or 2)
            self.head_dim = int(t.get("head_dim") or 256)
            self.experts = int(t.get("num_experts", 256))
            self.top_k = int(t.get("num_experts_per_tok", 8))
            self.moe_inter = int(t.get("moe_intermediate_size", 512))
            self.shared_inter = int(t.get("shared_expert_intermediate_size", 512))
            # No norm_topk_prob key: Qwen3_5MoeTopKRouter always divides the top-k probabilities by their sum.
            # (intermediate_size, decoder_sparse_step, mlp_only_layers and norm_topk_prob are not attributes of
            # Qwen3_5MoeTextConfig; the model ignores them if a config.json carries them.)
            self.norm_topk_prob = True
            if not (self.experts >= 1 and 1 <= self.top_k <= self.experts and self.moe_inter >= 1
                    and self.shared_inter >= 1):
                raise RefError("qwen3_5_moe needs num_experts >= 1, 1 <= num_experts_per_tok <= num_experts, "
                               "moe_intermediate_size >= 1 and shared_expert_intermediate_size >= 1")
            if t.get("output_router_logits", False) and float(t.get("router_aux_loss_coef", 0.001)) != 0.0:
                raise RefError("output_router_logits true (the router auxiliary loss) is not supported by the "
                               "reference")
        else:
            self.vocab = int(t.get("vocab_size", 248320))
            self.hidden = int(t.get("hidden_size", 4096))
            self.inter = int(t.get("intermediate_size", 12288))
            self.layers = int(t.get("num_hidden_layers", 32))
            self.heads = int(t.get("num_attention_heads", 16))
            self.kv_heads = int(t.get("num_key_value_heads") or 4)
            self.head_dim = int(t.get("head_dim") or 256)
        self.sparse = [self.moe] * self.layers
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

    def with_layout(self, fused):
        """The same config with the per-expert (fused=False) or fused expert tensor layout (MoE forms)."""
        return Qwen35Cfg(self.raw, fused_experts=fused)

    def detect_layout(self, names):
        """MoE forms: fused iff the text model's tensors include transformers 5.x's mlp.experts.gate_up_proj."""
        if self.moe:
            self.fused_experts = any(n.startswith(self.prefix) and n.endswith(".mlp.experts.gate_up_proj")
                                     for n in names)

    def moe_mlp_shapes(self, p, fused):
        """A sparse MoE block's tensors under layer prefix p, in module order (Qwen3NextSparseMoeBlock: the router
        gate, the experts, the shared expert, its gate): per-expert (the released per-expert / FP8 checkpoints,
        transformers 4.x) or fused (transformers 5.x: gate_up_proj [E, 2·Ie, C], gate rows first; down_proj
        [E, C, Ie])."""
        C, E, Ie, Is = self.hidden, self.experts, self.moe_inter, self.shared_inter
        s = {p + "mlp.gate.weight": (E, C)}
        if fused:
            s[p + "mlp.experts.gate_up_proj"] = (E, 2 * Ie, C)
            s[p + "mlp.experts.down_proj"] = (E, C, Ie)
        else:
            for e in range(E):
                s[p + f"mlp.experts.{e}.gate_proj.weight"] = (Ie, C)
                s[p + f"mlp.experts.{e}.up_proj.weight"] = (Ie, C)
                s[p + f"mlp.experts.{e}.down_proj.weight"] = (C, Ie)
        s[p + "mlp.shared_expert.gate_proj.weight"] = (Is, C)
        s[p + "mlp.shared_expert.up_proj.weight"] = (Is, C)
        s[p + "mlp.shared_expert.down_proj.weight"] = (C, Is)
        s[p + "mlp.shared_expert_gate.weight"] = (1, C)
        return s

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
            if self.moe:
                s.update(self.moe_mlp_shapes(p, self.fused_experts))
                continue
            s[p + "mlp.gate_proj.weight"] = (I, C)
            s[p + "mlp.up_proj.weight"] = (I, C)
            s[p + "mlp.down_proj.weight"] = (C, I)
        s[m + "norm.weight"] = (C,)
        if not self.tie:
            s["lm_head.weight"] = (V, C)
        return s


def qwen35_vision_config(text_hidden, model_type="qwen3_5"):
    """A tiny vision_config in the released layout (the released one has depth 27 / 24, hidden 1152 / 1024 ...).
    model_type as the released checkpoints write it (the outer one: qwen3_5, qwen3_5_moe)."""
    return {"deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 16,
            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 32, "model_type": model_type,
            "num_heads": 2, "num_position_embeddings": 16, "out_hidden_size": text_hidden, "patch_size": 4,
            "spatial_merge_size": 2, "temporal_patch_size": 2}


def qwen35_extra_shapes(cfg, vis):
    """model.visual.* (Qwen3_5VisionModel) and mtp.* (the multi-token-prediction head of the released
    checkpoints: one full-attention layer; for the MoE forms with a sparse MoE block, its experts one tensor each
    here -- make fuses them with the text model's for --fused-experts) tensor shapes; stored, never used by the
    text model."""
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
              p + "self_attn.k_norm.weight": (D,), p + "post_attention_layernorm.weight": (C,)})
    if cfg.moe:
        s.update(cfg.moe_mlp_shapes(p, False))
    else:
        s.update({p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
                  p + "mlp.down_proj.weight": (C, I)})
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
    if form in QWEN35_MOE_FORMS:
        # As the released Qwen3.5-35B-A3B text_config: no intermediate_size (every layer sparse), no norm_topk_prob
        # (always renormalised); router_aux_loss_coef 0.001, no aux loss while output_router_logits is false.
        del t["intermediate_size"]
        t.update({"model_type": "qwen3_5_moe_text", "moe_intermediate_size": a.moe_intermediate,
                  "num_experts": a.experts, "num_experts_per_tok": a.experts_per_tok, "output_router_logits": False,
                  "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": a.shared_intermediate})
    outer_type, arch, _ = QWEN35_FORMS[form]
    version = "4.57.0.dev0"
    if form in ("qwen3_5", "qwen3_5_moe_text"):
        t["architectures"] = [arch]
        t["transformers_version"] = version
        return t
    t["mtp_num_hidden_layers"] = 1
    t["mtp_use_dedicated_embeddings"] = False
    return {
        "architectures": [arch],
        "image_token_id": V - 4,
        "model_type": outer_type,
        "text_config": t,
        "tie_word_embeddings": a.tie,
        "transformers_version": version,
        "video_token_id": V - 3,
        "vision_config": qwen35_vision_config(a.hidden, outer_type),
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


def qwen35_moe_mlp(cfg, P, p, h, lin=F.linear, keep=keep_f32, routes=None):
    """The Qwen3.5-MoE sparse block (Qwen3NextSparseMoeBlock) on h [B, T, C] (the kept post-attention norm output):
    routed = the qwen3_moe routed experts (moe_mlp; cfg.norm_topk_prob is always true here: the top-k
    probabilities renormalised); shared = down_s(silu(gate_s h) · up_s h), with gate_s, up_s and their product
    kept as the dense MLP keeps them (the down projection's output is not stored); the shared expert's gate
    logit l = h · shared_expert_gateᵀ [B, T, 1] (a linear layer: the bf16 GEMM emulation applies; never rounded
    by the storage emulation, a gate stays f32). Output routed + sigmoid(l) · shared, in that order."""
    routed = moe_mlp(cfg, P, p, h, lin, keep, routes)
    q = p + "mlp.shared_expert."
    gs = keep(lin(h, P[q + "gate_proj.weight"]))
    us = keep(lin(h, P[q + "up_proj.weight"]))
    shared = lin(keep(F.silu(gs) * us), P[q + "down_proj.weight"])
    logit = lin(h, P[p + "mlp.shared_expert_gate.weight"])
    return routed + torch.sigmoid(logit) * shared


def qwen35_forward(cfg, P, input_ids, position_ids, packed, rope_precision="hf", delta_impl="recurrent",
                   lin=F.linear, keep=keep_f32, routes=None):
    """Logits [B, T, V] of the Qwen3.5 text model in the compute dtype of P. lin: the linear layers' (and
    lm_head's) function; keep: the activation storage's (keep_for); routes (MoE forms): a list that gets
    (layer prefix, router probs [B·T, E]) per layer."""
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
        if cfg.moe:
            x = keep(x + qwen35_moe_mlp(cfg, P, p, h, lin, keep, routes))
            continue
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


def fuse_named_experts(T, experts):
    """Any dict's per-expert tensors (X.mlp.experts.{e}.{gate,up,down}_proj.weight, e < experts) -> the fused
    X.mlp.experts.gate_up_proj / down_proj (as fuse_experts), put where expert 0's gate_proj was; the rest as is.
    For tensors outside a config's param_shapes (the qwen3_5_moe_vl form's mtp.* layer)."""
    out = {}
    for n, t in T.items():
        if ".mlp.experts." not in n:
            out[n] = t
            continue
        p, rest = n.split(".mlp.experts.")
        if rest != "0.gate_proj.weight":
            continue
        q = p + ".mlp.experts."
        out[q + "gate_up_proj"] = torch.stack([torch.cat((T[q + f"{e}.gate_proj.weight"], T[q + f"{e}.up_proj.weight"]))
                                               for e in range(experts)])
        out[q + "down_proj"] = torch.stack([T[q + f"{e}.down_proj.weight"] for e in range(experts)]).contiguous()
    return out


def cmd_make_qwen35(a):
    form = a.arch
    vl = form in ("qwen3_5_vl", "qwen3_5_moe_vl")
    moe = form in QWEN35_MOE_FORMS
    if a.vocab < (8 if vl else 3):
        raise RefError("--vocab must be >= 3 (qwen3_5_vl, qwen3_5_moe_vl: >= 8, for the special token ids)")
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
    if not moe and a.fused_experts:
        raise RefError("--fused-experts: qwen3_moe, qwen3_5_moe_text, qwen3_5_moe_vl only")
    if moe:
        if a.norm_topk_prob or a.mlp_only_layers or a.decoder_sparse_step != 1:
            raise RefError("qwen3_5_moe has no norm_topk_prob (always renormalised), mlp_only_layers or "
                           "decoder_sparse_step (every layer sparse)")
        if a.experts < 1 or not 1 <= a.experts_per_tok <= a.experts or a.moe_intermediate < 1 \
                or a.shared_intermediate < 1:
            raise RefError("need --experts >= 1, 1 <= --experts-per-tok <= --experts, --moe-intermediate >= 1, "
                           "--shared-intermediate >= 1")
    derived = qwen35_layer_types_from_interval(a.layers, a.full_attention_interval)
    layer_types = parse_layer_types(a.layer_types, a.layers) if a.layer_types else derived
    if a.omit_layer_types and layer_types != derived:
        raise RefError("--omit-layer-types: the layer types must then be the --full-attention-interval pattern")
    conf = qwen35_make_config(form, a, layer_types, not a.omit_layer_types)
    cfg = Qwen35Cfg(conf)  # validates (head multiples, even rotary dims ...); per-expert layout: the draw is the
    assert cfg.layer_types == layer_types  # same for --fused-experts
    st = ST_DTYPE[a.dtype]
    for attempt in range(ROUTE_ATTEMPTS if moe else 1):
        # MoE forms: tokens routed within ROUTE_MARGIN_MIN of a tie are drawn again (fix_route_ties), and should
        # that not settle it, everything is drawn again from a derived seed (as for qwen3_moe).
        seed = a.seed + 7919 * attempt
        gen = torch.Generator().manual_seed(seed)
        P = qwen35_random_params(cfg, gen)
        extras = {}
        if vl:
            extras = qwen35_random_extras(qwen35_extra_shapes(cfg, conf["vision_config"]), gen)
        allp = dict(P)
        allp.update(extras)
        dtypes = {n: ("F32" if st != "F32" and n.endswith(QWEN35_F32_SUFFIXES) else st) for n in allp}
        batch = make_batch(gen, a.batch, a.seq, a.vocab, a.docs, a.pad)
        if not moe:
            break
        margins, resampled, ok = fix_route_ties(cfg, P, batch, dtypes, gen, 8 * a.batch * a.seq)
        if ok:
            break
        print(f"make: seed {seed}: a routing tie (margin {min(float(m.min()) for m in margins.values()):.3e}, "
              f"bound {ROUTE_MARGIN_MIN:.0e}) or variants routing apart after {resampled} tokens drawn again; "
              f"drawing all again", file=sys.stderr)
    else:
        raise RefError(f"no draw in {ROUTE_ATTEMPTS} (seeds {a.seed} + 7919·i) keeps every token's routing "
                       f"{ROUTE_MARGIN_MIN:.0e} away from a tie; use fewer tokens, experts or another --seed")
    n_params, n_tensors = sum(t.numel() for t in P.values()), len(P)
    if moe and a.fused_experts:
        P = fuse_experts(cfg, P)
        extras = fuse_named_experts(extras, cfg.experts)
        allp = dict(P)
        allp.update(extras)
        dtypes = {n: ("F32" if st != "F32" and n.endswith(QWEN35_F32_SUFFIXES) else st) for n in allp}
    save_model_dir(a.out, conf, allp, dtypes, a.shards)
    with open(os.path.join(a.out, "batch.json"), "w") as f:
        f.write(json.dumps(batch, separators=(",", ":")) + "\n")
    out = {"out": a.out, "arch": form, "params": n_params, "tensors": len(P), "ignored_tensors": len(extras),
           "layer_types": layer_types, "counted": sum(1 for r in batch["labels"] for l in r[1:] if l != IGNORE_INDEX)}
    if moe:
        out.update({"per_expert_tensors": n_tensors, "seed_used": seed, "attempts": attempt + 1,
                    "tokens_resampled": resampled, "fused_experts": bool(a.fused_experts)})
        if margins is not None:
            mins = {k: float(v.min()) for k, v in margins.items()}
            out["min_route_margin"] = min(mins.values())
            out["route_margins"] = {k: float(f"{v:.6g}") for k, v in mins.items()}
    print(json.dumps(out))


def parse_config(c):
    """Cfg (qwen2 / qwen3 / llama / qwen3_moe), Qwen35Cfg (qwen3_5_text / qwen3_5 / qwen3_5_moe_text /
    qwen3_5_moe) or gpt_oss.GptOssCfg from a config.json dict."""
    if c.get("model_type") in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"):
        return Qwen35Cfg(c)
    if c.get("model_type") == "gpt_oss":
        return gpt_oss.GptOssCfg(c)
    return Cfg(c)


def model_forward(cfg, P, ids, pos, packed, rope_precision="hf", delta_impl="recurrent", emulate_bf16=False,
                  emulate_storage=False, routes=None, adapter=None):
    """Logits [B, T, V]. emulate_bf16: every linear layer and the lm_head with LazyTrain's bf16 GEMM rounding
    (bf16_linear); emulate_storage: its bf16 activation storage (keep_bf16); everything else in the compute
    dtype of P. routes (qwen3_moe, qwen3_5_moe forms): a list that gets (layer prefix, router probs [B·T, E]
    detached, router logits [B·T, E]) per sparse layer."""
    lin, keep = gemm_for(emulate_bf16), keep_for(emulate_storage)
    if adapter is not None:  # (adapter config, {id(W): adapted linear}) from lora.attach: LoRA on the linears
        lin = lora.with_lora(lin, P, adapter[1], adapter[0])
    if isinstance(cfg, gpt_oss.GptOssCfg):
        return gpt_oss.forward(cfg, P, ids, pos, attention_mask(pos, packed), rms_norm, repeat_kv, routes, lin,
                               keep, bf16_round if emulate_bf16 else None, bf16_round if emulate_storage else None)
    if isinstance(cfg, Qwen35Cfg):
        return qwen35_forward(cfg, P, ids, pos, packed, rope_precision, delta_impl, lin, keep, routes)
    return forward(cfg, P, ids, pos, packed, rope_precision, lin, keep, routes)


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


def cmd_selfcheck_gpt_oss(a):
    """gpt_oss.selfcheck, then a tiny model (sliding and full layers, sinks, YaRN, clamps reached) through fdcheck."""
    import tempfile
    lines, ok = gpt_oss.selfcheck(a.seed)
    print("\n".join(lines))
    with tempfile.TemporaryDirectory(prefix="lt_gpt_oss_") as d:
        model = os.path.join(d, "model")
        make = ["make", "--arch", "gpt_oss", "--out", model, "--seed", str(a.seed + 3), "--layers", "2", "--hidden",
                "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--vocab", "61", "--experts", "5",
                "--experts-per-tok", "2", "--moe-intermediate", "12", "--batch", "2", "--seq", "19"]
        if main(make) != 0:
            return 1
        status = main(["fdcheck", "--model", model, "--batch", os.path.join(model, "batch.json")])
    ok = ok and status == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def cmd_fdcheck(a):
    """Autograd gradients of the whole model against central finite differences, float64."""
    cfg, W, _ = load_model_dir(a.model)
    ids, labels, pos, packed, _ = load_batch(a.batch, cfg.vocab)
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


def moe_mlp_dense(cfg, P, p, h, keep=keep_f32):
    """moe_mlp written the other way round (selfcheck-moe): every expert on every token, the routing as a dense
    [N, E] weight matrix (zero where not chosen). Same router; float64 only (no GEMM emulation)."""
    B, T, C = h.shape
    x = h.reshape(B * T, C)
    _, ids, w = moe_route(cfg, F.linear(x, P[p + "mlp.gate.weight"]))
    M = torch.zeros(B * T, cfg.experts, dtype=x.dtype).scatter(1, ids, w)
    out = torch.zeros_like(x)
    for e in range(cfg.experts):
        wg, wu, wd = expert_weights(cfg, P, p, e)
        he = keep(F.silu(keep(x @ wg.t())) * keep(x @ wu.t()))
        out = out + M[:, e:e + 1] * (he @ wd.t())
    return out.view(B, T, C)


def _loss_grads(cfg, W, ids, labels, pos, packed, gemm, storage):
    P = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in W.items()}
    loss, _ = causal_lm_loss(model_forward(cfg, P, ids, pos, packed, emulate_bf16=gemm, emulate_storage=storage),
                             labels)
    loss.backward()
    G = {n: (t.grad if t.grad is not None else torch.zeros_like(t)).detach() for n, t in P.items()}
    return float(loss), G


def cmd_selfcheck_moe(a):
    """qwen3_moe self-checks, float64, independent of LazyTrain:
      1. moe_mlp (routed rows gathered per expert, index_add) == moe_mlp_dense (all experts on all tokens, a dense
         routing matrix): outputs and gradients (input, router, experts), f32 and bf16 storage;
      2. _ExpertDown with the identity for its rounding == autograd of w · (h W_downᵀ);
      3. a per-expert and a fused checkpoint of the same parameters (written and read back) give the same loss and,
         after splitting the fused gradients, the same per-expert gradients, for the float64 reference and each
         emulation (bf16 GEMMs, bf16 storage, both);
      4. the same for qwen3_5_moe (_selfcheck_qwen35_moe): routed + shared expert vs the dense formulation,
         per-expert vs fused and text-only vs vision-language checkpoints."""
    import tempfile
    torch.manual_seed(a.seed)
    dt = torch.float64
    worst = 0.0
    lines = []
    for renorm in (False, True):
        conf = make_config("qwen3_moe", 3, 24, 4, 2, 8, 30, 53, False, "float32", 1e-6, 1e6, 4096, False, False,
                           "classic", {"num_experts": 5, "num_experts_per_tok": 2, "moe_intermediate_size": 10,
                                       "norm_topk_prob": renorm, "decoder_sparse_step": 1, "mlp_only_layers": [1]})
        cfg = Cfg(conf)
        gen = torch.Generator().manual_seed(a.seed + renorm)
        P = random_params(cfg, gen)
        # 1. routed vs dense, on a random normed input of layer 0
        p = "model.layers.0."
        for keep in (keep_f32, keep_bf16):
            h0 = torch.randn(2, 19, cfg.hidden, dtype=dt)
            outs, grads = [], []
            for fn in (moe_mlp, moe_mlp_dense):
                X = {n: t.to(dt).clone().requires_grad_(True) for n, t in P.items() if n.startswith(p + "mlp.")}
                h = h0.clone().requires_grad_(True)
                o = fn(cfg, X, p, h, keep=keep)
                r = torch.randn(o.shape, generator=torch.Generator().manual_seed(5), dtype=dt)
                (o * r).sum().backward()
                outs.append(o.detach())
                grads.append([h.grad] + [X[n].grad for n in sorted(X)])
            e_out = _max_rel(outs[0], outs[1])
            e_grad = max(_max_rel(x, y) for x, y in zip(grads[0], grads[1]))
            worst = max(worst, e_out, e_grad)
            lines.append(f"routed vs dense experts (norm_topk_prob={renorm}, storage "
                         f"{'bf16' if keep is keep_bf16 else 'f32'}): out max rel {e_out:.2e}, "
                         f"grad max rel {e_grad:.2e}")
        # 2. the down/combine Function without rounding vs autograd
        hh = torch.randn(13, 10, dtype=dt)
        wd = torch.randn(24, 10, dtype=dt)
        ww = torch.rand(13, dtype=dt)
        dz = torch.randn(13, 24, dtype=dt)
        res = []
        for use_fn in (True, False):
            L = [t.clone().requires_grad_(True) for t in (hh, wd, ww)]
            y = _ExpertDown.apply(L[0], L[1], L[2], lambda t: t) if use_fn else F.linear(L[0], L[1]) * L[2][:, None]
            (y * dz).sum().backward()
            res.append([y.detach()] + [t.grad for t in L])
        e_fn = max(_max_rel(x, y) for x, y in zip(res[0], res[1]))
        worst = max(worst, e_fn)
        lines.append(f"_ExpertDown (no rounding) vs autograd (norm_topk_prob={renorm}): max rel {e_fn:.2e}")
        # 3. per-expert vs fused checkpoints
        batch = make_batch(gen, 2, 17, cfg.vocab, 1)
        with tempfile.TemporaryDirectory(prefix="lt_moe_selfcheck_") as tmp:
            dirs = {}
            for fused in (False, True):
                d = os.path.join(tmp, "fused" if fused else "per_expert")
                save_model_dir(d, conf, fuse_experts(cfg, P) if fused else P, "F32", 2)
                dirs[fused] = d
            ids = torch.tensor(batch["input_ids"])
            labels = torch.tensor(batch["labels"])
            pos = torch.arange(ids.shape[1])[None].expand_as(ids)
            for gemm, storage in ((False, False), (True, False), (False, True), (True, True)):
                res = {}
                for fused, d in dirs.items():
                    c2, W2, _ = load_model_dir(d)
                    assert c2.fused_experts == fused
                    loss, G = _loss_grads(c2, W2, ids, labels, pos, False, gemm, storage)
                    res[fused] = (loss, unfuse_experts(c2, G) if fused else G)
                (l0, G0), (l1, G1) = res[False], res[True]
                if sorted(G0) != sorted(G1):
                    raise RefError("per-expert and split fused gradients have different names")
                e_loss = abs(l0 - l1) / abs(l0)
                e_g = max(rel_l2(G1[n], G0[n]) for n in G0)
                e_max = max(_max_rel(G1[n], G0[n]) for n in G0 if float(G0[n].abs().max()) > 0)
                worst = max(worst, e_loss, e_g)
                lines.append(f"per-expert vs fused checkpoint (norm_topk_prob={renorm}, gemm "
                             f"{'bf16' if gemm else 'f64'}, storage {'bf16' if storage else 'f64'}): loss {l0:.15g} vs "
                             f"{l1:.15g} (rel {e_loss:.2e}), grads worst rel-L2 {e_g:.2e}, max rel {e_max:.2e} "
                             f"over {len(G0)} tensors")
    worst = max(worst, _selfcheck_qwen35_moe(a, lines))
    for ln in lines:
        print(ln)
    ok = worst <= a.tol
    print(f"{'PASS' if ok else 'FAIL'}: qwen3_moe and qwen3_5_moe self-checks, worst {worst:.2e} (tol {a.tol:.0e})")
    return 0 if ok else 1


def qwen35_moe_mlp_dense(cfg, P, p, h, keep=keep_f32):
    """qwen35_moe_mlp written the other way round (selfcheck-moe): moe_mlp_dense for the routed experts, the shared
    expert as plain matmuls and its gate as an elementwise product summed over C. float64 only."""
    q = p + "mlp.shared_expert."
    gs = keep(h @ P[q + "gate_proj.weight"].t())
    us = keep(h @ P[q + "up_proj.weight"].t())
    shared = keep(F.silu(gs) * us) @ P[q + "down_proj.weight"].t()
    gate = torch.sigmoid((h * P[p + "mlp.shared_expert_gate.weight"][0]).sum(-1, keepdim=True))
    return moe_mlp_dense(cfg, P, p, h, keep) + gate * shared


def qwen35_moe_test_args(form, **kw):
    """The make options qwen35_make_config reads, for a tiny qwen3_5_moe model (selfcheck-moe)."""
    import types
    d = dict(arch=form, layers=3, hidden=24, heads=4, kv_heads=2, head_dim=8, intermediate=0, vocab=53, tie=False,
             attention_bias=False, rms_norm_eps=None, rope_theta=None, max_position_embeddings=4096,
             dtype="float32", full_attention_interval=2, linear_key_heads=1, linear_value_heads=2,
             linear_key_dim=8, linear_value_dim=6, conv_kernel=4, partial_rotary_factor=0.5, experts=5,
             experts_per_tok=2, moe_intermediate=10, shared_intermediate=12)
    d.update(kw)
    return types.SimpleNamespace(**d)


def _selfcheck_qwen35_moe(a, lines):
    """selfcheck-moe's qwen3_5_moe part, float64 (returns the worst difference, appends its lines):
      1. qwen35_moe_mlp (routed rows + the shared expert) == qwen35_moe_mlp_dense: outputs and gradients (input,
         router, experts, shared expert, its gate), f32 and bf16 storage;
      2. per-expert and fused checkpoints (written and read back; the vision-language form with its visual and
         mtp tensors) of the same parameters, and the text-only and vision-language forms (the same parameters
         under model. and model.language_model.), give the same loss and, after splitting the fused gradients and
         renaming, the same gradients: the float64 reference and each emulation (bf16 GEMMs, bf16 storage, both)."""
    import tempfile
    dt = torch.float64
    worst = 0.0
    layer_types = [LINEAR_ATTN, FULL_ATTN, LINEAR_ATTN]
    conf_t = qwen35_make_config("qwen3_5_moe_text", qwen35_moe_test_args("qwen3_5_moe_text"), layer_types, True)
    cfg = Qwen35Cfg(conf_t)
    gen = torch.Generator().manual_seed(a.seed + 2)
    P = qwen35_random_params(cfg, gen)
    # 1. routed + shared vs dense, on a random normed input of layers 0 (Gated DeltaNet) and 1 (attention)
    for p in ("model.layers.0.", "model.layers.1."):
        for keep in (keep_f32, keep_bf16):
            h0 = torch.randn(2, 19, cfg.hidden, dtype=dt)
            outs, grads = [], []
            for fn in (qwen35_moe_mlp, qwen35_moe_mlp_dense):
                X = {n: t.to(dt).clone().requires_grad_(True) for n, t in P.items() if n.startswith(p + "mlp.")}
                h = h0.clone().requires_grad_(True)
                o = fn(cfg, X, p, h, keep=keep)
                r = torch.randn(o.shape, generator=torch.Generator().manual_seed(5), dtype=dt)
                (o * r).sum().backward()
                outs.append(o.detach())
                grads.append([h.grad] + [X[n].grad for n in sorted(X)])
            e_out = _max_rel(outs[0], outs[1])
            e_grad = max(_max_rel(x, y) for x, y in zip(grads[0], grads[1]))
            worst = max(worst, e_out, e_grad)
            lines.append(f"qwen3_5_moe {p}mlp routed + shared vs dense experts (storage "
                         f"{'bf16' if keep is keep_bf16 else 'f32'}): out max rel {e_out:.2e}, grad max rel "
                         f"{e_grad:.2e} over {len(grads[0])} tensors")
    # 2. per-expert vs fused checkpoints, text-only vs vision-language form
    batch = make_batch(gen, 2, 17, cfg.vocab, 2)
    ids = torch.tensor(batch["input_ids"])
    labels = torch.tensor(batch["labels"])
    pos = torch.tensor(batch["position_ids"])
    conf_v = qwen35_make_config("qwen3_5_moe_vl", qwen35_moe_test_args("qwen3_5_moe_vl"), layer_types, True)
    cfg_v = Qwen35Cfg(conf_v)
    Pv = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): t for n, t in P.items()}
    extras = qwen35_random_extras(qwen35_extra_shapes(cfg_v, conf_v["vision_config"]), gen)
    with tempfile.TemporaryDirectory(prefix="lt_moe35_selfcheck_") as tmp:
        dirs = {}
        for form, c, conf, W in (("text", cfg, conf_t, P), ("vl", cfg_v, conf_v, Pv)):
            for fused in (False, True):
                d = os.path.join(tmp, f"{form}_{'fused' if fused else 'per_expert'}")
                T = dict(fuse_experts(c, W) if fused else W)
                if form == "vl":
                    T.update(fuse_named_experts(extras, c.experts) if fused else extras)
                save_model_dir(d, conf, T, "F32", 2)
                dirs[(form, fused)] = d
        for gemm, storage in ((False, False), (True, False), (False, True), (True, True)):
            res = {}
            for key, d in dirs.items():
                c2, W2, _ = load_model_dir(d)
                assert c2.fused_experts == key[1] and c2.form == "qwen3_5_moe_" + key[0]
                loss, G = _loss_grads(c2, W2, ids, labels, pos, True, gemm, storage)
                G = unfuse_experts(c2, G) if key[1] else G
                res[key] = (loss, {("model." + n[len("model.language_model."):]
                                    if n.startswith("model.language_model.") else n): g for n, g in G.items()})
            l0, G0 = res[("text", False)]
            for key in dirs:
                if key == ("text", False):
                    continue
                l1, G1 = res[key]
                if sorted(G0) != sorted(G1):
                    raise RefError(f"qwen3_5_moe {key}: gradient names differ from the text-only per-expert ones")
                e_loss = abs(l0 - l1) / abs(l0)
                e_g = max(rel_l2(G1[n], G0[n]) for n in G0)
                e_max = max(_max_rel(G1[n], G0[n]) for n in G0 if float(G0[n].abs().max()) > 0)
                worst = max(worst, e_loss, e_g, e_max)
                lines.append(f"qwen3_5_moe text per-expert vs {key[0]} {'fused' if key[1] else 'per-expert'} "
                             f"checkpoint (gemm {'bf16' if gemm else 'f64'}, storage {'bf16' if storage else 'f64'}): "
                             f"loss {l0:.15g} vs {l1:.15g} (rel {e_loss:.2e}), grads worst rel-L2 {e_g:.2e}, max rel "
                             f"{e_max:.2e} over {len(G0)} tensors")
    return worst


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
    m.add_argument("--arch", required=True, choices=sorted(ARCHS) + sorted(QWEN35_FORMS) + ["gpt_oss"])
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
    m.add_argument("--pad", type=int, default=0,
                   help=">0: right padding, batch.json gets attention_mask (the last row's last N positions 0, the "
                        "others' last N/2), their labels -100")
    m.add_argument("--dtype", choices=sorted(ST_DTYPE), default="float32", help="stored weight dtype")
    m.add_argument("--shards", type=int, default=1)
    m.add_argument("--config-style", choices=["classic", "v5"], default="classic",
                   help="v5: 'dtype' and 'rope_parameters' keys (newer transformers); qwen3_5 always v5")
    mo = m.add_argument_group("qwen3_moe (routed experts; layers sparse as decoder_sparse_step / mlp_only_layers say) "
                              "and qwen3_5_moe_text / qwen3_5_moe_vl (every layer sparse, top-k renormalised, plus "
                              "a shared expert)")
    mo.add_argument("--experts", type=int, default=8, help="num_experts (default 8)")
    mo.add_argument("--experts-per-tok", type=int, default=2, help="num_experts_per_tok (default 2)")
    mo.add_argument("--moe-intermediate", type=int, default=32, help="moe_intermediate_size (default 32)")
    mo.add_argument("--norm-topk-prob", action="store_true", help="norm_topk_prob true (default false)")
    mo.add_argument("--decoder-sparse-step", type=int, default=1, help="decoder_sparse_step (default 1)")
    mo.add_argument("--mlp-only-layers", default="", help="comma list of dense layers (default none)")
    mo.add_argument("--fused-experts", action="store_true",
                    help="write transformers 5.x's fused mlp.experts.gate_up_proj / down_proj instead of one tensor "
                         "per expert (the same parameter values)")
    mo.add_argument("--shared-intermediate", type=int, default=32,
                    help="qwen3_5_moe forms: shared_expert_intermediate_size (default 32)")
    go = m.add_argument_group("gpt_oss (with --experts, --experts-per-tok, --moe-intermediate as intermediate_size)")
    go.add_argument("--sliding-window", type=int, default=5, help="sliding_window (default 5: inside a short row)")
    go.add_argument("--swiglu-limit", type=float, default=1.0,
                    help="swiglu_limit (default 1.0, so random gates and ups pass the clamp; released 7)")
    go.add_argument("--mxfp4", action="store_true",
                    help="the experts as MXFP4 *_blocks / *_scales with quantization_config (hidden and "
                         "--moe-intermediate multiples of 32), as released checkpoints store them")
    go.add_argument("--yarn-original", type=int, default=16,
                    help="rope_scaling.original_max_position_embeddings (default 16: YaRN's ramp over a tiny head)")
    q5 = m.add_argument_group("qwen3_5 / qwen3_5_vl / qwen3_5_moe_text / qwen3_5_moe_vl (hybrid Gated DeltaNet + "
                              "gated attention)")
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
    g.add_argument("--moe-aux-loss-coef", type=float, default=0.0,
                   help="MoE models: loss = CE + this x load_balancing_loss_func (transformers with "
                        "output_router_logits; default 0: CE alone, the aux value still printed)")
    g.add_argument("--delta", choices=["recurrent", "chunked"], default="recurrent",
                   help="qwen3_5: gated delta rule step by step (default, the reference) or chunked (WY, 64)")
    g.add_argument("--adapter", default=None, help="a PEFT LoRA adapter directory on the model (lora.py): the loss "
                   "with it and the adapter's gradients under its names")
    g.add_argument("--emulate-bf16", action="store_true",
                   help="LazyTrain's --dtype bf16 GEMM rounding: every linear layer and lm_head rounds its GEMM "
                        "operands to bf16 (forward x, W; backward dy, W and dy, x); the rest in --dtype")
    g.add_argument("--emulate-bf16-storage", action="store_true",
                   help="LazyTrain's --activation-dtype bf16: each activation its backward reads, and each layer "
                        "boundary, rounded to bf16 where it is computed (see keep_bf16)")

    ma = sub.add_parser("make-adapter", help="a random PEFT LoRA adapter for a model directory (lora.py)")
    ma.add_argument("--model", required=True)
    ma.add_argument("--out", required=True)
    ma.add_argument("--r", type=int, default=3)
    ma.add_argument("--alpha", type=float, default=5.0)
    ma.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ma.add_argument("--rslora", action="store_true")
    ma.add_argument("--dropout", type=float, default=0.0)
    ma.add_argument("--modules-to-save", default="")
    ma.add_argument("--seed", type=int, default=0)

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

    sm = sub.add_parser("selfcheck-moe", help="qwen3_moe, qwen3_5_moe: routed vs dense experts, per-expert vs fused "
                                              "checkpoints, the bf16 down/combine Function vs autograd (float64), "
                                              "prints PASS")
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--tol", type=float, default=1e-12, help="max relative difference")

    sg = sub.add_parser("selfcheck-gpt-oss", help="gpt_oss: the sink softmax and the sliding mask against their closed "
                                                  "forms, then make + fdcheck on a tiny model, prints PASS")
    sg.add_argument("--seed", type=int, default=0)

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
        if a.cmd == "make-adapter":
            return cmd_make_adapter(a) or 0
        if a.cmd == "selfcheck-delta":
            return cmd_selfcheck_delta(a)
        if a.cmd == "selfcheck-moe":
            return cmd_selfcheck_moe(a)
        if a.cmd == "selfcheck-gpt-oss":
            return cmd_selfcheck_gpt_oss(a)
        if a.cmd == "fdcheck":
            return cmd_fdcheck(a)
        return cmd_compare(a)
    except (RefError, SafetensorsError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"torch_reference.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
