#!/usr/bin/python3
"""Resume after SIGKILL: a run killed at random moments (during steps and during checkpoint saves) and
resumed with resume_from_checkpoint=true until it finishes must end with model files byte-identical to
an uninterrupted run of the same config.

Usage: check_resume_kill.py --lazytrain BIN [--kills N] [--seed S] [--steps N] [--device cpu|cuda-sim]
                     [--model dense|moe|gpt_oss] [--freeze | --lora]
                     [--batch B]

--freeze: freeze fine-tuning (the last layer's MLP and self-attention, and the final norm): the frozen tensors
are the same bytes in every checkpoint, the trained ones are not, and resume/params.safetensors holds only the
trained ones.
--lora: LoRA (rank 4, dropout 0.1, the final norm trained whole) on a bf16 base written by `lazytrain init`: the
checkpoints are PEFT adapter directories, compared byte for byte, and the saved adapter on its base gives PyTorch's
loss."""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

from arith_work import CONFIG, ROOT, arith_work, gpt_oss_model


def read_tensors(path):
    """A safetensors file's tensors as {name: bytes}."""
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def check_frozen(before, after):
    """Freeze fine-tuning: between two checkpoints the frozen tensors keep their bytes and the trained ones (the last
    layer's self_attn and mlp, the final norm) move; the masters saved for resume are the trained tensors alone."""
    x = read_tensors(os.path.join(before, "model.safetensors"))
    y = read_tensors(os.path.join(after, "model.safetensors"))
    layers = 1 + max(int(k.split(".")[2]) for k in x if k.startswith("model.layers."))
    last = f"model.layers.{layers - 1}."
    trained = {k for k in x if k == "model.norm.weight" or
               (k.startswith(last + "self_attn.") or k.startswith(last + "mlp."))}
    moved = {k for k in x if x[k] != y[k]}
    if not moved <= trained:
        sys.exit(f"FAIL: frozen tensors changed between checkpoints: {sorted(moved - trained)[:5]}")
    if not {k for k in trained if k.endswith("proj.weight")} <= moved:
        sys.exit(f"FAIL: trained matrices did not move: {sorted(trained - moved)[:5]}")
    masters = set(read_tensors(os.path.join(after, "resume", "params.safetensors")))
    if masters != trained:
        sys.exit(f"FAIL: resume/params.safetensors holds {sorted(masters ^ trained)[:5]} beyond the trained tensors")
    print(f"pass: {len(x) - len(trained)} frozen tensors kept their bytes, the {len(trained)} trained ones moved")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda-sim"],
                    help="cuda-sim: the CUDA block and head under cuda-sim (bf16 activations), what --device cuda runs")
    ap.add_argument("--model", default="dense", choices=["dense", "moe", "gpt_oss"],
                    help="moe: the demo's Qwen3-MoE (make_data.py's model_moe: 8 experts, 2 per token); gpt_oss: a "
                         "GPT-OSS of its sizes (sliding and full layers, sinks, YaRN, biased clamped experts)")
    ap.add_argument("--batch", type=int, default=4, help="per_device_train_batch_size")
    ap.add_argument("--freeze", action="store_true", help="finetuning_type: freeze")
    ap.add_argument("--lora", action="store_true", help="finetuning_type: lora")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with arith_work("lt_resume_kill_", 400, 10) as (work, paths):
        config = CONFIG
        if a.model == "moe":
            paths = [f"model_name_or_path={work}/model_moe/config.json"] + paths[1:]
        if a.model == "gpt_oss":
            paths = [f"model_name_or_path={gpt_oss_model(work)}"] + paths[1:]
        common = paths + ["eval_dataset=",
                  f"per_device_train_batch_size={a.batch}", f"max_steps={a.steps}", "save_steps=2", "save_total_limit=2",
                  "logging_steps=4", "plan=every:2", "cutoff_len=160", "device_memory=256MiB", f"device={a.device}"]
        if a.device == "cuda-sim":  # the GPU's storage, so the executor launches the CUDA block (exec/backend.h)
            common.append("activation_dtype=bf16")
        if a.freeze:
            common += ["finetuning_type=freeze", "freeze_trainable_layers=1",
                       "freeze_trainable_modules=[mlp, self_attn]", "freeze_extra_modules=norm"]
        base = None
        if a.lora:  # a base model directory to adapt (`lazytrain init`, bf16 as released checkpoints are)
            base = os.path.join(work, "base")
            subprocess.run([a.lazytrain, "init", "--config", paths[0].split("=", 1)[1], "--out", base, "--seed", "3",
                            "--dtype", "bf16"], check=True, capture_output=True)  # with the tokenizer beside it
            common = [f"model_name_or_path={base}"] + common[1:]
            common += ["finetuning_type=lora", "lora_rank=4", "lora_dropout=0.1", "additional_target=norm"]

        def run(out, extra=(), kill_after=None):
            cmd = [a.lazytrain, "train", config, f"output_dir={out}"] + common + list(extra)
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if kill_after is None:
                out_, err = p.communicate()
                if p.returncode != 0:
                    sys.exit(f"run failed ({p.returncode}): {' '.join(cmd)}\n{err.decode()[-2000:]}")
                return True
            try:
                p.wait(timeout=kill_after)
                return p.returncode == 0  # finished before the kill
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
                return False

        ref = os.path.join(work, "reference")
        t0 = time.time()
        run(ref)
        full = time.time() - t0
        killed = os.path.join(work, "killed")
        done, kills = False, 0
        while not done:
            if kills < a.kills:
                done = run(killed, ["resume_from_checkpoint=true"], kill_after=rng.uniform(0.2, 0.6 * full))
                if not done:
                    kills += 1
                    latest = os.path.join(killed, "latest")
                    print(f"kill {kills}: latest = {open(latest).read().strip() if os.path.exists(latest) else 'none'}")
            else:
                done = run(killed, ["resume_from_checkpoint=true"])
        model_files = ("adapter_model.safetensors", "adapter_config.json") if a.lora else ("model.safetensors",
                                                                                            "config.json")
        for name in model_files + ("resume/optimizer.safetensors", "resume/params.safetensors"):
            x = open(os.path.join(ref, f"checkpoint-{a.steps}", name), "rb").read()
            y = open(os.path.join(killed, f"checkpoint-{a.steps}", name), "rb").read()
            if x != y:
                sys.exit(f"FAIL: checkpoint-{a.steps}/{name} differs after {kills} kills")
        print(f"pass: {kills} kills, resumed run byte-identical to the uninterrupted one")
        if a.freeze:
            check_frozen(os.path.join(ref, f"checkpoint-{a.steps - 2}"), os.path.join(ref, f"checkpoint-{a.steps}"))

        # The saved checkpoint is a Hugging Face model: PyTorch's reference loads it and agrees on the loss.
        ckpt = os.path.join(ref, f"checkpoint-{a.steps}")
        batch = os.path.join(work, "batch.json")
        ids = [[rng.randrange(259) for _ in range(40)] for _ in range(2)]
        json.dump({"input_ids": ids, "labels": ids}, open(batch, "w"))
        model = ["--model", base, "--adapter", ckpt] if a.lora else ["--model", ckpt]  # LoRA: the adapter on its base
        ours = json.loads(subprocess.run([a.lazytrain, "grad"] + model + ["--batch", batch, "--out",
                                          os.path.join(work, "g1.safetensors")], check=True, capture_output=True,
                                         text=True).stdout.strip().splitlines()[-1])
        theirs = json.loads(subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/reference/torch_reference.py"),
                                            "grad"] + model + ["--batch", batch, "--out",
                                            os.path.join(work, "g2.safetensors")], check=True, capture_output=True,
                                           text=True).stdout.strip().splitlines()[-1])
        rel = abs(ours["loss"] - theirs["loss"]) / abs(theirs["loss"])
        # f32 compute against the float64 reference on the same bf16 weights: 1e-5 as in model_vs_torch.
        if rel > 1e-5:
            sys.exit(f"FAIL: checkpoint loss {ours['loss']} vs PyTorch {theirs['loss']} (rel {rel:.2e})")
        print(f"pass: the checkpoint loads in PyTorch with the same loss ({ours['loss']:.6f} vs {theirs['loss']:.6f})")


if __name__ == "__main__":
    main()
