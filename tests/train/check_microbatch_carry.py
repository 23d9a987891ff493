#!/usr/bin/python3
"""Gradient accumulation: micro-batches after the first start on the layers the previous backward left in
the device's weight buffers (as many as there are buffers). Only unchanged weights may be reused — after
every pipelined update and every update flushed before a save or an evaluation the trainer names the
weights anew. A stale layer would change the result, and which layers are carried depends on the number
of buffers: so runs with 1, 2 and 4 weight buffers (and two plans), with and without the head's weights
resident (carried too), must end with byte-identical model files.

Usage: check_microbatch_carry.py --lazytrain BIN"""
import argparse
import os
import subprocess
import sys

from arith_work import CONFIG, arith_work


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    a = ap.parse_args()
    with arith_work("lt_microbatch_", 200, 6) as (work, paths):
        config = CONFIG
        # Saves at 3 and 6 and evaluations at 4 flush the pending update outside a step.
        common = paths + ["per_device_train_batch_size=3", "gradient_accumulation_steps=3", "max_steps=8", "save_steps=3",
                  "eval_steps=4", "save_total_limit=1", "logging_steps=4", "cutoff_len=160", "device_memory=512MiB"]
        runs = [("keep-all", 1, False), ("keep-all", 2, False), ("keep-all", 4, False), ("every:2", 2, False),
                ("every:2", 4, False), ("keep-all", 4, True), ("every:2", 2, True)]
        outs = []
        for plan, buffers, head in runs:
            out = os.path.join(work, f"{plan.replace(':', '')}-{buffers}-{'head' if head else 'nohead'}")
            cmd = [a.lazytrain, "train", config, f"output_dir={out}", f"plan={plan}", f"weight_buffers={buffers}",
                   f"resident_head={'true' if head else 'false'}"] + common
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"run failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
            outs.append(out)
        for name in ("model.safetensors", "resume/optimizer.safetensors", "resume/params.safetensors"):
            ref = open(os.path.join(outs[0], "checkpoint-8", name), "rb").read()
            for (plan, buffers, head), out in zip(runs[1:], outs[1:]):
                if open(os.path.join(out, "checkpoint-8", name), "rb").read() != ref:
                    sys.exit(f"FAIL: checkpoint-8/{name} of plan {plan} with {buffers} weight buffers (resident head: "
                             f"{head}) differs from {runs[0][0]} with {runs[0][1]}")
        print(f"pass: {len(runs)} runs (plans x weight buffers x resident head) byte-identical with gradient accumulation")


if __name__ == "__main__":
    main()
