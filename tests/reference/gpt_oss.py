"""GPT-OSS (transformers' models/gpt_oss) for torch_reference.py: the config, the parameter names and shapes of a
bf16 / f32 checkpoint (experts fused and input-major, gate and up interleaved), the forward, and `make --arch gpt_oss`.

Written from transformers' GptOssAttention (eager: the sinks as one more logit column of every softmax row, dropped
after; sliding layers mask keys at or before query − W), GptOssRotaryEmbedding (YaRN: _compute_yarn_parameters'
frequencies in f32, cos and sin of the halves times the attention factor), GptOssTopKRouter (top-k of the biased
logits, softmax over those k) and GptOssExperts (gate_up = x · W[e] + b[e], gate the even columns and up the odd
ones, gate ≤ limit, up in [−limit, limit], ((up + 1) · gate · σ(1.702 · gate)) · W_down[e] + b_down[e], times the
routing weight). Everything in the parameters' dtype (float64 for the reference gradients).

LazyTrain's GPT-OSS block is checked against it (check_model.py's gpt_oss_bf16_weights) at f32 and at bf16 through
torch_reference.py's emulations of LazyTrain's bf16 GEMMs (`lin`) and bf16 activation storage (`keep`), whose
rounding points the forward takes as arguments: n1, q and k after RoPE, v, the sink attention's output (whose
backward reads it kept: _SinkAttentionKeptOut), x_mid, n2, each expert's gate, up and clamped h, the layer output; the
experts' down projection and its bias as LazyTrain's combine backward rounds them (_ExpertDownBias). `selfcheck-gpt-oss`
(torch_reference.py) checks it against itself: the sink softmax against its closed form, the sliding mask against a
loop, the two Functions with the rounding off against autograd, and autograd against finite differences.
"""

import math

import torch
import torch.nn.functional as F

ALPHA = 1.702  # GptOssExperts' constant
SLIDING, FULL = "sliding_attention", "full_attention"


