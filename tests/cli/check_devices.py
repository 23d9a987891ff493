#!/usr/bin/python3
"""`lazytrain devices --json`: one JSON object keyed by cpu, cuda and cuda-sim, with what each promises —
cpu and cuda-sim always available; cuda says whether this binary was built with nvcc and lists the driver's
GPUs (none here: no driver, said in `error`). The text form names all three. Without a GPU, `grad --device cuda`
ends with one line naming the reason and a non-zero exit. Usage: --lazytrain BIN [--expect-cuda-built yes|no|any]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--expect-cuda-built", default="any", choices=["yes", "no", "any"])
    args = ap.parse_args()
    out = subprocess.run([args.lazytrain, "devices", "--json"], check=True, capture_output=True, text=True).stdout
    lines = out.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line, got {len(lines)}"
    d = json.loads(lines[0])
    assert set(d) == {"cpu", "cuda", "cuda-sim"}, f"keys {sorted(d)}"
    assert d["cpu"]["available"] is True and d["cpu"]["threads"] >= 1 and d["cpu"]["memory_bytes"] > 0
    assert d["cpu"]["vector_path"] in ("plain", "avx2", "avx512"), d["cpu"]
    assert d["cuda-sim"]["available"] is True and d["cuda-sim"]["warp_size"] == 32
    cuda = d["cuda"]
    assert isinstance(cuda["built"], bool) and isinstance(cuda["devices"], list), cuda
    if args.expect_cuda_built != "any":
        assert cuda["built"] == (args.expect_cuda_built == "yes"), cuda
    if cuda["built"]:
        assert cuda["architectures"] and cuda["runtime"], cuda
    for g in cuda["devices"]:
        for key in ("index", "name", "memory_bytes", "compute_capability", "multiprocessors", "supported"):
            assert key in g, f"device entry lacks {key}: {g}"
    if not cuda["devices"]:
        assert cuda.get("error"), f"no devices and no reason given: {cuda}"
    text = subprocess.run([args.lazytrain, "devices"], check=True, capture_output=True, text=True).stdout
    for name in ("cpu", "cuda", "cuda-sim"):
        assert any(line.startswith(name + " ") for line in text.splitlines()), f"text lacks a {name} line:\n{text}"
    if not cuda["devices"]:
        work = tempfile.mkdtemp(prefix="lt_devices_")
        subprocess.run([args.lazytrain, "init", "--config", os.path.join(ROOT, "examples/tiny-qwen3/config.json"),
                        "--out", os.path.join(work, "model")], check=True, capture_output=True)
        p = subprocess.run([args.lazytrain, "grad", "--model", os.path.join(work, "model"), "--batch",
                            os.path.join(ROOT, "examples/tiny-qwen3/batch.json"), "--out",
                            os.path.join(work, "g.safetensors"), "--device", "cuda"], capture_output=True, text=True)
        err = p.stderr.strip().splitlines()
        assert p.returncode != 0 and len(err) == 1, f"grad --device cuda without a GPU: rc {p.returncode}, {err}"
        assert ("CUDA" in err[0] or "nvcc" in err[0]) and "Traceback" not in err[0], err[0]
        print(f"grad --device cuda without a GPU: {err[0]}")
    print(f"devices: cuda built={cuda['built']}, {len(cuda['devices'])} GPU(s); {cuda.get('error', '')}")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
