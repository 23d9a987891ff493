#!/usr/bin/python3
"""Whole-model check: LazyTrain's `lazytrain grad` against the PyTorch autograd reference.

For one named case: builds a random HF model directory with torch_reference.py, computes the reference
loss and gradients in float64 with autograd, runs `lazytrain grad` on the same directory and batch, and
compares loss (relative) and every gradient (relative L2). Exit status 0 = pass.

Bounds:
  f32: loss rel 1e-5 and gradients rel-L2 1e-4. LazyTrain computes in f32 (eps 6e-8); a few layers of
       O(1)-scaled activations accumulate ~1e-6 relative error, so 1e-5 / 1e-4 leave margin while any
       real bug (a wrong term, a missing bias grad) shows up at 1e-2 or worse.
  bf16: GEMM operands rounded to bf16 (relative rounding 2^-9 = 2e-3 per operand). Errors of the
       independent roundings average out over a dot product but compound over layers, and the
       gradient of small-norm tensors is noisier: loss rel 1e-2 and gradients rel-L2 5e-2.
  Activations stored in bf16 (--activation-dtype; `auto`, the default, is bf16 with bf16 GEMMs): each stored
       activation and layer boundary is rounded once (2^-9 relative), the same order as an operand rounding,
       so the bf16 bounds apply whenever either the GEMMs or the storage are bf16.
  Every case with bf16 GEMMs or bf16 storage is checked twice, and both must pass:
    tight, against the reference that applies LazyTrain's bf16 rounding points itself: grad --emulate-bf16 for
       bf16 GEMMs (each linear layer and the lm_head round x, W forward and dy, W / dy, x backward) and
       --emulate-bf16-storage for bf16 storage (each stored activation and layer boundary rounded where it is
       computed, the gradient straight through, attention's backward reading its rounded output); the rest
       float64. Measured for storage: with f32 GEMMs the emulated reference and LazyTrain agree to 5e-6
       (qwen3_5_text) .. 4e-3 (decoders, where a boundary rounding flips), with bf16 GEMMs as below.
       What remains is LazyTrain's f32 arithmetic (~1e-7 relative) and its consequence at the roundings: where
       our f32 value and the float64 one straddle a bf16 rounding boundary they round to neighbouring bf16
       values, one bf16 ulp (2^-8 relative) apart. An operand carrying a relative error d flips with probability
       ~d / 2^-8, so after a rounding the error is ~sqrt(d · 2^-8) in rel-L2, not d: 1e-7 becomes ~2e-5, which
       the next rounding turns into ~3e-4, and so on through the layers and the backward, amplified on the way
       as much as the rounding noise itself is. Measured (qwen3_untied, llama_bias, qwen2_packed_f16,
       qwen3_5_text x 6 seeds, LazyTrain and, as a second f32 implementation of the same roundings, the
       reference in float32 -- both behave alike): where no flip happens the gradients agree to 1e-7 and the
       loss to 1e-9; the worst tensor per run reaches 6.5e-3 for the decoders and 3.6e-2 for qwen3_5_text,
       i.e. up to 0.32 x the case's bf16 noise (the emulated reference's worst rel-L2 to the float64 one:
       1.3e-2..3.1e-2 for the decoders, 0.11..0.39 for qwen3_5_text, whose L2-normalised q/k and gates amplify
       every rounding); the loss up to 8.6e-5 relative (flipping, in the reference, the few forward operand
       elements within 3e-7 of a bf16 tie reproduces LazyTrain's loss to 1e-9). Bounds: gradients rel-L2
       max(2e-2, 0.4 x that noise) (about 3x the worst seen: 2e-2 for the decoders, 4e-2..1.6e-1 for
       qwen3_5_text), loss 3e-4. A wrong
       operand, term or stride shows; one single misplaced rounding point (simulated: 1.5e-3..3e-2, the
       forward's up to 2e-1) is of the flips' size and shows only where it exceeds them.
    loose, against the float64 reference as for bf16 storage (loss 1e-2, gradients 5e-2), except that a tensor
       whose bf16 noise alone (emulated vs float64) exceeds half of 5e-2 is allowed twice that noise: in
       qwen3_5_text the noise reaches 0.1-0.4 (A_log, dt_bias, conv1d, in_proj_qkv of the first Gated DeltaNet
       layer ...), which no bf16 implementation can beat. The decoders' worst noise is 1.3e-2..3.1e-2, so 5e-2
       stays for nearly all their tensors (measured: at most 2 widened per run, to <= 6.2e-2). Given the tight
       check this one adds little (|ours - f64| <= |ours - emulated| + |emulated - f64|); it is kept as the
       check that does not depend on the emulation being right.

Usage: check_model.py --lazytrain build/lazytrain --case qwen3_untied [--workdir DIR] [--dtype f32|bf16]
                      [--activation-dtype auto|f32|bf16] [--device cpu|cuda-sim] [--policy P]
"""
import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The reference runs in this process: `import torch` costs ~2.5 s, and a case calls the reference three to five times
# (make, grad, the emulated grad, one or two compares) -- as subprocesses that was most of a case's time.
import torch_reference  # noqa: E402
from safetensors_py import read_safetensors  # noqa: E402

