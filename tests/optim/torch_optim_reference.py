#!/usr/bin/python3
"""The PyTorch side of the optimizer tests (tests/optim/test_*.cpp run it with Debian's /usr/bin/python3).

  maps --out FILE         bitsandbytes' dynamic maps, built exactly as bitsandbytes.functional.create_dynamic_map
                          (signed=True, then signed=False; max_exponent_bits=7, total_bits=8): 2 x 256 f32, then
                          torch.linspace(0.1, 1, k) for k = 2..300 concatenated, all raw little-endian f32.
  adamw --case DIR        DIR/case.json {"sizes": [...], "steps": S, "lr": [S values], "beta1", "beta2", "eps",
                          "weight_decay", "max_grad_norm": x or null}; DIR/input.bin: the initial parameters (the
                          tensors concatenated), then each step's gradients. Runs, per step,
                          torch.nn.utils.clip_grad_norm_ (when max_grad_norm is set) and torch.optim.AdamW
                          (foreach=False: the single-tensor path) and writes DIR/torch.bin: the final parameters,
                          exp_avg, exp_avg_sq (each concatenated over tensors), f32.

bitsandbytes is not installed here; its construction is repeated below (it uses torch only).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    # bitsandbytes.functional.create_dynamic_map (0.44+), verbatim in behaviour.
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(
            2 ** (i + non_sign_bits - max_exponent_bits) + 1
            if signed
            else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1
        )
        boundaries = torch.linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        boundaries = torch.linspace(0.1, 1, additional_items + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    gap = 256 - len(data)
    for _ in range(gap):
        data.append(0)
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def cmd_maps(args):
    parts = [create_dynamic_map(True).numpy(), create_dynamic_map(False).numpy()]
    parts += [torch.linspace(0.1, 1, k).numpy() for k in range(2, 301)]
    np.concatenate(parts).astype("<f4").tofile(args.out)


def cmd_adamw(args):
    with open(os.path.join(args.case, "case.json")) as f:
        case = json.load(f)
    sizes, steps = case["sizes"], case["steps"]
    total = sum(sizes)
    data = np.fromfile(os.path.join(args.case, "input.bin"), dtype="<f4")
    assert data.size == total * (1 + steps), (data.size, total, steps)

    def split(flat):
        out, at = [], 0
        for n in sizes:
            out.append(torch.from_numpy(flat[at:at + n].copy()))
            at += n
        return out

    params = [torch.nn.Parameter(t) for t in split(data[:total])]
    opt = torch.optim.AdamW(params, lr=case["lr"][0], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                            weight_decay=case["weight_decay"], foreach=False)
    for s in range(steps):
        grads = split(data[total * (1 + s):total * (2 + s)])
        for p, g in zip(params, grads):
            p.grad = g
        if case["max_grad_norm"] is not None:
            torch.nn.utils.clip_grad_norm_(params, case["max_grad_norm"])
        for group in opt.param_groups:
            group["lr"] = case["lr"][s]
        opt.step()
    out = [torch.cat([p.detach() for p in params]),
           torch.cat([opt.state[p]["exp_avg"] for p in params]),
           torch.cat([opt.state[p]["exp_avg_sq"] for p in params])]
    torch.cat(out).numpy().astype("<f4").tofile(os.path.join(args.case, "torch.bin"))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("maps")
    m.add_argument("--out", required=True)
    a = sub.add_parser("adamw")
    a.add_argument("--case", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    {"maps": cmd_maps, "adamw": cmd_adamw}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
