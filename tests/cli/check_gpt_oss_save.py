#!/usr/bin/python3
"""GPT-OSS's saved files are transformers' layout: `lazytrain init` writes a random GPT-OSS model (its experts fused,
input-major, gate and up interleaved, with biases) and the PyTorch reference, which reads only that layout, agrees with
`lazytrain grad` on the loss, the load-balancing loss and every gradient (f32: 1e-4 rel-L2, loss 1e-6).

Usage: check_gpt_oss_save.py --lazytrain BIN"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(os.path.dirname(HERE), "reference", "torch_reference.py")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lt_gpt_oss_save_") as d:
        made, saved = os.path.join(d, "made"), os.path.join(d, "saved")
        run([sys.executable, REFERENCE, "make", "--arch", "gpt_oss", "--out", made, "--seed", "11", "--layers", "2",
             "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--vocab", "61", "--experts", "5",
             "--experts-per-tok", "2", "--moe-intermediate", "12", "--batch", "2", "--seq", "19"])
        run([a.lazytrain, "init", "--config", os.path.join(made, "config.json"), "--out", saved, "--seed", "5"])
        names = json.loads(run([sys.executable, "-c", "import json,sys; sys.path.insert(0, sys.argv[1]); "
                                "from safetensors_py import read_safetensors; "
                                "print(json.dumps(sorted(read_safetensors(sys.argv[2])[0])))",
                                os.path.dirname(REFERENCE), os.path.join(saved, "model.safetensors")]))
        if not any(n.endswith("mlp.experts.gate_up_proj") for n in names) or any(".experts.0." in n for n in names):
            sys.exit(f"FAIL: the saved experts are not GptOssExperts' fused tensors: {names[:12]}")
        batch = os.path.join(made, "batch.json")
        ours = json.loads(run([a.lazytrain, "grad", "--model", saved, "--batch", batch, "--out",
                               os.path.join(d, "ours.safetensors")]).strip().splitlines()[-1])
        ref = json.loads(run([sys.executable, REFERENCE, "grad", "--model", saved, "--batch", batch, "--out",
                              os.path.join(d, "ref.safetensors")]).strip().splitlines()[-1])
        for key in ("loss", "aux_loss"):
            rel = abs(ours[key] - ref[key]) / abs(ref[key])
            print(f"{key}: lazytrain {ours[key]:.9g} torch {ref[key]:.9g} (rel {rel:.1e})")
            if rel > 1e-6:
                sys.exit(f"FAIL: {key} differs")
        print(run([sys.executable, REFERENCE, "compare", "--ours", os.path.join(d, "ours.safetensors"), "--ref",
                   os.path.join(d, "ref.safetensors"), "--rtol-l2", "1e-4"]).strip().splitlines()[-1])
        print("pass")


if __name__ == "__main__":
    main()
