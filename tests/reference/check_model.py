#!/usr/bin/python3
"""Whole-model check: LazyTrain's `lazytrain grad` against the PyTorch autograd reference.

For one named case: builds a random HF model directory with torch_reference.py, computes the reference
loss and gradients in float64 with autograd, runs `lazytrain grad` on the same directory and batch, and
compares loss (relative) and every gradient (relative L2). Exit status 0 = pass.

Bounds:
  f32: loss rel 1e-5 and gradients rel-L2 1e-4. LazyTrain computes in f32 (eps 6e-8); a few layers of
       O(1)-scaled activations accumulate ~1e-6 relative error, so 1e-5 / 1e-4 leave margin while any
       real bug (a wrong term, a missing bias grad) shows up at 1e-2 or worse.
  bf16: GEMM operands rounded to bf16 (relative rounding 2^-9 = 2e-3 per operand). Errors of the
       independent roundings average out over a dot product but compound over layers, and the
       gradient of small-norm tensors is noisier: loss rel 1e-2 and gradients rel-L2 5e-2.
  Activations stored in bf16 (--activation-dtype; `auto`, the default, is bf16 with bf16 GEMMs): each stored
       activation and layer boundary is rounded once (2^-9 relative), the same order as an operand rounding,
       so the bf16 bounds apply whenever either the GEMMs or the storage are bf16.

Usage: check_model.py --lazytrain build/lazytrain --case qwen3_untied [--workdir DIR] [--dtype f32|bf16]
                      [--activation-dtype auto|f32|bf16] [--device cpu|cuda-sim] [--policy P]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "torch_reference.py")

# Odd shapes on purpose: T=37, GQA 6:2, vocab 101 (not a multiple of 8), head_dim != hidden/heads.
CASES = {
    "qwen2": ["--arch", "qwen2", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
              "--intermediate", "67", "--vocab", "101", "--no-tie", "--batch", "2", "--seq", "37"],
    "qwen2_tied_sharded": ["--arch", "qwen2", "--layers", "3", "--hidden", "32", "--heads", "4", "--kv-heads", "4",
                           "--intermediate", "40", "--vocab", "97", "--tie", "--batch", "1", "--seq", "29",
                           "--shards", "3"],
    "qwen3_untied": ["--arch", "qwen3", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
                     "--head-dim", "16", "--intermediate", "67", "--vocab", "101", "--no-tie", "--batch", "2",
                     "--seq", "37"],
    "qwen3_tied": ["--arch", "qwen3", "--layers", "2", "--hidden", "40", "--heads", "4", "--kv-heads", "2",
                   "--head-dim", "16", "--intermediate", "56", "--vocab", "101", "--tie", "--batch", "2",
                   "--seq", "37"],
    "llama_bias": ["--arch", "llama", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
                   "--intermediate", "67", "--vocab", "101", "--no-tie", "--attention-bias", "--mlp-bias",
                   "--batch", "2", "--seq", "37"],
    "llama_bf16_weights": ["--arch", "llama", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "1",
                           "--intermediate", "48", "--vocab", "89", "--no-tie", "--batch", "2", "--seq", "23",
                           "--dtype", "bfloat16"],
    # Three documents packed per row (position_ids restart at 0), f16 weights, sharded, v5-style config.
    "qwen2_packed_f16": ["--arch", "qwen2", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
                         "--intermediate", "67", "--vocab", "101", "--no-tie", "--batch", "2", "--seq", "37",
                         "--docs", "3", "--dtype", "float16", "--shards", "2", "--config-style", "v5"],
}

BOUNDS = {"f32": (1e-5, 1e-4), "bf16": (1e-2, 5e-2)}


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
        sys.exit(1)
    return proc.stdout


def last_json_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--dtype", default="f32", choices=sorted(BOUNDS))
    ap.add_argument("--activation-dtype", default="auto", choices=["auto", "f32", "bf16"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda-sim"],
                    help="cuda-sim: every op on the CUDA kernels emulated on the CPU")
    ap.add_argument("--policy", help="run lazytrain on the streaming executor with this policy")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--workdir")
    args = ap.parse_args()

    work = args.workdir or tempfile.mkdtemp(prefix=f"lt_check_{args.case}_")
    model = os.path.join(work, "model")
    py = sys.executable
    run([py, REFERENCE, "make", "--out", model, "--seed", str(args.seed)] + CASES[args.case])
    ref = last_json_line(run([py, REFERENCE, "grad", "--model", model, "--batch", os.path.join(model, "batch.json"),
                              "--out", os.path.join(work, "ref.safetensors")]))
    ours = last_json_line(run([args.lazytrain, "grad", "--model", model, "--batch",
                               os.path.join(model, "batch.json"), "--out", os.path.join(work, "ours.safetensors"),
                               "--dtype", args.dtype, "--activation-dtype", args.activation_dtype,
                               "--device", args.device] + (["--policy", args.policy] if args.policy else [])))
    if ours["tokens"] != ref["tokens"]:
        sys.exit(f"counted tokens differ: lazytrain {ours['tokens']} vs torch {ref['tokens']}")
    storage = args.dtype if args.activation_dtype == "auto" else args.activation_dtype
    loss_rtol, grad_rtol = BOUNDS["bf16" if "bf16" in (args.dtype, storage) else "f32"]
    out = run([py, REFERENCE, "compare", "--ours", os.path.join(work, "ours.safetensors"),
               "--ref", os.path.join(work, "ref.safetensors"), "--rtol-l2", str(grad_rtol),
               "--loss-ours", repr(ours["loss"]), "--loss-ref", repr(ref["loss"]), "--loss-rtol", str(loss_rtol)])
    print(out)
    print(f"{args.case} [{args.dtype}, activations {storage}, {args.device}]: loss lazytrain {ours['loss']:.9g} torch {ref['loss']:.9g}: pass")


if __name__ == "__main__":
    main()
