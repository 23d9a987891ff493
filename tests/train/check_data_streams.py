#!/usr/bin/python3
"""A data set larger than memory streams: tokenising it into the data cache (`lazytrain data`, the path `train`
takes) holds neither the file nor its tokens, so the peak memory of the process does not grow with the data.

Two JSON Lines data sets of the same records, one four times the other (10 and 40 MB by default), are each prepared in a
fresh output_dir; the larger one's peak resident memory (ru_maxrss of that process alone, from wait4) may exceed
the smaller one's by at most an eighth of the extra data: what still grows is the loader's per-example index
(about 32 bytes per ~1 KB record here) — the old path held the file, its records and every token (> 1x). Then
the smaller set as one JSON array gives the same examples and tokens, and a second run hits the cache.

Usage: check_data_streams.py --lazytrain BIN [--small-records N]   (N = 120000: 100 and 400 MB, for docs/data.md)"""
import argparse
import json
import os
import random
import subprocess
import sys

from arith_work import CONFIG, arith_work

def records(n):
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "sum", "carry", "digit", "column", "add", "seven", "nine", "zero"]
    for i in range(n):
        query = f"Problem {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(20, 60)))
        response = " ".join(rng.choice(words) for _ in range(rng.randint(60, 140))) + f". The answer is: {i}"
        yield {"query": query, "response": response}


def write_lines(path, n):
    with open(path, "w") as f:
        for r in records(n):
            f.write(json.dumps(r) + "\n")
    return os.path.getsize(path)


def write_array(path, n):
    with open(path, "w") as f:
        f.write("[\n")
        for i, r in enumerate(records(n)):
            f.write(("" if i == 0 else ",\n") + json.dumps(r, indent=1))
        f.write("\n]\n")


def prepare(lazytrain, paths, dataset, out):
    """Runs `lazytrain data`; returns (its JSON line, peak RSS in bytes)."""
    cmd = [lazytrain, "data", CONFIG, f"dataset={dataset}", f"output_dir={out}", "cutoff_len=512"] + paths
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    stdout, stderr = p.stdout.read(), p.stderr.read()
    p.stdout.close()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}: exit {os.waitstatus_to_exitcode(status)}\n{stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1]), usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--small-records", type=int, default=12000)
    a = ap.parse_args()
    n = a.small_records
    with arith_work("lt_data_streams_", 40, 4) as (work, paths):
        small, large, array = (os.path.join(work, f) for f in ("small.jsonl", "large.jsonl", "small.json"))
        small_bytes = write_lines(small, n)
        large_bytes = write_lines(large, 4 * n)
        write_array(array, n)

        s, s_rss = prepare(a.lazytrain, paths, small, os.path.join(work, "out_small"))
        l, l_rss = prepare(a.lazytrain, paths, large, os.path.join(work, "out_large"))
        growth, allowed = l_rss - s_rss, (large_bytes - small_bytes) // 8
        print(f"data {small_bytes / 1e6:.1f} MB -> peak RSS {s_rss / 1e6:.1f} MB; data {large_bytes / 1e6:.1f} MB "
              f"-> {l_rss / 1e6:.1f} MB: +{growth / 1e6:.1f} MB for +{(large_bytes - small_bytes) / 1e6:.1f} MB of data "
              f"(allowed +{allowed / 1e6:.1f}); {l['examples']} examples, {l['tokens']} tokens")
        if l["examples"] != 4 * s["examples"] or l["examples"] != 4 * n:
            sys.exit(f"FAIL: examples {s['examples']} and {l['examples']}, expected {n} and four times it")
        if growth > allowed:
            sys.exit("FAIL: peak memory grows with the data set: it is held, not streamed")

        arr, _ = prepare(a.lazytrain, paths, array, os.path.join(work, "out_array"))
        for key in ("examples", "tokens", "trained_tokens", "longest"):
            if arr[key] != s[key]:
                sys.exit(f"FAIL: the JSON array gives {key} {arr[key]}, the same records as lines {s[key]}")
        again, again_rss = prepare(a.lazytrain, paths, large, os.path.join(work, "out_large"))
        if [c["use"] for c in again["caches"]] != ["hit"] or again["tokens"] != l["tokens"]:
            sys.exit(f"FAIL: the second run did not hit the cache: {again}")
        if again_rss - s_rss > allowed:
            sys.exit(f"FAIL: a cache hit of the large set peaks at {again_rss / 1e6:.1f} MB: the cache is read whole")
        print(f"OK: streamed; array == lines; cache hit peaks at {again_rss / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