# Odd shapes on purpose: T=37, GQA 6:2, vocab 101 (not a multiple of 8), head_dim != hidden/heads.
CASES = {
    "qwen2": ["--arch", "qwen2", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
              "--intermediate", "67", "--vocab", "101", "--no-tie", "--batch", "2", "--seq", "37"],
    "qwen2_tied_sharded": ["--arch", "qwen2", "--layers", "3", "--hidden", "32", "--heads", "4", "--kv-heads", "4",
                           "--intermediate", "40", "--vocab", "97", "--tie", "--batch", "1", "--seq", "29",
                           "--shards", "3"],
    "qwen3_untied": ["--arch", "qwen3", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
                     "--head-dim", "16", "--intermediate", "67", "--vocab", "101", "--no-tie", "--batch", "2",
                     "--seq", "37"],
    "qwen3_tied": ["--arch", "qwen3", "--layers", "2", "--hidden", "40", "--heads", "4", "--kv-heads", "2",
                   "--head-dim", "16", "--intermediate", "56", "--vocab", "101", "--tie", "--batch", "2",
                   "--seq", "37"],
    "llama_bias": ["--arch", "llama", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
                   "--intermediate", "67", "--vocab", "101", "--no-tie", "--attention-bias", "--mlp-bias",
                   "--batch", "2", "--seq", "37"],
    "llama_bf16_weights": ["--arch", "llama", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "1",
                           "--intermediate", "48", "--vocab", "89", "--no-tie", "--batch", "2", "--seq", "23",
                           "--dtype", "bfloat16"],
    # Three documents packed per row (position_ids restart at 0), f16 weights, sharded, v5-style config.
    "qwen2_packed_f16": ["--arch", "qwen2", "--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "2",
                         "--intermediate", "67", "--vocab", "101", "--no-tie", "--batch", "2", "--seq", "37",
                         "--docs", "3", "--dtype", "float16", "--shards", "2", "--config-style", "v5"],
    # Qwen3.5 hybrids: Gated DeltaNet and gated-attention layers. Text form: T = 70 (the delta rule's chunk of 64
    # and a partial one), three packed documents, value heads twice the key heads, head dims 12 and 10, RoPE on
    # half the head dims.
    "qwen3_5_text": ["--arch", "qwen3_5", "--layers", "3", "--layer-types", "linear,full,linear", "--hidden", "40",
                     "--heads", "4", "--kv-heads", "2", "--head-dim", "12", "--partial-rotary-factor", "0.5",
                     "--intermediate", "72", "--vocab", "101", "--linear-key-heads", "2", "--linear-value-heads", "4",
                     "--linear-key-dim", "12", "--linear-value-dim", "10", "--batch", "2", "--seq", "70",
                     "--docs", "3"],
    # The released vision-language form: weights under model.language_model. beside vision and MTP tensors, bf16
    # with A_log and the gated norm in f32, tied, sharded; layer types from full_attention_interval 2.
    "qwen3_5_vl_bf16_weights": ["--arch", "qwen3_5_vl", "--layers", "4", "--full-attention-interval", "2",
                                "--omit-layer-types", "--hidden", "32", "--heads", "4", "--kv-heads", "1",
                                "--head-dim", "16", "--intermediate", "48", "--vocab", "89", "--tie",
                                "--linear-key-heads", "1", "--linear-value-heads", "3", "--linear-key-dim", "8",
                                "--linear-value-dim", "6", "--batch", "2", "--seq", "37", "--dtype", "bfloat16",
                                "--shards", "2"],
    # Qwen3-MoE: Qwen3 attention, routed SwiGLU experts. A dense layer (mlp_only_layers) between two sparse ones,
    # per-expert tensors, top-2 of 6 without renormalisation. make draws tokens again where a routing is within 1e-3
    # of a tie (f32 and float64 could then pick different experts) and prints the smallest margin.
    "qwen3_moe": ["--arch", "qwen3_moe", "--layers", "3", "--mlp-only-layers", "1", "--hidden", "40", "--heads", "4",
                  "--kv-heads", "2", "--head-dim", "12", "--intermediate", "56", "--vocab", "101", "--no-tie",
                  "--experts", "6", "--experts-per-tok", "2", "--moe-intermediate", "20", "--batch", "2",
                  "--seq", "37"],
    # transformers 5.x's fused expert tensors (gate_up_proj [E, 2·Ie, C], down_proj [E, C, Ie]), top-3 of 5
    # renormalised (norm_topk_prob), bf16 weights, tied. The gradients are compared under per-expert names.
    "qwen3_moe_fused_renorm": ["--arch", "qwen3_moe", "--layers", "2", "--fused-experts", "--norm-topk-prob",
                               "--experts", "5", "--experts-per-tok", "3", "--moe-intermediate", "18", "--hidden", "32",
                               "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--vocab", "89", "--tie",
                               "--batch", "2", "--seq", "23", "--dtype", "bfloat16"],
    # Qwen3.5 / Qwen3.6 MoE: the qwen3_5 hybrid layers with a sparse block in every layer (routed experts, top-k
    # always renormalised, plus a shared SwiGLU expert scaled by sigmoid(x · shared_expert_gateᵀ)). Text form as
    # qwen3_5_text (T = 70 across the delta rule's chunk, three packed documents), per-expert tensors, top-2 of 5.
    # make draws tokens again where a routing is within 1e-3 of a tie, as for qwen3_moe.
    "qwen3_5_moe_text": ["--arch", "qwen3_5_moe_text", "--layers", "3", "--layer-types", "linear,full,linear",
                         "--hidden", "40", "--heads", "4", "--kv-heads", "2", "--head-dim", "12",
                         "--partial-rotary-factor", "0.5", "--vocab", "101", "--linear-key-heads", "2",
                         "--linear-value-heads", "4", "--linear-key-dim", "12", "--linear-value-dim", "10",
                         "--experts", "5", "--experts-per-tok", "2", "--moe-intermediate", "18",
                         "--shared-intermediate", "14", "--batch", "2", "--seq", "70", "--docs", "3"],
    # The released vision-language form (model.language_model. beside vision and MTP tensors, the MTP layer with
    # its own MoE block) as qwen3_5_vl_bf16_weights: bf16 with A_log and the gated norm in f32, tied, sharded, layer
    # types from full_attention_interval 2; fused expert tensors, top-3 of 6.
    "qwen3_5_moe_vl_fused_bf16": ["--arch", "qwen3_5_moe_vl", "--layers", "4", "--full-attention-interval", "2",
                                  "--omit-layer-types", "--hidden", "32", "--heads", "4", "--kv-heads", "1",
                                  "--head-dim", "16", "--vocab", "89", "--tie", "--linear-key-heads", "1",
                                  "--linear-value-heads", "3", "--linear-key-dim", "8", "--linear-value-dim", "6",
                                  "--experts", "6", "--experts-per-tok", "3", "--moe-intermediate", "12",
                                  "--shared-intermediate", "20", "--fused-experts", "--batch", "2", "--seq", "37",
                                  "--dtype", "bfloat16", "--shards", "2"],
}
# GPT-OSS (tests/reference/gpt_oss.py): sliding (W = 5) and full layers, sinks, YaRN, the biased top-k router and
# clamped experts (limit 1, so the clamps are reached) from fused input-major bf16 files; bf16 against the reference's
# emulation of LazyTrain's GPT-OSS rounding points (gpt_oss.py's docstring).
CASES["gpt_oss_bf16_weights"] = ["--arch", "gpt_oss", "--layers", "3", "--hidden", "32", "--heads", "4", "--kv-heads",
                                 "2", "--head-dim", "8", "--vocab", "61", "--experts", "5", "--experts-per-tok", "2",
                                 "--moe-intermediate", "12", "--batch", "2", "--seq", "23", "--dtype", "bfloat16"]

