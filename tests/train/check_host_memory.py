#!/usr/bin/python3
"""A host that cannot hold the run is refused before the first step, with the numbers: `host_memory` (the host
memory the run may use; default MemAvailable) below what the parameters alone need is refused before any weight
is loaded or anything is written; below parameters + the plan's host activations, after planning and before
step 1. Both exit non-zero with one message naming host_memory and the bytes; a budget that fits trains.

Usage: check_host_memory.py --lazytrain BIN"""
import argparse
import os
import subprocess
import sys

from arith_work import CONFIG, arith_work


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    a = ap.parse_args()
    with arith_work("lt_host_memory_", 40, 4) as (work, paths):
        config = CONFIG
        common = paths + ["max_steps=2",
                  "save_steps=1", "eval_steps=0", "logging_steps=1", "cutoff_len=96", "device_memory=512MiB",
                  "plan=host:1", "host_act_memory=64MiB", "compute_dtype=f32", "optimizer_state_bits=32"]

        def train(out, host_memory):
            cmd = [a.lazytrain, "train", config, f"output_dir={out}", f"host_memory={host_memory}"] + common
            return subprocess.run(cmd, capture_output=True, text=True)

        # Parameters alone: f32 weights + gradients + 32-bit states = 16 bytes each.
        out = os.path.join(work, "too_small")
        p = train(out, "1KiB")
        err = p.stderr.strip()
        if p.returncode == 0 or "host_memory" not in err or "parameters need" not in err:
            sys.exit(f"FAIL: host_memory=1KiB: exit {p.returncode}, stderr: {err[-1500:]}")
        if os.path.exists(out):
            sys.exit(f"FAIL: a refused run created its output_dir {out}")
        if len([l for l in err.splitlines() if l.strip()]) != 1:
            sys.exit(f"FAIL: more than one line on stderr: {err[-1500:]}")
        words = err.split()
        params = int(words[words.index("parameters") - 1])
        weights_only = params * 16
        # Enough for the parameters, not for the plan's host activations (host:1 keeps boundaries on the host).
        budget = weights_only + 4096
        p = train(os.path.join(work, "no_room_for_activations"), str(budget))
        err = p.stderr.strip()
        if p.returncode == 0 or "host activations" not in err or "host_memory" not in err:
            sys.exit(f"FAIL: host_memory={budget}: exit {p.returncode}, stderr: {err[-1500:]}")
        if os.path.exists(os.path.join(work, "no_room_for_activations", "checkpoint-1")):
            sys.exit("FAIL: a run refused for host memory wrote a checkpoint")
        p = train(os.path.join(work, "fits"), "1GiB")
        if p.returncode != 0:
            sys.exit(f"FAIL: host_memory=1GiB did not train: {p.stderr[-1500:]}")
        print(f"pass: {params} parameters refused at 1KiB (before loading) and at {budget} bytes (no room for host "
              f"activations); trains at 1GiB")


if __name__ == "__main__":
    main()
