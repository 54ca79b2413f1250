"""What every `.mlpackage` of ours carries, whichever road converted it.

Both roads to a Core ML ML Program (`keras_mvit2.export.roads`: `to_coreml` from the
TensorFlow graph, `to_coreml_via_torch` from ``torch.export``) check their arguments, declare
the input, name the output and write the metadata with these functions, so the two files
describe themselves alike (one implementation per idea). TensorFlow-free: the PyTorch road
imports it in a process where TensorFlow must not be loaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import keras

from keras_mvit2.export.class_names import check_class_names
from keras_mvit2.models.input_size import has_dynamic_size, with_input_size

__all__ = [
    "COMPUTE_UNITS_GUIDANCE",
    "DEPLOYMENT_TARGETS",
    "PRECISIONS",
    "add_metadata",
    "checked_arguments",
    "compression_info",
    "input_types",
    "is_probability_output",
    "model_metadata",
    "with_output_name",
]

PRECISIONS = ("float16", "float32")
DEPLOYMENT_TARGETS = ("iOS16", "iOS17", "iOS18", "macOS13", "macOS14", "macOS15")
#: Written into every package's metadata (``keras_mvit2.compute_units``); the same advice
#: as harness/README.md (section 3), whose Swift harness measures each MLComputeUnits value.
COMPUTE_UNITS_GUIDANCE = (
    "Try MLComputeUnits .cpuAndNeuralEngine first (an fp16 program with no layout "
    "transposes is the Neural Engine's case), then .all (Core ML's default), .cpuAndGPU, "
    "and .cpuOnly as the baseline; keep the fastest on the target phone. harness/ios "
    "measures each: swift run -c release mvit2-coreml-bench MODEL.mlpackage "
    "--compute-units cpu_only cpu_and_gpu cpu_and_ne all (Mac), or the "
    "MViT2DeviceBenchmarks XCTest with TEST_RUNNER_MVIT2_COMPUTE_UNITS (iPhone); "
    "see harness/README.md, section 3."
)


def is_probability_output(model: keras.Model) -> bool:
    """Whether the model ends in a softmax (its outputs are probabilities)."""
    activation = getattr(model.layers[-1], "activation", None)
    return getattr(activation, "__name__", "") == "softmax"


def checked_arguments(
    model: keras.Model,
    path: str,
    *,
    quantization: str,
    weight_compression: str | None,
    minimum_deployment_target: str,
    image_size: int | tuple[int, int] | None,
    image_input: bool,
    class_names: Sequence[str] | None,
) -> tuple[keras.Model, tuple[int, ...], list[str] | None]:
    """Checks a Core ML export's arguments (ValueError on the first bad one).

    Args:
        model: the Keras model, input ``(batch, H, W, C)`` (``(None, None, 3)`` is
            exported at `image_size`).
        path: the destination; must end in ``.mlpackage``.
        quantization: the numeric format, one of `PRECISIONS`.
        weight_compression: the compression asked (checked by `compress.check_compression`).
        minimum_deployment_target: one of `DEPLOYMENT_TARGETS`.
        image_size: the size to export a dynamic-size model at.
        image_input: the input is declared an RGB image (needs 3 channels).
        class_names: one name per output class, or None.

    Returns:
        The model to convert, its input shape ``(height, width, channels)`` and the class
        names (None: no classifier).
    """
    if not path.endswith(".mlpackage"):
        raise ValueError(f"A Core ML ML Program is saved as .mlpackage. Received: path={path!r}")
    if quantization not in PRECISIONS:
        raise ValueError(
            f"quantization must be one of {PRECISIONS}. Received: quantization={quantization!r}"
        )
    if minimum_deployment_target not in DEPLOYMENT_TARGETS:
        raise ValueError(
            f"minimum_deployment_target must be one of {DEPLOYMENT_TARGETS}. "
            f"Received: minimum_deployment_target={minimum_deployment_target!r}"
        )
    model, shape = fixed_size_model(model, image_size, "Core ML")
    if image_input and shape[-1] != 3:
        raise ValueError(
            f"image_input=True needs 3 RGB channels. Received: input shape {shape}; "
            "pass image_input=False for other inputs."
        )
    class_names = check_class_names(class_names, model)
    output_shape = tuple(model.output_shape)
    if class_names is not None and len(output_shape) != 2:
        raise ValueError(
            "class_names makes a Core ML classifier, which needs a model with one output "
            f"of shape (batch, classes). Received: output shape {output_shape}"
        )
    return model, shape, class_names


def fixed_size_model(model: keras.Model, image_size: int | tuple[int, int] | None,
                     what: str) -> tuple[keras.Model, tuple[int, ...]]:
    """`model` with a fixed input (`with_input_size` for a dynamic model or an `image_size`)
    and its input shape ``(height, width, channels)``; a ValueError naming `what` (the
    format) for any other input."""
    if image_size is not None or has_dynamic_size(model):
        model = with_input_size(model, image_size)
    shape = tuple(model.input_shape[1:])
    if len(shape) != 3 or None in shape:
        raise ValueError(
            f"{what} export needs a fixed (height, width, channels) input. Received: {shape}"
        )
    return model, shape


def input_types(ct: Any, shape: tuple[int, ...], image_input: bool) -> list[Any]:
    """The program's one input ``"image"``, batch 1, channels-last ``(1, H, W, 3)``: an RGB
    image scaled by 1/255 (the model's `preprocess_input`; an app passes a
    ``CVPixelBuffer``), or with `image_input` False a float tensor in [0, 1]."""
    if image_input:
        return [ct.ImageType(name="image", shape=(1, *shape), scale=1.0 / 255.0,
                             color_layout=ct.colorlayout.RGB, channel_first=False)]
    return [ct.TensorType(name="image", shape=(1, *shape))]


def compression_info(weight_compression: str | None, bits: int, granularity: str,
                     group_size: int, activation_quantization: str | None) -> dict:
    """The ``keras_mvit2.compression`` metadata: what was compressed, and how."""
    info: dict = {"weight_compression": weight_compression,
                  "activation_quantization": activation_quantization}
    if weight_compression == "palettize":
        info.update(palettize_bits=bits, palettize_granularity=granularity)
        if granularity == "per_grouped_channel":
            info["palettize_group_size"] = group_size
    return info


def with_output_name(ct: Any, mlmodel: Any, model: keras.Model) -> Any:
    """`mlmodel` with its output named ``"probabilities"`` (softmax models) or
    ``"output"``."""
    spec = mlmodel.get_spec()
    old = spec.description.output[0].name
    new = "probabilities" if is_probability_output(model) else "output"
    ct.utils.rename_feature(spec, old, new)
    return ct.models.MLModel(spec, weights_dir=mlmodel.weights_dir, skip_model_load=True)


def model_metadata(model: keras.Model, shape: tuple[int, ...]) -> dict[str, str]:
    """What every Apple file of ours says about its model (Core ML and Core AI):
    ``keras_mvit2.version``, ``.model``, ``.attention`` and ``.preprocessing`` (JSON: RGB,
    scale 1/255, input shape ``(H, W, 3)``)."""
    from keras_mvit2._version import __version__
    from keras_mvit2.layers.attention_registry import names_in

    return {
        "keras_mvit2.version": __version__,
        "keras_mvit2.model": model.name,
        "keras_mvit2.attention": ",".join(names_in(model)),
        "keras_mvit2.preprocessing": json.dumps(
            {"color": "RGB", "scale": 1.0 / 255.0, "input_shape": list(shape)}
        ),
    }


def add_metadata(mlmodel: Any, model: keras.Model, shape: tuple[int, ...], precision: str,
                 weight_compression: str | None, fusions: Sequence[Any],
                 metadata: dict[str, str] | None) -> None:
    """Writes the description and the keras_mvit2 metadata (then the user's) into
    `mlmodel`: `model_metadata`, ``keras_mvit2.precision``, ``.weight_compression``,
    ``.pointwise_fusions`` (JSON: the fused 1x1 convolution pairs), ``.forms`` (JSON: the
    export forms traced, `keras_mvit2.export.coreml.layout.coreml_forms_entry`) and
    ``.compute_units``."""
    from keras_mvit2._version import __version__
    from keras_mvit2.export.coreml.layout import coreml_forms_entry

    mlmodel.short_description = f"{model.name} exported by keras_mvit2 {__version__}"
    info = {
        **model_metadata(model, shape),
        "keras_mvit2.precision": precision,
        "keras_mvit2.weight_compression": str(weight_compression),
        "keras_mvit2.pointwise_fusions": json.dumps(
            [{"channels": list(f.channels), "macs_saved": f.macs_saved} for f in fusions]
        ),
        "keras_mvit2.forms": coreml_forms_entry(),
        "keras_mvit2.compute_units": COMPUTE_UNITS_GUIDANCE,
    }
    info.update(metadata or {})
    mlmodel.user_defined_metadata.update(info)