# The load-balancing loss (transformers' load_balancing_loss_func, output_router_logits): cases that add it with
# this coefficient -- both sides get --moe-aux-loss-coef and compare the total loss -- on right-padded rows
# (attention_mask 0 at the padding, which the loss leaves out). 1.0 and 20, not the configs' 0.001: the aux gradient
# must be as large as the cross-entropy's in the router (checked: the reference with and without it differ there).
CASES["qwen3_moe_aux_padded"] = CASES["qwen3_moe"] + ["--pad", "7"]
# Qwen3.5-MoE text with unpacked rows (padding needs them) of 41 tokens.
CASES["qwen3_5_moe_text_aux_padded"] = CASES["qwen3_5_moe_text"][:-6] + ["--batch", "2", "--seq", "41", "--pad", "9"]
# A released-form checkpoint: MXFP4 experts (uint8 *_blocks / *_scales, quantization_config mxfp4), everything else
# bf16; blocks of 32 inputs need hidden and the expert size multiples of 32.
CASES["gpt_oss_mxfp4"] = ["--arch", "gpt_oss", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "2",
                          "--head-dim", "8", "--vocab", "61", "--experts", "4", "--experts-per-tok", "2",
                          "--moe-intermediate", "32", "--batch", "2", "--seq", "19", "--dtype", "bfloat16", "--mxfp4"]
