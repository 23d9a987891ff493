#!/usr/bin/python3
"""Host memory of full, freeze and LoRA runs of one model, measured against the planner's figure: `lazytrain train`
(two steps) of a 19M-parameter model on a bf16 base, each method's resident memory after its last step (metrics.jsonl's
host_rss_bytes, before the final checkpoint's buffers) against what the run said it needs before loading ("host needs ~X", the parameters' bytes of
train/settings.cpp and optim/adamw.h, the plan's host activations and the executor's host staging) plus the emulated
device's working set (the CPU device's memory is the process's). The runs differ only in their parameters'
state, so the differences of the measured figures must be the differences of the predicted ones: a method whose
frozen tensors kept an f32 master, a gradient or optimizer state would save tens of MiB less than predicted.
Measured here: full - freeze (last layer) predicted 144 MiB, measured 199; full - LoRA r8 216 and 236.

Usage: check_finetune_memory.py --lazytrain BIN"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

from arith_work import CONFIG, arith_work

UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    a = ap.parse_args()
    lt = a.lazytrain
    with arith_work("lt_finetune_memory_", 64, 4) as (work, paths):
        src = os.path.join(work, "model")
        cfg = json.load(open(os.path.join(src, "config.json")))
        cfg.update(hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64)
        big = os.path.join(work, "big")
        os.makedirs(big)
        json.dump(cfg, open(os.path.join(big, "config.json"), "w"))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(src, name), os.path.join(big, name))
        base = os.path.join(work, "base")
        subprocess.run([lt, "init", "--config", big, "--out", base, "--seed", "1", "--dtype", "bf16"], check=True,
                       capture_output=True)
        common = [f"model_name_or_path={base}", paths[1], "eval_dataset=", "max_steps=2", "save_steps=0",
                  "logging_steps=1", "per_device_train_batch_size=4", "cutoff_len=96", "device_memory=1GiB",
                  "plan=every:2", "compute_dtype=bf16", "host_act_memory=64MiB", "threads=1"]
        methods = {"full": [], "freeze": ["finetuning_type=freeze", "freeze_trainable_layers=1"],
                   "lora": ["finetuning_type=lora", "lora_rank=8"]}
        got = {}
        for name, extra in methods.items():
            out = os.path.join(work, name)
            p = subprocess.run([lt, "train", CONFIG, f"output_dir={out}"] + common + extra, capture_output=True,
                               text=True)
            if p.returncode != 0:
                sys.exit(f"{name}: train failed\n{p.stderr[-2000:]}")
            m = re.search(r"host needs ~([0-9.]+) (B|KiB|MiB|GiB)", p.stdout + p.stderr)
            if not m:
                sys.exit(f"{name}: no 'host needs' line in the log")
            predicted = float(m.group(1)) * UNITS[m.group(2)]
            lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"host_rss_bytes"' in l]
            rss = lines[-1]["host_rss_bytes"]
            # The CPU device's memory is this process's: the plan's device working set counts too.
            predicted += lines[-1]["peak_device_bytes"]
            got[name] = (predicted, rss)
            print(f"{name:7s} predicted {predicted / 2 ** 20:8.1f} MiB   resident {rss / 2 ** 20:8.1f} MiB")
        failed = False
        for name in ("freeze", "lora"):
            dp = got["full"][0] - got[name][0]
            dr = got["full"][1] - got[name][1]
            # A frozen run may hold less than its figure (which counts the load's one f32 slab, gone by the first
            # step), never more: what it saves against full is at least the predicted saving, less 15% for the
            # allocator's leftovers (27 MiB of ~180) -- an f32 master or gradient of the frozen tensors alone would
            # take 75 MiB of it.
            ok = dr >= 0.85 * dp
            failed |= not ok
            print(f"full - {name}: predicted {dp / 2 ** 20:.1f} MiB, measured {dr / 2 ** 20:.1f} MiB "
                  f"({'ok' if ok else 'FAIL'})")
        if failed:
            sys.exit("FAIL: the measured host memory of a frozen run is not the planner's")
        print("pass")


if __name__ == "__main__":
    main()
