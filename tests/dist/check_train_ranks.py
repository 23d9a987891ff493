#!/usr/bin/python3
"""Data parallel training under mpirun is bitwise the one-process run with the same global batch.

N ranks x A accumulation steps deal the micro-batches one process with N*A accumulation steps runs, and the
gradients are summed in that order (dist/data_parallel.h), so for 1 x 6, 2 x 3 and 3 x 2 the checkpoints (model,
f32 masters, optimizer states) are byte-identical and metrics.jsonl has the same loss and gradient norm at every
step — with tied and untied embeddings (the tied lm_head's part of the table is replayed rank by rank). Also: a run
saved on 2 ranks resumes on 3 and on 1 and ends byte-identical to the uninterrupted run; fine-tuning a model
directory, each rank loading only its own masters, is byte-identical on 2 ranks and on 1 — as are freeze and LoRA
fine-tuning of it (the trained tensors' masters whole on every rank) — for the dense demo model,
its Qwen3-MoE and a GPT-OSS of its sizes (whose fused experts each rank reads by its ranges); rank 0 alone writes and
prints; each rank keeps optimizer states for about 1/N of the parameters and (bf16 compute) f32 masters of 1/N of
the layers and head, rank 0 gathering them whole for each save and evaluation; a rank killed mid-run ends the whole
job with a non-zero exit, leaving only whole checkpoints; a rank that stops answering ends it after dist_timeout_s
with a message naming the wait; SIGTERM to mpirun stops every rank at one step with one checkpoint, which resumes.

Usage: check_train_ranks.py --lazytrain BIN (--mpirun MPIEXEC | --srun SRUN)"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train"))
from arith_work import CONFIG, arith_work, gpt_oss_model  # noqa: E402

FILES = ("model.safetensors", "resume/optimizer.safetensors", "resume/params.safetensors")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")


def fail(msg):
    sys.exit(f"FAIL: {msg}")


def signal_rank1_after_checkpoint(out, sig):
    """A launcher's wrapper: rank 1 gets `kill SIG` a second after out/checkpoint-2 is whole; the others run as is."""
    return ["sh", "-c", f'if [ "${{OMPI_COMM_WORLD_RANK:-$SLURM_PROCID}}" = 1 ]; then '
            f'(while [ ! -e {out}/checkpoint-2/model.safetensors ]; do sleep 0.1; done; sleep 1; '
            f'kill {sig} $$) & fi; exec "$@"', "sh"]


