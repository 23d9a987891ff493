"""The training checks' common setting: a temporary directory with the arithmetic demo's data and model
config (examples/arith/make_data.py), the demo's YAML config, and the overrides that point it there."""
import contextlib
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
