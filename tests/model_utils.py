"""Test helpers shared by several test modules."""

import importlib.util
import json
import os
import subprocess
import sys

import keras
import numpy as np


def perturb_norms(model: keras.Model, seed: int = 0) -> None:
    """Random BN statistics and affine parameters, so norms are really exercised."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        name = w.path.rsplit("/", 1)[-1]
        n = w.shape
        if name == "moving_mean":
            w.assign(rng.normal(0.0, 0.2, n).astype("float32"))
        elif name == "moving_variance":
            w.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
        elif name == "gamma":
            w.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
        elif name == "beta":
            w.assign(rng.normal(0.0, 0.2, n).astype("float32"))


TORCH_READY = all(
    importlib.util.find_spec(m) is not None for m in ("torch", "timm", "safetensors")
)


def run_timm_oracle(out_dir, models: str) -> dict:
    """Runs tests/timm_oracle_v1_vit.py in a subprocess (torch and TF must not share a
    process) for `models` ("name:HxW+HxW,..."); returns its manifest."""
    script = os.path.join(os.path.dirname(__file__), "timm_oracle_v1_vit.py")
    result = subprocess.run(
        [sys.executable, script, "--out-dir", str(out_dir), "--models", models],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(str(out_dir), "manifest.json")) as f:
        return json.load(f)

