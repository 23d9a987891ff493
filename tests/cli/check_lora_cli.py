#!/usr/bin/python3
"""LoRA from the command line: `lazytrain train` with finetuning_type lora on a base model (the demo's sizes, written by
`lazytrain init`) saves PEFT adapter directories; `lazytrain export --model BASE --adapter DIR --out MERGED` writes the
merged model, whose loss equals the adapter's on its base (lazytrain grad --adapter, and PyTorch on the merged files);
`generate --adapter` decodes what the merged model decodes; `eval CONFIG` evaluates the adapter checkpoint on its base;
training on an adapter (adapter_name_or_path) continues it; a contradicting key is refused naming it.

Usage: check_lora_cli.py --lazytrain BIN"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "train"))
from arith_work import CONFIG, arith_work  # noqa: E402


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def last_json(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    a = ap.parse_args()
    lt = a.lazytrain
    with arith_work("lt_lora_cli_", 300, 8) as (work, paths):
        base = os.path.join(work, "base")
        run([lt, "init", "--config", os.path.join(work, "model", "config.json"), "--out", base, "--seed", "5",
             "--dtype", "bf16"])  # init copies the tokenizer beside the config
        out = os.path.join(work, "run")
        common = [f"model_name_or_path={base}", paths[1], "max_steps=12", "save_steps=6", "logging_steps=6",
                  "per_device_train_batch_size=8", "device_memory=256MiB", "plan=every:2", "finetuning_type=lora",
                  "lora_rank=8", "lora_target=all", "learning_rate=5e-3"]
        p = run([lt, "train", CONFIG, f"output_dir={out}"] + common + ["eval_dataset="])
        ckpt = os.path.join(out, "checkpoint-12")
        for f in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
            if not os.path.exists(os.path.join(ckpt, f)):
                sys.exit(f"FAIL: {ckpt} has no {f}")
        if os.path.exists(os.path.join(ckpt, "model.safetensors")):
            sys.exit("FAIL: a LoRA checkpoint holds the whole model")
        cfg = json.load(open(os.path.join(ckpt, "adapter_config.json")))
        if cfg["r"] != 8 or cfg["lora_alpha"] != 16 or cfg["peft_type"] != "LORA" or cfg["base_model_name_or_path"] != base:
            sys.exit(f"FAIL: adapter_config.json {cfg}")
        print(f"pass: trained, {ckpt} is a PEFT adapter (r 8, alpha 16, targets {cfg['target_modules']})")

        # The merged model's loss is the adapter's on its base (f32 merge: a few f32 roundings apart).
        merged = os.path.join(work, "merged")
        run([lt, "export", "--model", base, "--adapter", ckpt, "--out", merged, "--dtype", "f32"])
        batch = os.path.join(work, "batch.json")
        ids = [[(7 * i + 3 * j) % 259 for j in range(33)] for i in range(2)]
        json.dump({"input_ids": ids, "labels": ids}, open(batch, "w"))
        with_adapter = last_json(run([lt, "grad", "--model", base, "--adapter", ckpt, "--batch", batch, "--out",
                                      os.path.join(work, "ga.safetensors")]))["loss"]
        on_merged = last_json(run([lt, "grad", "--model", merged, "--batch", batch, "--out",
                                   os.path.join(work, "gm.safetensors")]))["loss"]
        torch_merged = last_json(run(["/usr/bin/python3", os.path.join(ROOT, "tests/reference/torch_reference.py"),
                                      "grad", "--model", merged, "--batch", batch, "--out",
                                      os.path.join(work, "gt.safetensors")]))["loss"]
        torch_adapter = last_json(run(["/usr/bin/python3", os.path.join(ROOT, "tests/reference/torch_reference.py"),
                                       "grad", "--model", base, "--adapter", ckpt, "--batch", batch, "--out",
                                       os.path.join(work, "gu.safetensors")]))["loss"]
        # f32 arithmetic either way (1e-6), the merged weights' one more f32 rounding each (another 1e-6).
        for name, x in (("merged", on_merged), ("PyTorch on merged", torch_merged), ("PyTorch with the adapter",
                                                                                    torch_adapter)):
            if abs(x - with_adapter) > 2e-6 * abs(with_adapter):
                sys.exit(f"FAIL: loss with the adapter {with_adapter} vs {name} {x}")
        base_loss = last_json(run([lt, "grad", "--model", base, "--batch", batch, "--out",
                                   os.path.join(work, "gb.safetensors")]))["loss"]
        if abs(base_loss - with_adapter) < 1e-3 * abs(base_loss):
            sys.exit(f"FAIL: the trained adapter does not change the loss ({base_loss} vs {with_adapter})")
        print(f"pass: merged model loss {on_merged:.8f} = adapter on base {with_adapter:.8f} (PyTorch {torch_merged:.8f}, "
              f"{torch_adapter:.8f}; base alone {base_loss:.6f})")

        # --raw: the prompt as is, so the barely trained model does not stop at once on its end-of-turn token.
        prompt = "What is 12 + 34? The answer"
        g_adapter = run([lt, "generate", "--model", base, "--adapter", ckpt, "--prompt", prompt, "--raw",
                         "--max-new-tokens", "24"]).stdout
        g_merged = run([lt, "generate", "--model", merged, "--prompt", prompt, "--raw", "--max-new-tokens", "24"]).stdout
        g_base = run([lt, "generate", "--model", base, "--prompt", prompt, "--raw", "--max-new-tokens", "24"]).stdout
        if not g_adapter.strip() or g_adapter == g_base:
            sys.exit(f"FAIL: generate --adapter {g_adapter!r} (the base alone: {g_base!r}): nothing to compare")
        if g_adapter != g_merged:
            sys.exit(f"FAIL: generate --adapter {g_adapter!r} vs the merged model {g_merged!r}")
        print(f"pass: generate --adapter = generate on the merged model ({g_adapter.strip()!r})")

        ev = last_json(run([lt, "eval", CONFIG, f"output_dir={out}"] + common + ["--limit", "4"]))
        if ev.get("total") != 4 or ev.get("model") != ckpt:
            sys.exit(f"FAIL: eval on the adapter checkpoint: {ev}")
        print(f"pass: eval CONFIG on the adapter checkpoint ({ev['correct']}/{ev['total']})")

        # Training on the adapter continues it (its rank from its config); a contradicting key is refused by name.
        out2 = os.path.join(work, "run2")
        cont = [k for k in common if not k.startswith("lora_rank")] + [f"adapter_name_or_path={ckpt}", "max_steps=2"]
        run([lt, "train", CONFIG, f"output_dir={out2}"] + cont + ["eval_dataset="])
        p = run([lt, "train", CONFIG, f"output_dir={out2}x"] + cont + ["lora_rank=4", "eval_dataset="], ok=False)
        if p.returncode == 0 or "lora_rank" not in p.stderr or ckpt not in p.stderr:
            sys.exit(f"FAIL: lora_rank 4 on a rank-8 adapter: {p.returncode} {p.stderr[-500:]}")
        print(f"pass: training continues an adapter; a contradicting lora_rank is refused: {p.stderr.strip()[-160:]}")


if __name__ == "__main__":
    main()