# GPT-OSS with its load-balancing loss (the logits' softmax over all experts, as transformers' GptOssForCausalLM
# passes router_logits) on rows padded by 6.
CASES["gpt_oss_aux_padded"] = CASES["gpt_oss_bf16_weights"] + ["--pad", "6"]
AUX_COEF = {"qwen3_moe_aux_padded": 1.0, "qwen3_5_moe_text_aux_padded": 20.0, "gpt_oss_aux_padded": 5.0}
# LoRA (tests/reference/lora.py, src/model/lora.h): a random PEFT adapter (B not zero) on a base case; both sides run
# `grad --adapter` and compare the loss and the adapter's gradients (and those of the modules it trains whole). Odd
# ranks, every target kind (the attention, Gated DeltaNet and MLP projections), rsLoRA, dropout by LazyTrain's mask.
LORA = {
    "qwen3_lora": ("qwen3_untied", ["--r", "3", "--alpha", "5", "--modules-to-save", "norm"]),
    "llama_bias_lora": ("llama_bias", ["--r", "1", "--alpha", "2", "--dropout", "0.3", "--targets",
                                       "q_proj,v_proj,down_proj", "--modules-to-save", "embed_tokens,lm_head"]),
    "qwen3_5_text_lora": ("qwen3_5_text", ["--r", "5", "--alpha", "7", "--rslora", "--dropout", "0.1", "--targets",
                                           "q_proj,k_proj,v_proj,o_proj,in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,"
                                           "out_proj,gate_proj,up_proj,down_proj"]),
    # Qwen3-MoE: the router (gate), each routed expert's three projections (dropout masks on each expert's token
    # rows) and the dense layer's MLP; Qwen3.5-MoE: the shared expert and its gate too, rsLoRA.
    "qwen3_moe_lora": ("qwen3_moe", ["--r", "3", "--alpha", "6", "--dropout", "0.2", "--targets",
                                     "q_proj,k_proj,v_proj,o_proj,gate,gate_proj,up_proj,down_proj"]),
    "qwen3_5_moe_text_lora": ("qwen3_5_moe_text", ["--r", "2", "--alpha", "3", "--rslora", "--dropout", "0.1",
                                                   "--targets", "in_proj_qkv,o_proj,gate,gate_proj,up_proj,down_proj,"
                                                   "shared_expert_gate"]),
}
for name, (base, _) in LORA.items():
    CASES[name] = CASES[base]

