"""The training checks' common setting: a temporary directory with the arithmetic demo's data and model
config (examples/arith/make_data.py), the demo's YAML config, and the overrides that point it there."""
import contextlib
import json
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples/arith/config.yaml")


@contextlib.contextmanager
def arith_work(prefix, train, test):
    """Yields (work directory, overrides naming its model and data); removes the directory afterwards."""
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/arith/make_data.py"), work, "--train",
                        str(train), "--test", str(test)], check=True, capture_output=True)
        yield work, [f"model_name_or_path={work}/model/config.json", f"dataset_dir={work}/data"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def gpt_oss_model(work):
    """A GPT-OSS of the MoE demo's sizes in work/model_gpt_oss (config.json and the demo's tokenizer): sliding and
    full layers, sinks, YaRN, 8 biased experts of 128 with the clamped SwiGLU, 2 per token. Returns its config.json."""
    with open(os.path.join(work, "model_moe", "config.json")) as f:
        moe = json.load(f)
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "bos_token_id", "eos_token_id", "tie_word_embeddings", "torch_dtype")
    config = {k: moe[k] for k in keep}
    config.update(architectures=["GptOssForCausalLM"], model_type="gpt_oss", intermediate_size=128,
                  num_local_experts=8, num_experts_per_tok=2, sliding_window=32, swiglu_limit=7.0, attention_bias=True,
                  router_aux_loss_coef=0.01, max_position_embeddings=512, rope_theta=150000.0,
                  layer_types=["sliding_attention", "full_attention"] * (moe["num_hidden_layers"] // 2),
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "original_max_position_embeddings": 128, "truncate": False})
    out = os.path.join(work, "model_gpt_oss")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(work, "model_moe", name), os.path.join(out, name))
    return os.path.join(out, "config.json")
