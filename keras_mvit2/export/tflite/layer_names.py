"""Which Keras layer a TFLite op belongs to, read from its output tensor's name.

The converter names an op's output tensor after the TensorFlow ops it came from: the name
scopes of the traced call, one per Keras layer (``mobilevitv2_050_1/stage3_block1_1/
transformer_0_1/attn_1/MatMul``), and, for ops the converter fused (a convolution with its
batch norm, a bias add, ...), several such names joined by ``;``. The rule used here:

* each ``;``-separated part maps to a **layer path**: its name scopes matched against the
  model's layer names, TF's ``_<n>`` suffixes stripped, the model's own scope dropped
  (`keras_mvit2.export.tflite.diagnose._layer_path`), nested layers joined by ``/``
  (``"stage3_block1/transformer_0/attn"``; a top-level layer is just its name,
  ``"stem_conv"``);
* an op **belongs to** the first of its parts' layers that holds a kernel (a convolution or
  dense layer: a batch norm folded into its convolution is reported as the convolution),
  else to the first part's layer; the ops that write the traced function's outputs
  (``Identity``, ``Identity_1``, ... and nothing else) belong to the layers that produce
  the model's outputs (the classifier's ``predictions``); an op whose parts map to no
  layer keeps its tensor name;
* an op is **selected** by a layer path ``p`` (`float_layers`) when any of its parts maps
  to ``p`` or to a layer nested in ``p`` (``"stage3_block1"`` selects every op of that
  block, ``"stem_bn"`` the convolution it was folded into).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

import keras

from keras_mvit2.export.tflite.diagnose import _layer_names, _layer_path

__all__ = ["LayerNames", "check_layer_names", "layer_paths"]


def layer_paths(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """Every layer inside `model` by its path: ``{"stem_conv": ..., "stage3_block1": ...,
    "stage3_block1/transformer_0/attn": ...}`` (the model itself not included)."""
    paths: dict[str, keras.layers.Layer] = {}

    def visit(layer: keras.layers.Layer, prefix: str) -> None:
        for child in layer._flatten_layers(include_self=False, recursive=False):
            path = f"{prefix}{child.name}"
            if path in paths:
                continue
            paths[path] = child
            visit(child, path + "/")

    visit(model, "")
    return paths


def check_layer_names(names: Iterable[str], model: keras.Model, *, what: str) -> list[str]:
    """`names` as a list of known layer paths of `model`; a ValueError naming each unknown
    one with its closest matches otherwise (`what` names the argument in the message)."""
    if isinstance(names, str):
        raise ValueError(
            f"{what} must be a list of Keras layer names, not one string. Received: "
            f"{what}={names!r}; write ({names!r},)."
        )
    names = list(names)
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what} must hold non-empty layer names. Received: {names!r}")
    known = layer_paths(model)
    unknown = [n for n in names if n not in known]
    if unknown:
        lines = []
        for name in unknown:
            close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.5)
            if not close:  # a leaf name such as "attn": the paths that end in it
                close = [p for p in known if p.rsplit("/", 1)[-1] == name][:5]
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            lines.append(f"{name!r}{hint}")
        raise ValueError(
            f"{what} names layers that model {model.name!r} does not have: "
            f"{'; '.join(lines)}. Use layer paths as `layer_errors` prints them: a top-level "
            "layer by its name ('stem_conv', 'stage3_block1'), a nested one with '/' "
            "('stage3_block1/transformer_0/attn')."
        )
    return names


class LayerNames:
    """Maps the TFLite tensor names of a converted `model` to its Keras layer paths."""

    def __init__(self, model: keras.Model):
        self.model_name = model.name
        self._known = _layer_names(model)
        self._paths = layer_paths(model)
        self._cache: dict[str, list[str]] = {}
        self._outputs = {}
        for i, output in enumerate(getattr(model, "outputs", None) or []):
            history = getattr(output, "_keras_history", None)
            layer = getattr(history, "operation", None) if history is not None else None
            if layer is not None and layer.name in self._paths:
                self._outputs["Identity" if i == 0 else f"Identity_{i}"] = layer.name

    def parts(self, tensor_name: str) -> list[str]:
        """The layer paths of the ``;``-separated parts of `tensor_name`, in order, unique."""
        if tensor_name not in self._cache:
            found: list[str] = []
            if tensor_name in self._outputs:
                found.append(self._outputs[tensor_name])
            for part in tensor_name.split(";"):
                path = _layer_path(part, self._known, self.model_name)
                if path and path not in found:
                    found.append(path)
            self._cache[tensor_name] = found
        return self._cache[tensor_name]

    def owner(self, tensor_name: str) -> str | None:
        """The layer path the op with this output tensor belongs to (None: unmapped)."""
        parts = self.parts(tensor_name)
        for path in parts:
            layer = self._paths.get(path)
            if layer is not None and _has_kernel(layer):
                return path
        return parts[0] if parts else None

    def selected(self, tensor_name: str, chosen: Sequence[str]) -> bool:
        """Whether the op with this output tensor is in (or nested in) a `chosen` layer."""
        return any(
            path == c or path.startswith(c + "/") for path in self.parts(tensor_name)
            for c in chosen
        )


def _has_kernel(layer: keras.layers.Layer) -> bool:
    return any(hasattr(layer, attr) for attr in ("kernel", "depthwise_kernel"))
