#!/usr/bin/python3
"""The demo's data and tokenizer, generated (nothing is downloaded).

Writes into OUT (default examples/arith/generated):
  model/config.json, model/tokenizer.json, model/tokenizer_config.json
      a tiny Qwen3-architecture model whose tokenizer is byte-level BPE with no merges: the 256 byte
      tokens plus <|endoftext|>, <|im_start|>, <|im_end|> (259 tokens, vocab padded to 264)
  data/arith_train.jsonl, data/arith_test.jsonl, data/dataset_info.json
      MetaMathQA-style records {"query", "response", "type"}: two-operand arithmetic word problems whose
      responses end "The answer is: N". The test split's operand pairs never appear in training.

Usage: make_data.py [OUT] [--train N] [--test N] [--seed S]
"""
import argparse
import json
import os
import random


def byte_to_unicode():
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to U+0100.. ."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json():
    alphabet = byte_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(specials)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 264, "hidden_size": 256,
    "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 512, "tie_word_embeddings": True, "attention_bias": False,
    "torch_dtype": "float32", "bos_token_id": 256, "eos_token_id": 258,
}

NAMES = ["Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Mo", "Nia"]
ITEMS = ["apples", "books", "coins", "marbles", "pencils", "shells", "stamps", "cards", "stickers", "beads"]


def problem(rng, a, b, op):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if op == "add":
        q = f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?"
        ans, work = a + b, f"{a} + {b} = {a + b}"
    elif op == "sub":
        a, b = max(a, b), min(a, b)
        q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        ans, work = a - b, f"{a} - {b} = {a - b}"
    else:
        q = f"{name} buys {a} boxes with {b} {item} in each. How many {item} does {name} buy?"
        ans, work = a * b, f"{a} * {b} = {a * b}"
    return {"query": q, "response": f"{work}. The answer is: {ans}", "type": op}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="examples/arith/generated")
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(os.path.join(a.out, "model"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "data"), exist_ok=True)
    with open(os.path.join(a.out, "model", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(a.out, "model", "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    with open(os.path.join(a.out, "model", "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}, f)

    # Operand pairs split once: the test pairs are never seen in training (in any order or operation).
    pairs = [(x, y) for x in range(2, 50) for y in range(2, 50) if x <= y]
    rng.shuffle(pairs)
    test_pairs, train_pairs = pairs[: a.test], pairs[a.test:]
    ops = ["add", "sub", "mul"]
    with open(os.path.join(a.out, "data", "arith_train.jsonl"), "w") as f:
        for _ in range(a.train):
            x, y = rng.choice(train_pairs)
            if rng.random() < 0.5:
                x, y = y, x
            f.write(json.dumps(problem(rng, x, y, rng.choice(ops))) + "\n")
    with open(os.path.join(a.out, "data", "arith_test.jsonl"), "w") as f:
        for i, (x, y) in enumerate(test_pairs):
            f.write(json.dumps(problem(rng, x, y, ops[i % 3])) + "\n")
    with open(os.path.join(a.out, "data", "dataset_info.json"), "w") as f:
        json.dump({"arith_train": {"file_name": "arith_train.jsonl", "formatting": "alpaca",
                                   "columns": {"prompt": "query", "response": "response"}},
                   "arith_test": {"file_name": "arith_test.jsonl", "formatting": "alpaca",
                                  "columns": {"prompt": "query", "response": "response"}}}, f, indent=2)
    print(json.dumps({"out": a.out, "train": a.train, "test": len(test_pairs)}))


if __name__ == "__main__":
    main()