def metrics(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--mpirun", help="Open MPI's mpirun (every check)")
    ap.add_argument("--srun", help="Slurm's srun instead: the byte-identity checks only (scripts/srun-check.sh)")
    a = ap.parse_args()
    if bool(a.mpirun) == bool(a.srun):
        fail("give --mpirun or --srun")

    def train(ranks, out, extra, check=True, wrapper=None, timeout=600, env=None):
        cmd = [a.lazytrain, "train", CONFIG, f"output_dir={out}"] + extra
        if wrapper:
            cmd = wrapper + cmd
        if (ranks > 1 or wrapper) and a.srun:  # one task per rank, wired up by Slurm's PMIx plugin
            cmd = [a.srun, "-N", "1", "-n", str(ranks), "--overcommit", "--mpi=pmix"] + cmd
        elif ranks > 1 or wrapper:
            cmd = [a.mpirun, "--oversubscribe", "-np", str(ranks)] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(ENV, **(env or {})), timeout=timeout)
        if check and p.returncode != 0:
            fail(f"{ranks} ranks exited {p.returncode}: {' '.join(cmd)}\n{p.stderr[-3000:]}")
        return p

    def same(ref, out, step, what, files=FILES):
        for name in files:
            x = open(os.path.join(ref, f"checkpoint-{step}", name), "rb").read()
            y = open(os.path.join(out, f"checkpoint-{step}", name), "rb").read()
            if x != y:
                fail(f"{what}: checkpoint-{step}/{name} differs from the one-process run")

    def killed_rank(work, common):
        # A rank killed mid-run (SIGKILL once the first checkpoint is whole) ends the job; checkpoints stay whole.
        out = os.path.join(work, "killed")
        kill_rank1 = signal_rank1_after_checkpoint(out, "-9")
        t0 = time.time()
        p = train(2, out, common + ["gradient_accumulation_steps=3", "max_steps=100000", "eval_steps=0"],
                  check=False, wrapper=kill_rank1, timeout=300)
        took = time.time() - t0
        if p.returncode == 0:
            fail("a job whose rank 1 was killed exited 0")
        for d in sorted(os.listdir(out)):
            if ".tmp" in d:
                fail(f"a temporary was left behind: {d}")
            if d.startswith("checkpoint-"):
                for name in FILES:
                    if not os.path.isfile(os.path.join(out, d, name)):
                        fail(f"{d} is not whole: {name} is missing")
        print(f"pass: rank 1 killed: the job ended in {took:.1f} s with exit {p.returncode}, checkpoints whole")

    with arith_work("lt_dist_train_", 240, 6) as (work, paths):
        common = paths + ["per_device_train_batch_size=2", "max_steps=4", "save_steps=2", "eval_steps=3",
                          "save_total_limit=3", "logging_steps=1", "cutoff_len=96", "device_memory=512MiB",
                          "plan=every:2", "threads=1", "compute_dtype=bf16", "optimizer_state_bits=8"]
        model = json.load(open(os.path.join(work, "model/config.json")))
        deals = [(1, 6), (2, 3), (3, 2)]
        for tied in (True, False):
            model["tie_word_embeddings"] = tied
            json.dump(model, open(os.path.join(work, "model/config.json"), "w"))
            outs = {}
            for ranks, accum in deals:
                out = os.path.join(work, f"{'tied' if tied else 'untied'}-{ranks}x{accum}")
                p = train(ranks, out, common + [f"gradient_accumulation_steps={accum}"])
                outs[ranks] = out
                if ranks > 1:
                    same(outs[1], out, 4, f"{ranks} ranks x {accum} (tied: {tied})")
                    if metrics(out) != metrics(outs[1]):
                        fail(f"{ranks} ranks: metrics differ:\n{metrics(out)}\n{metrics(outs[1])}")
                    # Rank 0 alone prints: one summary line on stdout, no line twice on stderr (the progress).
                    summaries = [l for l in p.stdout.splitlines() if l.startswith("{")]
                    if len(summaries) != 1 or json.loads(summaries[0]).get("world_size") != ranks:
                        fail(f"{ranks} ranks printed {len(summaries)} summaries: {p.stdout[-2000:]}")
                    # The optimizer is sharded: rank 0 keeps states for about 1/N of the parameters, and (bf16
                    # compute) the f32 masters of its 1/N of the layers and head beside the whole embedding's.
                    first, mine_all = json.load(open(os.path.join(outs[1], "summary.json"))), json.loads(summaries[0])
                    one, mine = (s["host_optimizer_state_bytes_per_rank"] for s in (first, mine_all))
                    if not 0.8 < mine * ranks / one < 1.2:
                        fail(f"{ranks} ranks: rank 0 keeps {mine} bytes of optimizer state, one process {one}")
                    one_adam, adam = (s["host_adam_state_bytes_per_rank"] for s in (first, mine_all))
                    if not 0.8 < adam * ranks / one_adam < 1.2:
                        fail(f"{ranks} ranks: rank 0 keeps {adam} bytes of AdamW states, one process {one_adam}")
                    embed = model["vocab_size"] * model["hidden_size"] * 4
                    one_m, m = (s["host_master_bytes_per_rank"] - embed for s in (first, mine_all))
                    if not 0.8 < m * ranks / one_m < 1.2:
                        fail(f"{ranks} ranks: rank 0 keeps {m} bytes of layer and head masters, one process {one_m}")
                    if len(mine_all.get("host_rss_bytes_per_rank", [])) != ranks:
                        fail(f"{ranks} ranks: host_rss_bytes_per_rank is not one figure per rank: {mine_all}")
                    lines = [l for l in p.stderr.splitlines() if l.startswith("saved ")]
                    if len(lines) != len(set(lines)):
                        fail(f"{ranks} ranks: more than one rank logs:\n{p.stderr[-2000:]}")
            if tied:  # every collective point to point in pieces of 4 KiB (Comm's path beyond MPI's int counts)
                out = os.path.join(work, "tied-2x3-pieces")
                train(2, out, common + ["gradient_accumulation_steps=3"], env={"LT_MPI_MAX_MESSAGE": "4096"})
                same(outs[1], out, 4, "2 ranks x 3 with 4 KiB messages")
                if not a.srun:  # over TCP sockets (loopback) instead of shared memory: the path between hosts
                    out = os.path.join(work, "tied-2x3-tcp")
                    train(2, out, common + ["gradient_accumulation_steps=3"],
                          env={"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "lo"})
                    same(outs[1], out, 4, "2 ranks x 3 over TCP")
            print(f"pass: tied={tied}: 2 x 3 and 3 x 2 ranks byte-identical to 1 x 6 (checkpoints, metrics"
                  f"{'; also with 4 KiB messages' + ('' if a.srun else ', and over TCP') if tied else ''}); "
                  f"optimizer state (AdamW + f32 masters) on rank 0 {mine} bytes at 3 ranks, {one} in one process")

        if a.srun:
            killed_rank(work, common)
            print("pass: under srun (Slurm, PMIx)")
            return

        # Resume across world sizes: checkpoint-2 of the 2-rank run, continued on 3 ranks and on 1.
        ref = os.path.join(work, "untied-1x6")
        for ranks, accum in ((3, 2), (1, 6)):
            out = os.path.join(work, f"resumed-on-{ranks}")
            os.makedirs(out)
            shutil.copytree(os.path.join(work, "untied-2x3", "checkpoint-2"), os.path.join(out, "checkpoint-2"))
            p = train(ranks, out, common + [f"gradient_accumulation_steps={accum}",
                                            f"resume_from_checkpoint={out}/checkpoint-2"])
            if "resumed from" not in p.stderr:
                fail(f"resumed on {ranks}: the run did not say it resumed:\n{p.stderr[-1500:]}")
            same(ref, out, 4, f"saved on 2 ranks, resumed on {ranks}")
        print("pass: saved on 2 ranks, resumed on 3 and on 1: byte-identical to the uninterrupted run")

        # Fine-tuning a Hugging Face directory (the 1 x 6 run's last checkpoint): each rank loads only its own
        # chunks of the layers' and head's masters and the owners make the compute copy: the one-process bits.
        tuned = {}
        for ranks, accum in ((1, 4), (2, 2)):
            out = os.path.join(work, f"finetune-{ranks}x{accum}")
            train(ranks, out, common + [f"model_name_or_path={ref}/checkpoint-4", "max_steps=2", "eval_steps=0",
                                        f"gradient_accumulation_steps={accum}"])
            tuned[ranks] = out
        same(tuned[1], tuned[2], 2, "fine-tuned from a model directory on 2 ranks")
        print("pass: fine-tuning a model directory on 2 ranks (each loading its own masters) byte-identical to 1")

        # Freeze and LoRA fine-tuning of the same directory (model/finetune.h): the trained tensors' gradients and
        # states sharded, their masters whole on every rank, the streamed weights' trained tensors allgathered after
        # each update (dist/data_parallel.h): the one-process bits, adapters (PEFT files) and frozen model alike.
        lora_files = ("adapter_model.safetensors", "adapter_config.json", "resume/optimizer.safetensors",
                      "resume/params.safetensors")
        for kind, keys, files in (
                ("freeze", ["finetuning_type=freeze", "freeze_trainable_layers=1",
                            "freeze_trainable_modules=[mlp, self_attn]", "freeze_extra_modules=norm"], FILES),
                ("lora", ["finetuning_type=lora", "lora_rank=4", "lora_dropout=0.1", "additional_target=norm"],
                 lora_files)):
            runs = {}
            for ranks, accum in ((1, 4), (2, 2)):
                out = os.path.join(work, f"{kind}-{ranks}x{accum}")
                train(ranks, out, common + [f"model_name_or_path={ref}/checkpoint-4", "max_steps=2", "eval_steps=0",
                                            f"gradient_accumulation_steps={accum}"] + keys)
                runs[ranks] = out
            same(runs[1], runs[2], 2, f"{kind} fine-tuning on 2 ranks", files)
            if metrics(runs[2]) != metrics(runs[1]):
                fail(f"{kind} on 2 ranks: metrics differ:\n{metrics(runs[2])}\n{metrics(runs[1])}")
            print(f"pass: {kind} fine-tuning on 2 ranks byte-identical to 1 (checkpoints, metrics)")

        # Mixture-of-Experts: the demo's Qwen3-MoE and a GPT-OSS of its sizes (fused experts on disk, which each rank
        # reads by its own ranges), from scratch on 2 ranks x 2 and fine-tuned from a directory: the one-process bits.
        for kind, config in (("qwen3_moe", f"{work}/model_moe/config.json"), ("gpt_oss", gpt_oss_model(work))):
            runs = {}
            for ranks, accum in ((1, 4), (2, 2)):
                out = os.path.join(work, f"{kind}-{ranks}x{accum}")
                train(ranks, out, common + [f"model_name_or_path={config}", "max_steps=2", "eval_steps=0",
                                            f"gradient_accumulation_steps={accum}"])
                tuned_out = out + "-tuned"
                train(ranks, tuned_out, common + [f"model_name_or_path={os.path.join(runs.get(1, out), 'checkpoint-2')}",
                                                  "max_steps=2", "eval_steps=0", f"gradient_accumulation_steps={accum}"])
                runs[ranks] = out
                if ranks > 1:
                    same(runs[1], out, 2, f"{kind} on 2 ranks")
                    same(runs[1] + "-tuned", tuned_out, 2, f"{kind} fine-tuned from a directory on 2 ranks")
            print(f"pass: {kind} on 2 ranks, from scratch and fine-tuned from a directory: byte-identical to 1")

        # A global batch that changes is refused on resume, naming the key.
        out = os.path.join(work, "resumed-other-batch")
        os.makedirs(out)
        shutil.copytree(os.path.join(work, "untied-2x3", "checkpoint-2"), os.path.join(out, "checkpoint-2"))
        p = train(2, out, common + ["gradient_accumulation_steps=2", f"resume_from_checkpoint={out}/checkpoint-2"],
                  check=False)
        if p.returncode == 0 or "global_micro_batches" not in p.stderr:
            fail(f"resume with 2 x 2 instead of 6 micro-batches: exit {p.returncode}: {p.stderr[-1500:]}")

        killed_rank(work, common)

        # SIGTERM to mpirun reaches every rank at its own moment: they agree on one step, save there together
        # (rank 0 writes), and the run resumes from that checkpoint.
        out = os.path.join(work, "sigterm")
        cmd = [a.mpirun, "--oversubscribe", "-np", "2", a.lazytrain, "train", CONFIG, f"output_dir={out}"] + common + [
            "gradient_accumulation_steps=1", "max_steps=60", "eval_steps=0", "save_steps=0"]
        job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.time() + 120
        while time.time() < deadline:
            m = os.path.join(out, "metrics.jsonl")
            if os.path.exists(m) and sum(1 for _ in open(m)) >= 3:
                break
            time.sleep(0.2)
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
        if not os.path.exists(os.path.join(out, "summary.json")):
            fail(f"SIGTERM to mpirun: no summary.json (exit {job.returncode}): {err[-2000:]}\n{os.listdir(out)}")
        summary = json.load(open(os.path.join(out, "summary.json")))
        if summary.get("stopped_by") != "SIGTERM" or not os.path.isfile(
                os.path.join(summary.get("stop_checkpoint", "/nonexistent"), "resume", "optimizer.safetensors")):
            fail(f"SIGTERM to mpirun: summary {summary}, stderr {err[-1500:]}")
        stopped = summary["steps"]
        p = train(2, out, common + ["gradient_accumulation_steps=1", "max_steps=60", "eval_steps=0",
                                    "save_steps=0", "resume_from_checkpoint=true"])
        if f"at step {stopped}" not in p.stderr or json.load(open(os.path.join(out, "summary.json")))["steps"] != 60:
            fail(f"resume after SIGTERM did not start at step {stopped}: {p.stderr[-1500:]}")
        print(f"pass: SIGTERM to mpirun: both ranks stopped at step {stopped}, saved once, resumed from there")

        # A rank that stops answering (SIGSTOP: alive, silent) ends the job after dist_timeout_s, with a message.
        out = os.path.join(work, "stopped")
        stop_rank1 = signal_rank1_after_checkpoint(out, "-STOP")
        t0 = time.time()
        p = train(2, out, common + ["gradient_accumulation_steps=3", "max_steps=100000", "eval_steps=0",
                                    "dist_timeout_s=5"], check=False, wrapper=stop_rank1, timeout=300)
        took = time.time() - t0
        if p.returncode == 0 or "dist_timeout_s" not in p.stderr:
            fail(f"a job whose rank 1 stopped: exit {p.returncode}, stderr: {p.stderr[-2000:]}")
        line = next(l for l in p.stderr.splitlines() if "dist_timeout_s" in l)
        print(f"pass: rank 1 stopped: the job ended in {took:.1f} s with exit {p.returncode}: {line.strip()}")


if __name__ == "__main__":
    main()
