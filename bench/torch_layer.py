#!/usr/bin/python3
"""The PyTorch peer of bench_layer: one Qwen2-style decoder layer forward + backward, same shapes,
same FLOP count (attention counted causal), Debian's torch 1.13 (/usr/bin/python3).

torch 1.13 has no fused attention on the CPU: the layer materialises the T x T scores, as transformers
does with eager attention. f32 runs in f32; bf16 runs under torch.autocast("cpu", torch.bfloat16),
the usual mixed-precision recipe (bf16 matmuls, f32 master weights).
Prints one JSON line per dtype.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

B, T, C, HQ, HKV, D, I = 1, 1024, 1024, 16, 4, 64, 2816


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(C, HQ * D, bias=True)
        self.k = torch.nn.Linear(C, HKV * D, bias=True)
        self.v = torch.nn.Linear(C, HKV * D, bias=True)
        self.o = torch.nn.Linear(HQ * D, C, bias=False)
        self.gate = torch.nn.Linear(C, I, bias=False)
        self.up = torch.nn.Linear(C, I, bias=False)
        self.down = torch.nn.Linear(I, C, bias=False)
        self.ln1 = torch.nn.Parameter(torch.ones(C))
        self.ln2 = torch.nn.Parameter(torch.ones(C))
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
        freqs = torch.outer(torch.arange(T).float(), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        mask = torch.full((T, T), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    @staticmethod
    def rms(x, w):
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6))

    def rope(self, x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * self.cos + torch.cat([-x2, x1], dim=-1) * self.sin

    def forward(self, x):
        h = self.rms(x, self.ln1)
        q = self.q(h).view(B, T, HQ, D).transpose(1, 2)
        k = self.k(h).view(B, T, HKV, D).transpose(1, 2)
        v = self.v(h).view(B, T, HKV, D).transpose(1, 2)
        q, k = self.rope(q), self.rope(k)
        k = k.repeat_interleave(HQ // HKV, dim=1)
        v = v.repeat_interleave(HQ // HKV, dim=1)
        s = (q @ k.transpose(-1, -2)) / (D ** 0.5) + self.mask
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        a = (p @ v).transpose(1, 2).reshape(B, T, HQ * D)
        x = x + self.o(a)
        h = self.rms(x, self.ln2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def flops():
    n = B * T
    per_token = C * (2 * HQ * D + 2 * HKV * D) + 3 * C * I
    linear = 2 * n * per_token
    attention = 2 * 2 * (B * T * (T + 1) / 2) * HQ * D
    return 3 * linear + 3.5 * attention


def bench(dtype, reps):
    torch.manual_seed(0)
    layer = Layer()
    x = torch.randn(B, T, C, requires_grad=True)
    dy = torch.randn(B, T, C) * 1e-3

    def step():
        if dtype == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x)
        else:
            y = layer(x)
        y.float().backward(dy)

    step()
    best = 1e30
    for _ in range(reps):
        t = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t)
    return {"bench": "layer", "impl": "torch", "torch": torch.__version__, "dtype": dtype,
            "threads": torch.get_num_threads(), "step_s": best, "layer_gflops": flops() / best / 1e9}


if __name__ == "__main__":
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    # torch's own default can be 1 here: set the same thread count as LazyTrain's run.
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count())
    for dt in ("f32", "bf16"):
        try:
            print(json.dumps(bench(dt, reps)), flush=True)
        except RuntimeError as e:
            # Under DNNL_MAX_CPU_ISA=AVX2 on an AVX-512 host torch still routes bf16 matmuls to oneDNN
            # (its own CPU check sees AVX-512), which then has no kernel: report the peer as unavailable.
            print(json.dumps({"bench": "layer", "impl": "torch", "torch": torch.__version__, "dtype": dt,
                              "threads": torch.get_num_threads(), "layer_gflops": None,
                              "error": str(e).splitlines()[0]}), flush=True)
