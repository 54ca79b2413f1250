"""Test helpers shared by several test modules."""

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
