"""A Keras 3 model moved to its tf_keras twin and back (see `tf_keras_twin`).

* Weights, by variable path: `transfer_weights` copies Keras 3 weights into the twin
  (one-to-one, shapes checked), `twin_weight_paths` names the twin's variables the Keras 3
  way, `keras3_weights` / `assign_keras3_weights` read and write a Keras 3 model's weights by
  path (the twin's trained weights coming back).
* The model's files for the worker (`write_model_files`: spec, weights, reference outputs)
  and `twin_outputs`, the twins' outputs computed in the worker (the oracle that a twin is
  the same model).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from keras_mvit2.quantize.tf_keras_twin import TwinError, model_spec

__all__ = [
    "assign_keras3_weights",
    "keras3_weights",
    "output_is_probabilities",
    "transfer_weights",
    "twin_outputs",
    "twin_weight_paths",
    "write_model_files",
]

#: Keras 3 weight names that tf_keras spells differently (same shape and meaning).
_WEIGHT_NAME_ALIASES = {"depthwise_kernel": "kernel"}


def _normalize(name: str) -> str:
    name = name.split(":", 1)[0]
    head, _, last = name.rpartition("/")
    last = _WEIGHT_NAME_ALIASES.get(last, last)
    return f"{head}/{last}" if head else last


def twin_weight_paths(twin) -> dict[str, Any]:
    """Keras-3-style path -> tf_keras variable, for every weight of the twin.

    The path is ``<top-level layer name>/<path inside the layer>``, the same as
    Keras 3's ``variable.path`` for the same model.
    """
    out: dict[str, Any] = {}
    for layer in twin.layers:
        for var in layer.weights:
            name = _normalize(var.name)
            marker = layer.name + "/"
            rel = name[name.index(marker) + len(marker):] if marker in name else name
            path = f"{layer.name}/{rel}"
            if path in out and out[path] is not var:
                raise TwinError(
                    f"Two variables of the tf_keras twin map to the same path {path!r}; the "
                    "weights cannot be transferred by name."
                )
            out[path] = var
    return out


def transfer_weights(twin, weights: Mapping[str, Any]) -> int:
    """Assigns Keras 3 weights (path -> array) to the twin; every weight exactly once.

    Returns the number of arrays assigned.

    Raises:
        TwinError: a weight is missing on either side or has another shape.
    """
    targets = twin_weight_paths(twin)
    missing = sorted(set(weights) - set(targets))
    extra = sorted(set(targets) - set(weights))
    if missing or extra:
        raise TwinError(
            "The tf_keras twin's weights do not match the Keras 3 model's. "
            f"Only in Keras 3: {missing[:8]}{' ...' if len(missing) > 8 else ''}; "
            f"only in the twin: {extra[:8]}{' ...' if len(extra) > 8 else ''}."
        )
    for path, value in weights.items():
        var = targets[path]
        if tuple(var.shape) != tuple(value.shape):
            raise TwinError(
                f"Weight {path!r}: shape {tuple(value.shape)} in Keras 3, {tuple(var.shape)} in "
                "the tf_keras twin."
            )
        var.assign(value)
    return len(weights)


def keras3_weights(model) -> dict[str, Any]:
    """Keras 3 model -> ``{variable.path: numpy array}`` (every weight, unique paths)."""
    out: dict[str, Any] = {}
    for var in model.weights:
        path = var.path
        if path in out:
            raise TwinError(
                f"The Keras 3 model has two weights with the path {path!r}; give its layers "
                "unique names."
            )
        out[path] = var.numpy()
    return out


def assign_keras3_weights(model, weights: Mapping[str, Any], paths: Iterable[str] | None = None):
    """Assigns ``{path: array}`` to a Keras 3 model (all of its weights, or `paths`)."""
    by_path = {var.path: var for var in model.weights}
    for path in (weights if paths is None else paths):
        var = by_path.get(path)
        if var is None:
            raise TwinError(f"The Keras 3 model has no weight {path!r}.")
        value = weights[path]
        if tuple(var.shape) != tuple(value.shape):
            raise TwinError(
                f"Weight {path!r}: shape {tuple(value.shape)} from the worker, "
                f"{tuple(var.shape)} in the Keras 3 model."
            )
        var.assign(value)


# --------------------------------------------------------------------------------------
# Parent side: the model's files for the worker


def output_is_probabilities(model) -> bool:
    """True when the model ends with a softmax (then the loss gets probabilities)."""
    layer = model.layers[-1]
    activation = getattr(layer, "activation", None)
    name = getattr(activation, "__name__", "") or ""
    return name == "softmax" or type(layer).__name__ == "Softmax"



def write_model_files(model, workdir: str, reference_images: np.ndarray,
                      prefix: str = "") -> dict[str, Any]:
    """spec.json, weights.npz and reference.npz for the worker; returns the job's ``model``."""
    import json

    import numpy as np

    spec = model_spec(model)
    weights = keras3_weights(model)
    paths = list(weights)
    spec_path = os.path.join(workdir, f"{prefix}spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    weights_path = os.path.join(workdir, f"{prefix}weights.npz")
    np.savez(weights_path, **{f"w{i}": weights[p] for i, p in enumerate(paths)})
    ref = np.ascontiguousarray(reference_images[:8], np.float32)
    outputs = np.asarray(model(ref, training=False))
    ref_path = os.path.join(workdir, f"{prefix}reference.npz")
    np.savez(ref_path, x=ref, y=outputs)
    return {
        "spec": spec_path,
        "weights": weights_path,
        "weight_paths": paths,
        "reference": ref_path,
        "probabilities": output_is_probabilities(model),
        "num_classes": int(model.outputs[0].shape[-1]),
    }


# --------------------------------------------------------------------------------------
# Parent side: run twins in the worker


def twin_outputs(models, images, *, verbose: bool = False,
                 timeout: float | None = None) -> list[Any]:
    """Outputs of the tf_keras twins of Keras 3 `models` on `images`, from the worker process.

    Builds each twin exactly as `keras_mvit2.quantize.qat` does (same layer code
    on tf_keras, weights transferred by path) and returns its ``predict``
    outputs, so a caller can compare them with the Keras 3 model's: the oracle
    that the twin is the same model.

    Args:
        models: a Keras 3 model or a list of them (one worker process for all).
        images: float32 images `(N, H, W, C)` in [0, 1] (the same for every model).
        verbose: stream the worker's output.
        timeout: worker time limit in seconds.

    Returns:
        One float32 array per model.
    """
    import numpy as np

    from keras_mvit2.quantize import _worker_client, _worker_common

    single = not isinstance(models, list | tuple)
    models = [models] if single else list(models)
    images = np.ascontiguousarray(images, np.float32)
    with _worker_client.temporary_workdir("twin") as workdir:
        job = {
            "images": _worker_common.save_arrays(os.path.join(workdir, "images.npz"), images),
            "models": [
                write_model_files(m, workdir, images, prefix=f"m{i}_")
                for i, m in enumerate(models)
            ],
        }
        result = _worker_client.run_worker("twin", job, workdir, verbose=verbose, timeout=timeout)
        outputs = []
        for entry in result["models"]:
            with np.load(entry["outputs"]) as data:
                outputs.append(data["y"])
    return outputs
