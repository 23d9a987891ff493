#!/usr/bin/python3
"""PyTorch's peer for bench/bench_delta.cpp: the chunked gated delta rule as transformers runs it without the
flash-linear-attention kernels (torch_chunk_gated_delta_rule in modeling_qwen3_5, written here from its
algorithm: chunks of 64, the in-chunk triangular solve by rows, the state carried across chunks), forward and
autograd backward, f32, the same shape and inputs' ranges. One JSON line.

Usage: torch_delta.py T Hk reps threads"""
import json
import sys
import time

import torch
import torch.nn.functional as F


def chunk_gated_delta_rule(q, k, v, g, beta, chunk=64):
    """q, k [B, H, T, dk] (value heads' key heads already repeated), v [B, H, T, dv], g, beta [B, H, T]."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - T % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    q = q * dk ** -0.5
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    q, k, v, k_beta, v_beta = (x.reshape(B, H, n, chunk, x.shape[-1]) for x in (q, k, v, k_beta, v_beta))
    g = g.reshape(B, H, n, chunk).cumsum(-1)
    decay = (g[..., :, None] - g[..., None, :]).tril().exp().tril()
    upper = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool), diagonal=0)
    attn = -((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(upper, 0)
    for i in range(1, chunk):  # (I + M)^-1 by rows
        row, sub = attn[..., i, :i].clone(), attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row[..., None] * sub).sum(-2)
    attn = attn + torch.eye(chunk)
    u = attn @ v_beta
    w = attn @ (k_beta * g.exp()[..., None])
    state = torch.zeros(B, H, dk, dv)
    strict = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool), diagonal=1)
    outs = []
    for i in range(n):
        qi, ki, gi = q[:, :, i], k[:, :, i], g[:, :, i]
        a = (qi @ ki.transpose(-1, -2) * decay[:, :, i]).masked_fill(strict, 0)
        v_new = u[:, :, i] - w[:, :, i] @ state
        outs.append((qi * gi.exp()[..., None]) @ state + a @ v_new)
        state = state * gi[..., -1, None, None].exp() + (ki * (gi[..., -1, None] - gi).exp()[..., None]).transpose(-1, -2) @ v_new
    return torch.stack(outs, 2).reshape(B, H, n * chunk, dv)[:, :, :T]


def main():
    T, Hk, reps, threads = (int(x) for x in sys.argv[1:5])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    Hv, d = 3 * Hk, 128
    q = F.normalize(torch.rand(1, Hk, T, d) * 2 - 1, dim=-1).repeat_interleave(Hv // Hk, 1)
    k = F.normalize(torch.rand(1, Hk, T, d) * 2 - 1, dim=-1).repeat_interleave(Hv // Hk, 1)
    v = torch.rand(1, Hv, T, d) * 2 - 1
    beta = torch.rand(1, Hv, T) * 0.9 + 0.05
    g = -(torch.rand(1, Hv, T) * 0.499 + 0.001)
    dout = torch.rand(1, Hv, T, d) * 2 - 1
    leaves = [x.requires_grad_() for x in (q, k, v, beta, g)]
    fwd = bwd = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        o = chunk_gated_delta_rule(*leaves[:3], leaves[4], leaves[3])
        t1 = time.perf_counter()
        o.backward(dout)
        t2 = time.perf_counter()
        fwd, bwd = min(fwd, (t1 - t0) * 1e3), min(bwd, (t2 - t1) * 1e3)
        for x in leaves:
            x.grad = None
    c = 64
    flops = 2.0 * (3 * c * d + 2 * c * d + 3 * d * d) * Hv * T
    print(json.dumps({"impl": "torch", "torch": torch.__version__, "fwd_ms": fwd, "bwd_ms": bwd,
                      "fwd_gflops": flops / (fwd * 1e6), "step_gflops": 3 * flops / ((fwd + bwd) * 1e6)}))


if __name__ == "__main__":
    main()
