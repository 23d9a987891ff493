#!/usr/bin/env bash
# `make demo` — the main job on the CPU with a tiny model: LazyTrain trains a 3M-parameter
# Qwen3-architecture model from scratch on generated arithmetic word problems (MetaMathQA-style, the
# responses worked column by column),
# streaming its layers through an emulated device with 256 MiB of memory, with the plan solved for that
# budget and the Hybrid 8-bit AdamW pipelined into each step; then it evaluates exact match on a
# held-out split whose operand pairs never appear in training.
#
# Leaves runs/demo/: metrics.jsonl, tensorboard/, checkpoint-*/ (Hugging Face model directories that
# resume), eval-*.json and summary.json (with "eval_exact_match").
set -euo pipefail
build=${1:-build}
lt="$build/lazytrain"

# Generated once, and again whenever the generator changes (it is seeded: the same files every time).
if [ ! -f runs/arith/data/arith_train.jsonl ] || [ examples/arith/make_data.py -nt runs/arith/data/arith_train.jsonl ]; then
  echo "== generating the dataset and the byte-level tokenizer (examples/arith/make_data.py)"
  /usr/bin/python3 examples/arith/make_data.py runs/arith
fi
echo "== this host (compute_dtype: auto trains in bf16 where the bf16 GEMM is native, else in f32)"
"$lt" info
echo "== training (examples/arith/config.yaml)"
rm -rf runs/demo
"$lt" train examples/arith/config.yaml
echo
echo "== results: runs/demo/summary.json"
/usr/bin/python3 -c "
import json; s = json.load(open('runs/demo/summary.json'))
print(f\"steps {s['steps']}, tokens {s['tokens']}, {s['seconds']:.0f} s, final loss {s['final_loss']:.4f}, \"
      f\"exact match on held-out problems {s.get('eval_exact_match', float('nan')):.1%}\")"
echo "Try it: $lt generate --model runs/demo/$(cat runs/demo/latest) --prompt 'Ava has 38 apples and finds 47 more. How many apples does Ava have now?'"
