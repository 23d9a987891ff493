#!/usr/bin/python3
"""`make soak`: training killed again and again must end byte for byte where an uninterrupted run ends.

  kill   SIGKILL at random moments, at least --kills times (default 20), half of them timed to land inside a
         checkpoint write (while the `.checkpoint-N.partial` directory exists), each followed by a resume; the
         final checkpoint is compared file by file with the uninterrupted run's.
  term   SIGTERM at random moments (--terms, default 5): each run must stop cleanly — exit status 143, a summary
         naming SIGTERM and the checkpoint it saved at the step it stopped on, and that checkpoint whole — then
         resume; the final checkpoint must again equal the uninterrupted run's.

Prints one JSON line of the figures. Usage: soak.py --lazytrain BIN [--steps N] [--kills K] [--terms T] [--seed S]"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = ("model.safetensors", "config.json", "resume/optimizer.safetensors", "resume/params.safetensors",
         "resume/state.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--terms", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="lt_soak_")
    figures = {"steps": a.steps}
    try:
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/arith/make_data.py"), work, "--train", "2000",
                        "--test", "10"], check=True, capture_output=True)
        config = os.path.join(ROOT, "examples/arith/config.yaml")
        common = [f"model_name_or_path={work}/model/config.json", f"dataset_dir={work}/data", "eval_dataset=",
                  "per_device_train_batch_size=4", f"max_steps={a.steps}", "save_steps=5", "save_total_limit=2",
                  "logging_steps=50", "plan=every:2", "cutoff_len=160", "device_memory=256MiB"]

        def start(out, resume):
            cmd = [a.lazytrain, "train", config, f"output_dir={out}"] + common
            if resume:
                cmd.append("resume_from_checkpoint=true")
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE), cmd

        def finish(p, cmd):
            out, err = p.communicate()
            if p.returncode != 0:
                sys.exit(f"run failed ({p.returncode}): {' '.join(cmd)}\n{err.decode()[-2000:]}")
            return out.decode()

        def compare(ref, other, what):
            for name in FILES:
                x = open(os.path.join(ref, f"checkpoint-{a.steps}", name), "rb").read()
                y = open(os.path.join(other, f"checkpoint-{a.steps}", name), "rb").read()
                if x != y:
                    sys.exit(f"FAIL ({what}): checkpoint-{a.steps}/{name} differs from the uninterrupted run's")

        ref = os.path.join(work, "reference")
        t0 = time.time()
        finish(*start(ref, False))
        full = time.time() - t0
        figures["uninterrupted_s"] = round(full, 1)

        def wait_a_while(p, interruptions):  # short enough that all of them come before the run could finish
            try:
                p.wait(timeout=rng.uniform(0.3, max(1.0, 1.5 * full / interruptions)))
            except subprocess.TimeoutExpired:
                pass

        def finished_first(p, what):  # the run ended before its interruption
            if p.poll() is None:
                return False
            if p.returncode != 0:
                sys.exit(f"run failed ({p.returncode}) before its {what}")
            return True

        # --- SIGKILL ---
        out = os.path.join(work, "killed")
        kills = in_save = 0
        resumes = 0
        while True:
            p, cmd = start(out, resumes > 0)
            resumes += 1
            if kills >= a.kills:
                finish(p, cmd)
                break
            if kills % 2 == 1:  # inside a checkpoint write: wait for a partial directory to appear
                deadline = time.time() + full
                while p.poll() is None and time.time() < deadline:
                    if glob.glob(os.path.join(out, ".checkpoint-*.partial")):
                        time.sleep(rng.uniform(0, 0.01))
                        break
                    time.sleep(0.001)
                caught = bool(glob.glob(os.path.join(out, ".checkpoint-*.partial")))
            else:  # short enough that every kill comes before the run could finish
                caught = False
                wait_a_while(p, a.kills)
            if finished_first(p, "kill"):
                break
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
            in_save += caught
        compare(ref, out, f"after {kills} SIGKILLs")
        figures.update({"kills": kills, "kills_inside_a_save": in_save, "kill_divergences": 0})

        # --- SIGTERM ---
        out = os.path.join(work, "terminated")
        terms = 0
        resumes = 0
        while True:
            p, cmd = start(out, resumes > 0)
            resumes += 1
            if terms >= a.terms:
                finish(p, cmd)
                break
            wait_a_while(p, a.terms)
            if finished_first(p, "SIGTERM"):
                break
            p.send_signal(signal.SIGTERM)
            stdout, stderr = p.communicate()
            if p.returncode == -signal.SIGTERM:
                continue  # it arrived before the handlers were installed (start-up): the default action, fine
            if p.returncode != 143:
                sys.exit(f"FAIL: SIGTERM ended the run with status {p.returncode}, expected 143\n{stderr.decode()[-2000:]}")
            summary = json.loads(stdout.decode().strip().splitlines()[-1])
            ckpt = summary.get("stop_checkpoint", "")
            if summary.get("stopped_by") != "SIGTERM" or not ckpt or not os.path.isdir(ckpt):
                sys.exit(f"FAIL: after SIGTERM the summary is {summary}")
            if not ckpt.endswith(f"checkpoint-{summary['steps']}"):
                sys.exit(f"FAIL: stopped at step {summary['steps']} but saved {ckpt}")
            for name in FILES:
                if not os.path.isfile(os.path.join(ckpt, name)):
                    sys.exit(f"FAIL: {ckpt} lacks {name}")
            terms += 1
        compare(ref, out, f"after {terms} SIGTERMs")
        figures.update({"sigterms": terms, "sigterm_divergences": 0})
        print(json.dumps(figures))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
