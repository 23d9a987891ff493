# Sourced by the bench scripts: the ~26M-parameter bench model (examples/bench-25m, seeded random init) and a
# seeded 8 x 256 batch in directory $1, made once and reused. Sets `model` and `batch`; needs `lt` (the binary).
bench_model_and_batch() {
  model=$1/model-26m
  batch=$1/batch-8x256.json
  [ -f "$model/config.json" ] || "$lt" init --config examples/bench-25m/config.json --out "$model" --seed 1 >/dev/null
  [ -f "$batch" ] || /usr/bin/python3 -c "
import json, random
random.seed(1)
rows = [[random.randrange(8192) for _ in range(256)] for _ in range(8)]
json.dump({'input_ids': rows, 'labels': rows}, open('$batch', 'w'))"
}
