#!/usr/bin/env python3
"""Fails when a CUDA kernel keeps per-thread data in local memory: ptxas's report for src/cuda/native/kernels.cu
(sm_90, the build's flags) shows a stack frame or spills for it. A register array indexed by anything but
constants (a loop nvcc does not unroll) goes to local memory without a word at build time — ptxas calls it a stack
frame, not a spill — and the tensor-core kernels' accumulators are such arrays: the attention forward's output
(64 floats a thread at head dim 128) went through local memory this way unnoticed until 2026-12-07.

The CUDA-core fallbacks in ALLOWED index their per-thread rows at run time by design (head dims other than 64,
128 and 256, f32 storage; docs/cuda.md); every other kernel must keep to registers.

Usage: check-kernel-registers.py NVCC SRC_DIR [INCLUDE_DIR ...]
Prints each kernel's registers; exits 1 naming each offender.
"""
import re
import subprocess
import sys

ALLOWED = re.compile(r"^(attention_forward_kernel|attention_backward_q_kernel|attention_backward_kv_kernel|"
                     r"gated_delta_forward_kernel|gated_delta_backward_kernel)(<\d+>)?$")
ENTRY = re.compile(r"Compiling entry function '(\S+)' for 'sm_\d+'")
USAGE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")


def kernel_name(mangled):
    """lt::cuda::native::NAME from its Itanium mangling (the identifier after `native`), with a leading integer
    template argument as <N> (attention_forward_mma_kernel<128>)."""
    m = re.search(r"6native(\d+)", mangled)
    if not m:
        return mangled
    start = m.end()
    name = mangled[start:start + int(m.group(1))]
    arg = re.match(r"ILi(\d+)E", mangled[start + int(m.group(1)):])
    return f"{name}<{arg.group(1)}>" if arg else name


def report(nvcc, src, includes):
    cmd = [nvcc, "-arch=sm_90", "-O3", "-fmad=false", "-std=c++20", "-DLT_WITH_CUDA=1", "-DFMT_SHARED",
           "-Xptxas", "-v", "-c", f"{src}/src/cuda/native/kernels.cu", "-o", "/dev/null", f"-I{src}/src"]
    cmd += [f"-I{d}" for d in includes]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"check-kernel-registers: nvcc failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return run.stderr


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kernels, name, usage = [], None, None  # kernels: (name, mangled, registers, stack, spill stores, spill loads)
    for line in report(sys.argv[1], sys.argv[2], sys.argv[3:]).splitlines():
        if m := ENTRY.search(line):
            name, usage = m.group(1), None
        elif name and (m := USAGE.search(line)):
            usage = tuple(int(x) for x in m.groups())
        elif name and usage and (m := REGISTERS.search(line)):
            kernels.append((kernel_name(name), name, int(m.group(1))) + usage)
            name = None
    if not kernels:
        sys.exit("check-kernel-registers: ptxas reported no kernels (its -v output changed?)")
    offenders = [k for k in kernels if (k[3] or k[4] or k[5]) and not ALLOWED.match(k[0])]
    for k in sorted(kernels):
        print(f"{k[0]:48s} {k[2]:4d} registers, stack {k[3]} B, spills {k[4]} / {k[5]} B")
    for k in offenders:
        print(f"check-kernel-registers: {k[1]} keeps data in local memory: {k[3]}-byte stack frame, spill stores "
              f"{k[4]} B, loads {k[5]} B (a register array indexed at run time, or too many registers)",
              file=sys.stderr)
    print(f"check-kernel-registers: {len(kernels)} kernels, {len(offenders)} in local memory")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
