#!/usr/bin/python3
"""`lazytrain grad` on bad input: a non-zero exit, no crash (no signal), and exactly one clear line on
stderr that names the problem. One ctest per case: check_grad_errors.py --lazytrain BIN --case NAME."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def make_model(lt, work):
    model = os.path.join(work, "model")
    subprocess.run([lt, "init", "--config", os.path.join(ROOT, "examples/tiny-qwen3/config.json"), "--out", model,
                    "--seed", "3"], check=True, capture_output=True)
    return model


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def batch(work, obj):
    return write(os.path.join(work, "batch.json"), json.dumps(obj))


GOOD = {"input_ids": [[1, 2, 3, 4]], "labels": [[-100, 2, 3, 4]]}


# Each case: (setup(work, model) -> (model_dir, batch_path, extra args), words expected on stderr)
def case_missing_model(work, model):
    return os.path.join(work, "nope"), batch(work, GOOD), [], ["nope"]


def case_invalid_config_json(work, model):
    write(os.path.join(model, "config.json"), '{"model_type": "qwen3", ')
    return model, batch(work, GOOD), [], ["config.json", "JSON"]


def case_unsupported_model_type(work, model):
    cfg = json.load(open(os.path.join(model, "config.json")))
    cfg["model_type"] = "mistral"
    write(os.path.join(model, "config.json"), json.dumps(cfg))
    return model, batch(work, GOOD), [], ["model_type", "mistral"]


def case_truncated_weights(work, model):
    path = os.path.join(model, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return model, batch(work, GOOD), [], ["model.safetensors"]


def case_id_out_of_vocab(work, model):
    return model, batch(work, {"input_ids": [[1, 2, 384]]}), [], ["input_ids[0][2]", "384"]


def case_ragged_rows(work, model):
    return model, batch(work, {"input_ids": [[1, 2, 3], [1, 2]]}), [], ["input_ids[1]", "equal length"]


def case_no_counted_token(work, model):
    return model, batch(work, {"input_ids": [[1, 2, 3]], "labels": [[1, -100, -100]]}), [], ["no counted token"]


def case_missing_batch(work, model):
    return model, os.path.join(work, "absent.json"), [], ["absent.json"]


def case_batch_not_json(work, model):
    return model, write(os.path.join(work, "batch.json"), "input_ids: [[1]]"), [], ["batch.json", "JSON"]


def case_bad_dtype(work, model):
    return model, batch(work, GOOD), ["--dtype", "f64"], ["--dtype"]


def case_aux_loss_on_dense_model(work, model):
    return model, batch(work, GOOD), ["--moe-aux-loss-coef", "0.01"], ["--moe-aux-loss-coef", "Mixture-of-Experts"]


def case_attention_mask_left_padding(work, model):
    b = {"input_ids": [[1, 2, 3, 4]], "labels": [[-100, -100, 3, 4]], "attention_mask": [[0, 1, 1, 1]]}
    return model, batch(work, b), [], ["attention_mask[0][1]", "right padding"]


def case_attention_mask_counted_padding(work, model):
    b = {"input_ids": [[1, 2, 3, 4]], "labels": [[-100, 2, 3, 4]], "attention_mask": [[1, 1, 1, 0]]}
    return model, batch(work, b), [], ["labels[0][3]", "attention_mask is 0"]


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazytrain", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix=f"lt_grad_err_{args.case}_")
    try:
        model = make_model(args.lazytrain, work)
        model_dir, batch_path, extra, words = CASES[args.case](work, model)
        proc = subprocess.run([args.lazytrain, "grad", "--model", model_dir, "--batch", batch_path, "--out",
                               os.path.join(work, "g.safetensors")] + extra, capture_output=True, text=True)
        err = proc.stderr.strip()
        lines = err.splitlines()
        problems = []
        if proc.returncode <= 0:
            problems.append(f"exit status {proc.returncode} (expected a positive error status, not a signal)")
        if len(lines) != 1 and "--dtype" not in extra:
            problems.append(f"{len(lines)} stderr lines (expected exactly one)")
        for w in words:
            if w not in err:
                problems.append(f"stderr does not mention {w!r}")
        if os.path.exists(os.path.join(work, "g.safetensors")):
            problems.append("a gradient file was written despite the error")
        print(f"{args.case}: exit {proc.returncode}, stderr: {err}")
        if problems:
            sys.exit("FAIL: " + "; ".join(problems))
        print("pass")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
