#!/usr/bin/env bash
# `make demo` — until the training loop lands: what exists end to end. A tiny Qwen3-architecture model
# (examples/tiny-qwen3/config.json) is initialised at random and written as a Hugging Face directory;
# `lazytrain grad` loads it and computes the loss and every parameter gradient of one batch, in f32
# and in bf16 compute, writing the gradients as safetensors.
set -euo pipefail
build=${1:-build}
out=runs/demo
mkdir -p "$out"
lt="$build/lazytrain"

echo "== 1. a random tiny Qwen3 model (4 layers, hidden 128, vocab 384) as an HF directory"
"$lt" init --config examples/tiny-qwen3/config.json --out "$out/model" --seed 1 --dtype bf16
ls -l "$out/model"

echo
echo "== 2. loss and all parameter gradients of one batch (4 rows x 64 tokens, first 16 labels masked)"
for dtype in f32 bf16; do
  printf '%-5s ' "$dtype"
  "$lt" grad --model "$out/model" --batch examples/tiny-qwen3/batch.json --out "$out/grads-$dtype.safetensors" \
    --dtype "$dtype"
done
echo
echo "A random model's loss is close to ln(384) = 5.95. Gradients: $out/grads-f32.safetensors (HF names, f32)."
