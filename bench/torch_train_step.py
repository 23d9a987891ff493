#!/usr/bin/python3
"""The PyTorch peer of `lazytrain bench step`: forward + backward of an HF model directory on one batch,
in f32, with Debian's torch 1.13 (/usr/bin/python3). The model is tests/reference/torch_reference.py's
plain-torch Qwen2/Qwen3/Llama (transformers' eager semantics: materialised attention scores and full
logits). Prints one JSON line: best step time and tokens/s.

Usage: torch_train_step.py MODEL_DIR BATCH_JSON [STEPS] [THREADS]"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import torch_reference as ref  # noqa: E402


def main():
    model_dir, batch_path = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else os.cpu_count())
    cfg, W, _ = ref.load_model_dir(model_dir)
    ids, labels, pos, packed = ref.load_batch(batch_path, cfg.vocab)
    P = {n: t.to(torch.float32).clone().requires_grad_(True) for n, t in W.items()}
    best = 1e30
    for i in range(steps + 1):  # the first step warms up
        for t in P.values():
            t.grad = None
        start = time.perf_counter()
        logits = ref.forward(cfg, P, ids, pos, packed)
        loss, n = ref.causal_lm_loss(logits, labels)
        loss.backward()
        elapsed = time.perf_counter() - start
        if i > 0:
            best = min(best, elapsed)
    tokens = ids.numel()
    print(json.dumps({"bench": "step", "impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "step_s": best, "tokens_per_s": tokens / best, "loss": float(loss)}))


if __name__ == "__main__":
    main()