class GptOssCfg:
    """A gpt_oss config.json (GptOssConfig's defaults), as LazyTrain's model/config.cpp reads it."""

    def __init__(self, c):
        self.raw = c
        self.arch = "gpt_oss"
        self.vocab = int(c["vocab_size"])
        self.hidden = int(c.get("hidden_size", 2880))
        self.layers = int(c.get("num_hidden_layers", 36))
        self.heads = int(c.get("num_attention_heads", 64))
        self.kv_heads = int(c.get("num_key_value_heads", 8))
        self.head_dim = int(c.get("head_dim", 64))
        self.eps = float(c.get("rms_norm_eps", 1e-5))
        self.rope_theta = float(c.get("rope_theta", 150000.0))
        self.tie = bool(c.get("tie_word_embeddings", False))
        self.experts = int(c.get("num_local_experts", 128))
        self.top_k = int(c.get("num_experts_per_tok", 4))
        self.moe_inter = int(c.get("intermediate_size", 2880))
        self.window = int(c.get("sliding_window", 128))
        self.limit = float(c.get("swiglu_limit", 7.0))
        self.layer_types = c.get("layer_types") or [SLIDING if (i + 1) % 2 else FULL for i in range(self.layers)]
        self.sparse = [True] * self.layers
        self.mxfp4 = (c.get("quantization_config") or {}).get("quant_method") == "mxfp4"
        self.fused_experts = True
        self.norm_topk_prob = False
        rs = c.get("rope_scaling") or c.get("rope_parameters") or {}
        self.yarn = rs.get("rope_type", rs.get("type")) == "yarn"
        self.factor = float(rs.get("factor", 1.0))
        self.beta_fast = float(rs.get("beta_fast") or 32.0)
        self.beta_slow = float(rs.get("beta_slow") or 1.0)
        self.original_max = int(rs.get("original_max_position_embeddings") or c.get("max_position_embeddings", 131072))
        self.truncate = bool(rs.get("truncate", True))
        self.attention_factor = rs.get("attention_factor")

    def param_shapes(self):
        C, D, H, K, E, Ie, V = self.hidden, self.head_dim, self.heads, self.kv_heads, self.experts, self.moe_inter, self.vocab
        s = {"model.embed_tokens.weight": (V, C)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = (C,)
            for name, rows in (("q_proj", H * D), ("k_proj", K * D), ("v_proj", K * D)):
                s[p + f"self_attn.{name}.weight"] = (rows, C)
                s[p + f"self_attn.{name}.bias"] = (rows,)
            s[p + "self_attn.o_proj.weight"] = (C, H * D)
            s[p + "self_attn.o_proj.bias"] = (C,)
            s[p + "self_attn.sinks"] = (H,)
            s[p + "post_attention_layernorm.weight"] = (C,)
            s[p + "mlp.router.weight"] = (E, C)
            s[p + "mlp.router.bias"] = (E,)
            s[p + "mlp.experts.gate_up_proj"] = (E, C, 2 * Ie)  # input-major; gate = even columns
            s[p + "mlp.experts.gate_up_proj_bias"] = (E, 2 * Ie)
            s[p + "mlp.experts.down_proj"] = (E, Ie, C)
            s[p + "mlp.experts.down_proj_bias"] = (E, C)
        s["model.norm.weight"] = (C,)
        if not self.tie:
            s["lm_head.weight"] = (V, C)
        return s


def yarn_inv_freq(cfg):
    """(inv_freq [D/2] f32, attention factor): transformers' _compute_yarn_parameters (or plain RoPE)."""
    D, base = cfg.head_dim, cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float32) / D)
    extrapolation = 1.0 / pos_freqs
    if not cfg.yarn:
        return extrapolation, 1.0
    interpolation = 1.0 / (cfg.factor * pos_freqs)

    def correction_dim(rotations):
        return D * math.log(cfg.original_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(D // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    af = cfg.attention_factor
    if af is None:
        af = 0.1 * math.log(cfg.factor) + 1.0 if cfg.factor > 1 else 1.0
    return inv_freq, float(af)


def rope_cos_sin(cfg, position_ids, dtype):
    """cos, sin [B, T, D/2] in f32 as GptOssRotaryEmbedding (times the attention factor), then cast to dtype."""
    inv_freq, af = yarn_inv_freq(cfg)
    freqs = position_ids[:, :, None].to(torch.float32) * inv_freq[None, None, :]
    return (freqs.cos() * af).to(dtype), (freqs.sin() * af).to(dtype)


def rotate(x, cos, sin):
    """GPT-OSS's _apply_rotary_emb on x [B, H, T, D]: the two halves, cos/sin [B, 1, T, D/2]."""
    a, b = torch.chunk(x, 2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def sliding_mask(mask, window):
    """mask [B, 1, T, T] (causal, documents) narrowed to keys after query − window."""
    T = mask.shape[-1]
    i = torch.arange(T)
    return mask & (i[None, :] > i[:, None] - window)[None, None]


def sink_attention(q, k, v, mask, sinks, scaling):
    """transformers' eager GPT-OSS attention: q [B, H, T, D], k, v [B, H, T, D] (kv heads repeated), mask bool
    [B, 1, T, T], sinks [H]: softmax over [scores | sink] with the max subtracted, the sink's column dropped."""
    w = torch.matmul(q, k.transpose(2, 3)) * scaling
    w = w.masked_fill(~mask, float("-inf"))
    B, H, T, _ = q.shape
    combined = torch.cat([w, sinks.reshape(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    p = F.softmax(combined, dim=-1)[..., :-1]
    return torch.matmul(p, v)


class _SinkAttentionKeptOut(torch.autograd.Function):
    """sink_attention whose output is kept rounded (`rnd`) and whose backward reads that kept output, as LazyTrain's
    bf16 storage does: attention_backward's D = rowsum(dO ∘ O) with the stored O (the sinks already applied), dS =
    P ∘ (dP − D), and the sinks' gradient −Σ_rows p_sink · D (ops/attention.h)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, sinks, scaling, rnd):
        w = (torch.matmul(q, k.transpose(2, 3)) * scaling).masked_fill(~mask, float("-inf"))
        B, H, T, _ = q.shape
        combined = torch.cat([w, sinks.reshape(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        p = F.softmax(combined, dim=-1)
        o = rnd(torch.matmul(p[..., :-1], v))
        ctx.save_for_backward(q, k, v, p, o)
        ctx.scaling = scaling
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, p, o = ctx.saved_tensors
        pk, psink = p[..., :-1], p[..., -1]
        Di = (do * o).sum(-1, keepdim=True)
        dv = torch.matmul(pk.transpose(2, 3), do)
        ds = pk * (torch.matmul(do, v.transpose(2, 3)) - Di)
        dq = torch.matmul(ds, k) * ctx.scaling
        dk = torch.matmul(ds.transpose(2, 3), q) * ctx.scaling
        dsinks = -(psink * Di[..., 0]).sum(dim=(0, 2))
        return dq, dk, dv, None, dsinks, None, None


class _ExpertDownBias(torch.autograd.Function):
    """One expert's down projection with its bias, times the routing weight, as LazyTrain's bf16 GEMM mode computes
    them (model/moe_ffn.cpp; torch_reference.py's _ExpertDown plus the bias): h [n, Ie], wd [Ie, C] (input-major, as
    stored), b [C], w [n]:
      forward   y = w · (rnd(h) · rnd(wd) + b)
      backward  g = rnd(dz) · rnd(wd)ᵀ;  dw = g·h + dz·b;  dh = w · g;  dwd = rnd(h)ᵀ · rnd(w · dz);  db = Σ w · dz"""

    @staticmethod
    def forward(ctx, h, wd, b, w, rnd):
        hr, wr = rnd(h), rnd(wd)
        ctx.save_for_backward(h, hr, wr, b, w)
        ctx.rnd = rnd
        return (torch.matmul(hr, wr) + b) * w[:, None]

    @staticmethod
    def backward(ctx, dz):
        h, hr, wr, b, w = ctx.saved_tensors
        g = torch.matmul(ctx.rnd(dz), wr.t())
        dw = (g * h).sum(-1) + (dz * b).sum(-1)
        wdz = dz * w[:, None]
        return g * w[:, None], hr.t() @ ctx.rnd(wdz), wdz.sum(0), dw, None


def _same(t):
    return t


def clamped_swiglu(gate, up, limit):
    g, u = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (u + 1) * (g * torch.sigmoid(g * ALPHA))


def experts(cfg, P, p, x, routes=None, lin=F.linear, keep=_same, gemm_rnd=None):
    """GptOssMLP on x [N, C]: the router and the routed experts, output [N, C]. routes gets (prefix, probs, logits).
    lin, keep: the GEMMs' and the storage's emulation; gemm_rnd: the GEMMs' rounding for the down projection
    (_ExpertDownBias), or None for autograd's formula. Gate and up are the even and odd columns of gate_up_proj."""
    logits = lin(x, P[p + "mlp.router.weight"], P[p + "mlp.router.bias"])
    top, ids = torch.topk(logits, cfg.top_k, dim=-1)
    w = F.softmax(top, dim=1)
    if routes is not None:
        routes.append((p, F.softmax(logits, dim=-1).detach(), logits))
    gu, gub = P[p + "mlp.experts.gate_up_proj"], P[p + "mlp.experts.gate_up_proj_bias"]
    dn, dnb = P[p + "mlp.experts.down_proj"], P[p + "mlp.experts.down_proj_bias"]
    out = torch.zeros_like(x)
    for e in range(cfg.experts):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        gate = keep(lin(xe, gu[e][:, 0::2].t(), gub[e][0::2]))
        up = keep(lin(xe, gu[e][:, 1::2].t(), gub[e][1::2]))
        h = keep(clamped_swiglu(gate, up, cfg.limit))
        we = w[tok, slot]
        if gemm_rnd is not None:
            y = _ExpertDownBias.apply(h, dn[e], dnb[e], we, gemm_rnd)
        else:
            y = (h @ dn[e] + dnb[e]) * we[:, None]
        out = out.index_add(0, tok, y)
    return out


def forward(cfg, P, ids, position_ids, mask, rms_norm, repeat_kv, routes=None, lin=F.linear, keep=_same,
            gemm_rnd=None, store_rnd=None):
    """Logits [B, T, V]. mask: the causal (and document) mask [B, 1, T, T]; rms_norm and repeat_kv are
    torch_reference.py's (transformers' RMSNorm and GQA expansion). LazyTrain's bf16 emulations (module docstring):
    lin and gemm_rnd for its GEMMs, keep and store_rnd (the attention output's) for its activation storage."""
    dt = P["model.embed_tokens.weight"].dtype
    B, T = ids.shape
    H, K, D = cfg.heads, cfg.kv_heads, cfg.head_dim
    x = keep(F.embedding(ids, P["model.embed_tokens.weight"]))
    cos, sin = rope_cos_sin(cfg, position_ids, dt)
    cos, sin = cos[:, None], sin[:, None]
    sliding = sliding_mask(mask, cfg.window)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        h = keep(rms_norm(x, P[p + "input_layernorm.weight"], cfg.eps))

        def proj(name, heads):
            return lin(h, P[p + f"self_attn.{name}.weight"], P[p + f"self_attn.{name}.bias"]).view(
                B, T, heads, D).transpose(1, 2)

        q, k, v = proj("q_proj", H), proj("k_proj", K), keep(proj("v_proj", K))
        q, k = keep(rotate(q, cos, sin)), keep(rotate(k, cos, sin))
        m = sliding if cfg.layer_types[i] == SLIDING else mask
        args = (q, repeat_kv(k, H // K), repeat_kv(v, H // K), m, P[p + "self_attn.sinks"], D ** -0.5)
        o = _SinkAttentionKeptOut.apply(*args, store_rnd) if store_rnd is not None else sink_attention(*args)
        o = o.transpose(1, 2).reshape(B, T, H * D)
        x = keep(x + lin(o, P[p + "self_attn.o_proj.weight"], P[p + "self_attn.o_proj.bias"]))
        h = keep(rms_norm(x, P[p + "post_attention_layernorm.weight"], cfg.eps))
        x = keep(x + experts(cfg, P, p, h.reshape(B * T, -1), routes, lin, keep, gemm_rnd).view(B, T, -1))
    x = rms_norm(x, P["model.norm.weight"], cfg.eps)
    return lin(x, P["model.embed_tokens.weight"] if cfg.tie else P["lm_head.weight"])


def make_config(a):
    """config.json for `make --arch gpt_oss` (GptOssConfig's keys); layer types alternate from a sliding layer."""
    L = a.layers
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": a.vocab,
        "hidden_size": a.hidden, "intermediate_size": a.moe_intermediate, "num_hidden_layers": L,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads or a.heads,
        "head_dim": a.head_dim or a.hidden // a.heads, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": a.yarn_original, "truncate": False},
        "max_position_embeddings": 4096, "attention_bias": True, "num_local_experts": a.experts,
        "num_experts_per_tok": a.experts_per_tok, "router_aux_loss_coef": 0.9, "output_router_logits": False,
        "sliding_window": a.sliding_window, "swiglu_limit": a.swiglu_limit,
        "layer_types": [SLIDING if (i + 1) % 2 else FULL for i in range(L)],
        "tie_word_embeddings": bool(a.tie), "torch_dtype": a.dtype, "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True, "bos_token_id": None, "eos_token_id": a.vocab - 1}


def random_params(cfg, gen):
    """Seeded weights as torch_reference.random_params scales them (activations O(1)); the sinks N(0, 1) (a sink
    takes a real share of each row), the experts' inputs scaled so some gates and ups pass the clamp."""
    P = {}
    for n, shape in cfg.param_shapes().items():
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if n.endswith("norm.weight"):
            t = 1.0 + 0.1 * z
        elif n.endswith("sinks"):
            t = z
        elif n.endswith("bias"):
            t = 0.1 * z
        elif n in ("model.embed_tokens.weight", "lm_head.weight"):
            t = z / math.sqrt(cfg.hidden)
        elif n.endswith("gate_up_proj"):  # [E, C, 2·Ie]: fan-in C
            t = z * (2.0 / math.sqrt(shape[1]))
        elif n.endswith("down_proj"):  # [E, Ie, C]: fan-in Ie
            t = z * (0.5 / math.sqrt(shape[1]))
        else:
            t = z * ((0.5 if n.endswith("o_proj.weight") else 1.0) / math.sqrt(shape[1]))
        P[n] = t.contiguous()
    return P


# MXFP4 (OCP Microscaling FP4, transformers' mxfp4 integration): E2M1 codes, two a byte, the low nibble first, 32 a
# block, each block times 2^(scale − 127). *_blocks [E, rows, cols / 32, 16] and *_scales [E, rows, cols / 32] uint8,
# a row one output feature (gate_up_proj: the 2·Ie interleaved gate / up rows over C; down_proj: C rows over Ie).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_SCALE = {"gate_up_proj": 124, "down_proj": 122}  # blocks at s or s − 1: RMS near random_params' stds


def mxfp4_dequantize(blocks, scales):
    """[E, rows, cols] float64 from blocks [E, rows, cols/32, 16] and scales [E, rows, cols/32] (uint8)."""
    b = blocks.to(torch.int64)
    codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(*blocks.shape[:-1], 32)
    v = torch.tensor(FP4_VALUES, dtype=torch.float64)[codes] * torch.pow(2.0, scales.to(torch.float64) - 127)[..., None]
    return v.reshape(*blocks.shape[:-2], -1)


def mxfp4_experts(cfg, P, gen):
    """Replaces P's expert matrices by seeded MXFP4 values; returns their {name_blocks, name_scales} tensors."""
    E, C, Ie = cfg.experts, cfg.hidden, cfg.moe_inter
    if C % 32 or Ie % 32:
        raise ValueError(f"MXFP4 needs the inputs in blocks of 32: hidden {C}, moe intermediate {Ie}")
    out = {}
    for i in range(cfg.layers):
        for name, rows, cols in (("gate_up_proj", 2 * Ie, C), ("down_proj", C, Ie)):
            n = f"model.layers.{i}.mlp.experts.{name}"
            codes = torch.randint(0, 16, (E, rows, cols // 32, 32), generator=gen, dtype=torch.int64)
            scales = MXFP4_SCALE[name] - torch.randint(0, 2, (E, rows, cols // 32), generator=gen, dtype=torch.int64)
            blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
            out[n + "_blocks"], out[n + "_scales"] = blocks, scales.to(torch.uint8)
            P[n] = mxfp4_dequantize(blocks, out[n + "_scales"]).transpose(1, 2).to(torch.float32).contiguous()
    return out


def dequantize_checkpoint(cfg, tensors, dtypes):
    """A loaded MXFP4 checkpoint's *_blocks / *_scales replaced by the fused input-major expert tensors (F32: every
    MXFP4 value is exact in it)."""
    for name in [n for n in tensors if n.endswith("_blocks")]:
        base = name[: -len("_blocks")]
        blocks, scales = tensors.pop(name), tensors.pop(base + "_scales")
        dtypes.pop(name), dtypes.pop(base + "_scales")
        tensors[base] = mxfp4_dequantize(blocks, scales).transpose(1, 2).to(torch.float32).contiguous()
        dtypes[base] = "F32"


def per_expert(cfg, T):
    """The fused expert tensors (weights or gradients) under LazyTrain's per-expert slab names (model/layout.cpp):
    mlp.experts.{e}.gate_proj / up_proj .weight [Ie, C] and .bias [Ie] (the even and odd columns), down_proj .weight
    [C, Ie] and .bias [C]; the rest unchanged."""
    out = {}
    for n, t in T.items():
        if ".mlp.experts." not in n:
            out[n] = t
            continue
        p, kind = n.split("mlp.experts.")
        for e in range(cfg.experts):
            q = f"{p}mlp.experts.{e}."
            if kind == "gate_up_proj":
                out[q + "gate_proj.weight"] = t[e][:, 0::2].t().contiguous()
                out[q + "up_proj.weight"] = t[e][:, 1::2].t().contiguous()
            elif kind == "gate_up_proj_bias":
                out[q + "gate_proj.bias"] = t[e][0::2].contiguous()
                out[q + "up_proj.bias"] = t[e][1::2].contiguous()
            elif kind == "down_proj":
                out[q + "down_proj.weight"] = t[e].t().contiguous()
            elif kind == "down_proj_bias":
                out[q + "down_proj.bias"] = t[e].contiguous()
            else:
                raise ValueError(f"unknown expert tensor {n}")
    return out


def selfcheck(seed=0, tol=1e-12):
    """The pieces against their closed forms, float64: the sink softmax (p_ij = exp(s_ij) / (Σ_j exp(s_ij) +
    exp(sink)), out = Σ p·v) and the sliding mask (key j visible to query i iff i − W < j <= i). Returns the lines to
    print and whether both pass."""
    gen = torch.Generator().manual_seed(seed)
    B, H, T, D, W = 2, 3, 11, 4, 4
    q, k, v = (torch.randn(B, H, T, D, generator=gen, dtype=torch.float64) for _ in range(3))
    sinks = torch.randn(H, generator=gen, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)
    mask = sliding_mask(causal, W)
    loops = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(T):
            loops[i, j] = i - W < j <= i
    mask_ok = bool((mask[0, 0] == loops).all())
    got = sink_attention(q, k, v, mask, sinks, D ** -0.5)
    s = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
    e = torch.exp(s) * mask
    denom = e.sum(-1, keepdim=True) + torch.exp(sinks)[None, :, None, None]
    want = torch.matmul(e / denom, v)
    err = float((got - want).abs().max() / want.abs().max())
    lines = [f"sliding mask (W={W}) against the loop: {'ok' if mask_ok else 'FAIL'}",
             f"sink attention against its closed form: max rel {err:.2e} (tol {tol:.0e})"]
    ok = mask_ok and err <= tol
    # The emulations' Functions with the rounding off give autograd's gradients of the plain formulas.
    def grads(f, *xs):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        out = f(*xs)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=out.dtype))
        return [x.grad for x in xs]

    def worst(a, b):
        return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b))

    e1 = worst(grads(lambda q_, k_, v_, s_: _SinkAttentionKeptOut.apply(q_, k_, v_, mask, s_, D ** -0.5, _same),
                     q, k, v, sinks),
               grads(lambda q_, k_, v_, s_: sink_attention(q_, k_, v_, mask, s_, D ** -0.5), q, k, v, sinks))
    n, Ie, C = 7, 5, 6
    h, wd, bd = (torch.randn(*sh, generator=gen, dtype=torch.float64) for sh in ((n, Ie), (Ie, C), (C,)))
    we = torch.rand(n, generator=gen, dtype=torch.float64)
    e2 = worst(grads(lambda *a: _ExpertDownBias.apply(*a, _same), h, wd, bd, we),
               grads(lambda h_, wd_, bd_, we_: (h_ @ wd_ + bd_) * we_[:, None], h, wd, bd, we))
    lines.append(f"kept-output sink attention and the biased expert down, rounding off, against autograd: max rel "
                 f"{max(e1, e2):.2e} (tol {tol:.0e})")
    return lines, ok and max(e1, e2) <= tol
