#!/usr/bin/python3
"""`lazytrain grad --device cuda-sim`: the CUDA kernels (emulated) under the streaming executor give the
in-memory path's gradients byte for byte with every activation policy — kept on the device, recomputed,
offloaded to host memory and to NVMe — as the CPU ops do. At bf16 (activations stored in bf16) the executor
launches the CUDA block and head, what --device cuda runs (exec/backend.h), and the in-memory path runs the CPU
block's sequence of ops on the same kernels and emulated GEMMs: the two give the same bits, so the CUDA block keeps
the CPU block's rounding points exactly. --arch qwen3_5: a Qwen3.5 hybrid (Gated DeltaNet and gated attention
layers), whose CUDA block strings together the hybrid kernels; the in-memory path's CPU block then calls the same
gated delta rule kernel (the one hybrid kernel that does not give its CPU op's bits). --arch qwen3_tc: head dim
64, so at bf16 attention runs on the tensor-core kernels (cuda/kernels/attention_mma.cuh, their shuffle
emulation here), over more than one 64-token tile; the result is also held within the bf16 bound (relative L2
5e-2, scripts/grad_diff.py) of the CPU's f32 path. --arch qwen3_5_tc: the same for head dim 256 in a Qwen3.5's
gated attention (cuda/kernels/attention_mma_wide.cuh's dK/dV pass) and for the gated delta rule's forward on tensor
cores (cuda/kernels/gated_delta_mma.cuh). --arch qwen3_moe / qwen3_5_moe: sparse layers (a dense one
between, or a shared expert) with the load-balancing loss on right-padded rows: the CUDA block's route slices
(cuda/layers/moe.inl) against the CPU block on the MoE kernels (cuda/kernels/moe.cuh, the CPU ops' bits). Usage:
--lazytrain BIN --dtype f32|bf16 [--arch qwen3|qwen3_5|qwen3_tc|qwen3_5_tc|qwen3_moe|qwen3_5_moe]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(os.path.dirname(HERE), "reference", "torch_reference.py")
# A Qwen3 block with q/k norms, GQA 4:2, packed documents, odd sizes.
MODEL = ["--arch", "qwen3", "--layers", "3", "--hidden", "40", "--heads", "4", "--kv-heads", "2", "--head-dim",
         "16", "--intermediate", "56", "--vocab", "101", "--no-tie", "--batch", "2", "--seq", "29", "--docs", "2"]
# A Qwen3.5 hybrid: linear, full, linear layers; T = 70 runs across the delta rule's chunk; packed documents;
# value heads twice the key heads; RoPE on half the head dims.
HYBRID = ["--arch", "qwen3_5", "--layers", "3", "--layer-types", "linear,full,linear", "--hidden", "40", "--heads",
          "4", "--kv-heads", "2", "--head-dim", "12", "--partial-rotary-factor", "0.5", "--intermediate", "56",
          "--vocab", "101", "--linear-key-heads", "2", "--linear-value-heads", "4", "--linear-key-dim", "12",
          "--linear-value-dim", "10", "--batch", "2", "--seq", "70", "--docs", "3"]
# Head dim 64: the tensor-core attention at bf16; T = 70 spans two 64-token tiles.
TENSOR_CORE = ["--arch", "qwen3", "--layers", "2", "--hidden", "40", "--heads", "4", "--kv-heads", "2",
               "--head-dim", "64", "--intermediate", "56", "--vocab", "101", "--no-tie", "--batch", "2", "--seq", "70",
               "--docs", "2"]
# Head dim 256 (Qwen3.5 / 3.6's full attention): the wide tensor-core kernels (attention_mma_wide.cuh) in the gated
# attention layer; T = 70 spans three of the 32-key tiles and two 64-row query tiles. Delta-rule head dims of 16: the
# gated delta rule's forward on tensor cores (gated_delta_mma.cuh) over two 64-token tiles.
TENSOR_CORE_D256 = ["--arch", "qwen3_5", "--layers", "2", "--layer-types", "linear,full", "--hidden", "40", "--heads",
                    "2", "--kv-heads", "1", "--head-dim", "256", "--partial-rotary-factor", "0.25", "--intermediate",
                    "56", "--vocab", "101", "--linear-key-heads", "2", "--linear-value-heads", "4",
                    "--linear-key-dim", "16", "--linear-value-dim", "16", "--batch", "2", "--seq", "70", "--docs", "2"]
# Qwen3-MoE: sparse, dense, sparse layers, top-2 of 6; rows padded (attention_mask) for the aux loss.
MOE = ["--arch", "qwen3_moe", "--layers", "3", "--mlp-only-layers", "1", "--hidden", "40", "--heads", "4",
       "--kv-heads", "2", "--head-dim", "12", "--intermediate", "56", "--vocab", "101", "--no-tie", "--experts", "6",
       "--experts-per-tok", "2", "--moe-intermediate", "20", "--batch", "2", "--seq", "37", "--pad", "7"]
# Qwen3.5-MoE text: linear / full / linear mixers, every MLP sparse with a shared expert, top-2 of 5, padded rows.
HYBRID_MOE = ["--arch", "qwen3_5_moe_text", "--layers", "3", "--layer-types", "linear,full,linear", "--hidden", "40",
              "--heads", "4", "--kv-heads", "2", "--head-dim", "12", "--partial-rotary-factor", "0.5", "--vocab", "101",
              "--linear-key-heads", "2", "--linear-value-heads", "4", "--linear-key-dim", "12", "--linear-value-dim",
              "10", "--experts", "5", "--experts-per-tok", "2", "--moe-intermediate", "18", "--shared-intermediate",
              "14", "--batch", "2", "--seq", "41", "--pad", "9"]
POLICIES = ["keep-all", "every:1", "every:2", "host:1", "nvme:2"]


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    ap.add_argument("--arch", default="qwen3", choices=["qwen3", "qwen3_5", "qwen3_tc", "qwen3_5_tc", "qwen3_moe",
                                                          "qwen3_5_moe"])
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="lt_cuda_sim_policies_")
    model = os.path.join(work, "model")
    shape = {"qwen3": MODEL, "qwen3_5": HYBRID, "qwen3_tc": TENSOR_CORE, "qwen3_5_tc": TENSOR_CORE_D256,
             "qwen3_moe": MOE, "qwen3_5_moe": HYBRID_MOE}[args.arch]
    aux = ["--moe-aux-loss-coef", "0.5"] if args.arch.endswith("moe") else []
    run([sys.executable, REFERENCE, "make", "--out", model, "--seed", "5"] + shape)
    batch = os.path.join(model, "batch.json")

    def grad(name, extra, device="cuda-sim", dtype=args.dtype):
        out = os.path.join(work, f"{name}.safetensors")
        text = run([args.lazytrain, "grad", "--model", model, "--batch", batch, "--out", out, "--dtype", dtype,
                    "--device", device] + aux + extra)
        loss = json.loads([l for l in text.strip().splitlines() if l.strip()][-1])["loss"]
        with open(out, "rb") as f:
            return loss, f.read()

    ref_loss, ref_bytes = grad("in_memory", [])
    nvme = os.path.join(work, "nvme")
    os.makedirs(nvme)
    for policy in POLICIES:
        loss, data = grad(policy.replace(":", "_"), ["--policy", policy, "--nvme-dir", nvme])
        if loss != ref_loss or data != ref_bytes:
            sys.exit(f"--policy {policy} on cuda-sim differs from the in-memory path: loss {loss!r} vs {ref_loss!r}, "
                     f"gradient files {'equal' if data == ref_bytes else 'differ'}")
        print(f"{policy}: loss {loss!r}, {len(data)} gradient bytes identical to the in-memory path")
    print(f"cuda-sim [{args.arch}, {args.dtype}]: every policy bitwise equal to the in-memory path")
    if args.arch.endswith("_tc"):
        grad("cpu_f32", [], device="cpu", dtype="f32")
        print(run([sys.executable, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "grad_diff.py"),
                   os.path.join(work, "in_memory.safetensors"), os.path.join(work, "cpu_f32.safetensors"),
                   "--max-relative", "5e-2"]).strip(), "(from the CPU's f32 path)")


if __name__ == "__main__":
    main()
