#!/usr/bin/env python3
"""Compare two f32 gradient files written by `lazytrain grad` (safetensors) with the standard library alone, so it
runs on any machine (the GPU check's, which may lack numpy and torch). Prints one JSON line:
  {"identical": bool, "tensors": n, "relative_l2": sqrt(sum (a-b)^2 / sum b^2), "worst": name, "worst_relative_l2": x}
Usage: grad_diff.py A.safetensors B.safetensors [--max-relative X]  (exit 1 when relative_l2 > X)"""
import argparse
import array
import json
import math
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {meta['dtype']}, expected F32 (lazytrain grad writes f32)")
        a, b = meta["data_offsets"]
        values = array.array("f")
        values.frombytes(body[a:b])
        if sys.byteorder != "little":
            values.byteswap()
        tensors[name] = values
    return tensors, body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--max-relative", type=float, default=None)
    o = ap.parse_args()
    ta, body_a = read_safetensors(o.a)
    tb, body_b = read_safetensors(o.b)
    if sorted(ta) != sorted(tb):
        sys.exit(f"{o.a} and {o.b} hold different tensors")
    num = den = 0.0
    worst, worst_rel = None, 0.0
    for name in sorted(ta):
        x, y = ta[name], tb[name]
        n = sum((float(p) - float(q)) ** 2 for p, q in zip(x, y))
        d = sum(float(q) ** 2 for q in y)
        num, den = num + n, den + d
        rel = math.sqrt(n / d) if d > 0 else (0.0 if n == 0 else math.inf)
        if worst is None or rel > worst_rel:
            worst, worst_rel = name, rel
    rel = math.sqrt(num / den) if den > 0 else 0.0
    print(json.dumps({"identical": body_a == body_b, "tensors": len(ta), "relative_l2": rel, "worst": worst,
                      "worst_relative_l2": worst_rel}))
    if o.max_relative is not None and rel > o.max_relative:
        sys.exit(1)


if __name__ == "__main__":
    main()
