#!/usr/bin/python3
"""The PyTorch peer of `lazytrain bench optimizer`: torch.nn.utils.clip_grad_norm_ followed by
torch.optim.AdamW(foreach=True) on N f32 parameters, split into 1024 x 1024 tensors (the last one shorter) as
LazyTrain's benchmark splits them, with random f32 gradients (clipping active: max_norm 1.0). Debian's torch 1.13
(/usr/bin/python3); torch.set_num_threads(T) explicitly, since torch defaults to one thread here.

One warm-up step (it also creates the optimizer state), then the best of `reps` timed steps. clip_grad_norm_
scales the gradients in place, by max_norm / norm at the first step and by ~1 afterwards; torch 1.13 computes the
norm and multiplies every gradient by the clamped coefficient whatever its value, so each step does the same work.
Usage: torch_optimizer.py N THREADS [REPS]. Prints one JSON line.
"""
import json
import sys
import time

import torch


def main():
    n = int(sys.argv[1])
    threads = int(sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    sizes = [1024 * 1024] * (n // (1024 * 1024))
    if n % (1024 * 1024):
        sizes.append(n % (1024 * 1024))
    params = [torch.nn.Parameter(torch.empty(s).uniform_(-1, 1)) for s in sizes]
    for p in params:
        p.grad = torch.empty_like(p).uniform_(-1, 1)
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=True)
    best = float("inf")
    for r in range(reps + 1):
        t0 = time.perf_counter()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if r > 0:
            best = min(best, dt)
    print(json.dumps({"impl": "torch_adamw_foreach", "params": n, "threads": torch.get_num_threads(),
                      "mparams_per_s": n / best / 1e6, "seconds": best, "state_bytes_per_param": 8.0,
                      "clip_norm": float(norm), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
