"""Model registry: `create_model(name, **kwargs)`, `list_models(pattern)`, and
`convert_weights` (a registered model's `.weights.h5` from a PyTorch checkpoint)."""

import fnmatch
import os
from collections.abc import Callable, Mapping
from typing import Any

import keras

from keras_mvit2.utils.files import atomic_output
from keras_mvit2.weights import load_torch_weights, read_torch_state_dict

_MODEL_BUILDERS: dict[str, Callable[..., keras.Model]] = {}


def register_model(builder: Callable[..., keras.Model]) -> Callable[..., keras.Model]:
    """Decorator: registers `builder` under its function name."""
    name = builder.__name__
    if name in _MODEL_BUILDERS:
        raise ValueError(f"A model named {name!r} is already registered.")
    _MODEL_BUILDERS[name] = builder
    return builder


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style `pattern`, sorted."""
    return sorted(n for n in _MODEL_BUILDERS if fnmatch.fnmatch(n, pattern))


def create_model(name: str, **kwargs) -> keras.Model:
    """Builds the registered model `name`; `kwargs` go to its builder.

    Example: `create_model("mobilevitv2_050", weights="mobilevitv2-0.5.pt")`.
    """
    if name not in _MODEL_BUILDERS:
        close = fnmatch.filter(_MODEL_BUILDERS, f"*{name.split('_')[0]}*")
        hint = f" Did you mean one of {sorted(close)}?" if close else ""
        raise ValueError(
            f"Unknown model {name!r}.{hint} `keras_mvit2.list_models()` lists them all."
        )
    return _MODEL_BUILDERS[name](**kwargs)


def convert_weights(
    src: str | os.PathLike | Mapping[str, Any],
    dst: str | os.PathLike,
    model: str = "mobilevitv2_100",
    **model_kwargs: Any,
) -> keras.Model:
    """Converts a PyTorch checkpoint into a Keras `.weights.h5` file.

    Builds `keras_mvit2.create_model(model, **model_kwargs)`, ports `src` into it
    with `keras_mvit2.weights.load_torch_weights` and saves the weights to `dst`
    atomically (a failure leaves no partial file and keeps an existing `dst`).

    Args:
        src: PyTorch checkpoint path (or state dict), see `load_torch_weights`.
        dst: output path; must end with `.weights.h5`.
        model: registered model name, e.g. `"mobilevitv2_050"` or `"deit_tiny"`.
        **model_kwargs: passed to the builder (`classes`, `include_top`,
            `input_shape`, ...). `weights` is not allowed.

    Returns:
        The ported Keras model.
    """
    dst_path = os.fspath(dst)
    if not dst_path.endswith(".weights.h5"):
        raise ValueError(
            f"dst must end with '.weights.h5' (Keras' weights format). Received: dst={dst_path!r}"
        )
    if "weights" in model_kwargs:
        raise ValueError("convert_weights builds the model without weights; do not pass weights=.")
    state_dict = read_torch_state_dict(src)  # fail fast, before building a model
    keras_model = create_model(model, **model_kwargs)
    load_torch_weights(keras_model, state_dict)
    with atomic_output(dst_path) as tmp:
        keras_model.save_weights(tmp)
    return keras_model