BOUNDS = {"f32": (1e-5, 1e-4), "bf16": (1e-2, 5e-2)}
# bf16 GEMMs or storage against the emulating reference (grad --emulate-bf16 / --emulate-bf16-storage); see above:
# loss rel 3e-4; gradients rel-L2 max(2e-2, 0.4 x the case's bf16 noise = the worst rel-L2 of the emulated
# reference to the float64 one over all tensors).
EMULATED_LOSS_RTOL = 3e-4
EMULATED_GRAD_RTOL = 2e-2
EMULATED_NOISE_SHARE = 0.4
# The loose comparison's per-tensor allowance: this factor times that tensor's own bf16 noise.
NOISE_FACTOR = 2.0


def run(cmd):
    """lazytrain as a subprocess; its stdout, or exit naming the command."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
        sys.exit(1)
    return proc.stdout


def reference(argv):
    """torch_reference.py ARGV in this process: (exit status, stdout)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = torch_reference.main(argv)
    return status, out.getvalue()


def run_reference(argv):
    """torch_reference.py ARGV, which must succeed; its stdout."""
    status, out = reference(argv)
    if status != 0:
        sys.stderr.write(f"torch_reference.py {' '.join(argv)} failed ({status}):\n{out}\n")
        sys.exit(1)
    return out


def last_json_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--dtype", default="f32", choices=sorted(BOUNDS))
    ap.add_argument("--activation-dtype", default="auto", choices=["auto", "f32", "bf16"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda-sim"],
                    help="cuda-sim: every op on the CUDA kernels emulated on the CPU")
    ap.add_argument("--policy", help="run lazytrain on the streaming executor with this policy")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--workdir")
    args = ap.parse_args()

    work = args.workdir or tempfile.mkdtemp(prefix=f"lt_check_{args.case}_")
    model = os.path.join(work, "model")
    batch = os.path.join(model, "batch.json")
    storage = args.dtype if args.activation_dtype == "auto" else args.activation_dtype
    # Any bf16 rounding (GEMM operands, activation storage): the reference applies the same roundings too.
    emulate = "bf16" in (args.dtype, storage)
    emulate_flags = (["--emulate-bf16"] if args.dtype == "bf16" else []) + \
        (["--emulate-bf16-storage"] if storage == "bf16" else [])
    run_reference(["make", "--out", model, "--seed", str(args.seed)] + CASES[args.case])
    aux = ["--moe-aux-loss-coef", repr(AUX_COEF[args.case])] if args.case in AUX_COEF else []
    adapter = os.path.join(work, "adapter")
    if args.case in LORA:  # the adapter rides along every grad of both sides

        run_reference(["make-adapter", "--model", model, "--out", adapter, "--seed", str(args.seed)] +
                      LORA[args.case][1])
    adapter_flags = ["--adapter", adapter] if args.case in LORA else []
    ref = last_json_line(run_reference(["grad", "--model", model, "--batch", batch,
                                        "--out", os.path.join(work, "ref.safetensors")] + aux + adapter_flags))
    if aux:
        aux_matters(work, model, batch, ref)
    if emulate:
        ref_bf16 = last_json_line(run_reference(["grad", "--model", model, "--batch", batch] + emulate_flags +
                                                ["--out", os.path.join(work, "ref_bf16.safetensors")] + aux +
                                                adapter_flags))
    ours = last_json_line(run([args.lazytrain, "grad", "--model", model, "--batch", batch,
                               "--out", os.path.join(work, "ours.safetensors"),
                               "--dtype", args.dtype, "--activation-dtype", args.activation_dtype,
                               "--device", args.device] + (["--policy", args.policy] if args.policy else []) + aux +
                              adapter_flags))
    if aux:
        print(f"load-balancing loss: lazytrain {ours['aux_loss']:.9g} torch {ref['aux_loss']:.9g}; cross-entropy "
              f"lazytrain {ours['ce_loss']:.9g} torch {ref['ce_loss']:.9g}")
    if ours["tokens"] != ref["tokens"]:
        sys.exit(f"counted tokens differ: lazytrain {ours['tokens']} vs torch {ref['tokens']}")
    loss_rtol, grad_rtol = BOUNDS["bf16" if "bf16" in (args.dtype, storage) else "f32"]
    failed = []
    if emulate:
        noise, noise_name = bf16_noise(work)
        loss_noise = abs(ref_bf16["loss"] - ref["loss"]) / abs(ref["loss"])
        e_grad = max(EMULATED_GRAD_RTOL, EMULATED_NOISE_SHARE * noise)
        print(f"bf16 rounding noise (emulated bf16 vs float64 reference): worst rel-L2 {noise:.3e} ({noise_name}), "
              f"loss rel {loss_noise:.3e}")
        print(f"== against the reference with LazyTrain's bf16 roundings (grad {' '.join(emulate_flags)}), rel-L2 "
              f"{e_grad:.2e} = max({EMULATED_GRAD_RTOL:.0e}, {EMULATED_NOISE_SHARE:g} x {noise:.2e}), "
              f"loss {EMULATED_LOSS_RTOL:.0e}")
        if not compare(work, "ref_bf16.safetensors", e_grad, ours["loss"], ref_bf16["loss"], EMULATED_LOSS_RTOL):
            failed.append("emulated bf16")
        print(f"== against the float64 reference, rel-L2 {grad_rtol:.0e} or {NOISE_FACTOR:g} x the emulated "
              f"reference's own distance to it, loss {loss_rtol:.0e}")
        extra = ["--widen-by", os.path.join(work, "ref_bf16.safetensors"), "--widen-factor", repr(NOISE_FACTOR)]
        if not compare(work, "ref.safetensors", grad_rtol, ours["loss"], ref["loss"], loss_rtol, extra):
            failed.append("float64")
    elif not compare(work, "ref.safetensors", grad_rtol, ours["loss"], ref["loss"], loss_rtol):
        failed.append("float64")
    if failed:
        sys.exit(f"{args.case} [{args.dtype}, activations {storage}, {args.device}]: FAIL against the "
                 f"{' and the '.join(failed)} reference (work directory {work})")
    print(f"{args.case} [{args.dtype}, activations {storage}, {args.device}]: loss lazytrain {ours['loss']:.9g} "
          f"torch {ref['loss']:.9g}" + (f" (emulated bf16 {ref_bf16['loss']:.9g})" if emulate else "") + ": pass")


def aux_matters(work, model, batch, ref):
    """A case with the load-balancing loss must be one where leaving it out shows: the float64 reference without it
    differs from the one with it, in every sparse layer's router gradient, by 10x the loosest gradient bound."""
    plain = os.path.join(work, "ref_no_aux.safetensors")
    run_reference(["grad", "--model", model, "--batch", batch, "--out", plain])
    with_aux = read_safetensors(os.path.join(work, "ref.safetensors"))[0]
    without = read_safetensors(plain)[0]
    routers = [n for n in with_aux if n.endswith("mlp.gate.weight") or n.endswith("mlp.router.weight")]
    if not routers:
        sys.exit("aux case without a router gradient")
    least = min(torch_reference.rel_l2(with_aux[n], without[n]) for n in routers)
    if least < 10 * BOUNDS["bf16"][1]:
        sys.exit(f"the load-balancing loss changes the router gradients by only {least:.2e} rel-L2: the case cannot "
                 f"tell it from its absence")
    print(f"the load-balancing loss changes every router gradient by >= {least:.2e} rel-L2 (aux {ref['aux_loss']:.6g})")


def bf16_noise(work):
    """(worst rel-L2, its tensor) of the emulated-bf16 reference gradients against the float64 ones."""
    emu = read_safetensors(os.path.join(work, "ref_bf16.safetensors"))[0]
    f64 = read_safetensors(os.path.join(work, "ref.safetensors"))[0]
    return max((torch_reference.rel_l2(emu[n], f64[n]), n) for n in f64)


def compare(work, ref_name, grad_rtol, loss_ours, loss_ref, loss_rtol, extra=()):
    """torch_reference.py compare of ours.safetensors against work/ref_name; prints its table; True on a pass."""
    status, out = reference(["compare", "--ours", os.path.join(work, "ours.safetensors"),
                             "--ref", os.path.join(work, ref_name), "--rtol-l2", repr(grad_rtol),
                             "--loss-ours", repr(loss_ours), "--loss-ref", repr(loss_ref),
                             "--loss-rtol", repr(loss_rtol)] + list(extra))
    print(out)
    if status not in (0, 1):
        sys.exit(f"compare failed ({status})")
    return status == 0


if __name__ == "__main__":
    main()
