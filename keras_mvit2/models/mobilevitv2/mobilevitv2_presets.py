"""MobileViTv2's published ImageNet checkpoints: the one table of them, and the same rows
as KerasHub presets.

Where each checkpoint lives, its input size and evaluation transform, and its published
top-1. The builders' `weights=` tags (`find_weights`), `finetune`'s weights
(`keras_mvit2.models.weights_source`) and KerasHub's `from_preset` names
(`PretrainedWeights.preset`, `find_preset`; `PRESETS` describes the same rows in KerasHub's
format) all read it.

Sources (see docs/pretrained.md): timm's copies of Apple's checkpoints on the Hugging
Face hub (`timm/<model>.<tag>`, `model.safetensors`; `timm/models/mobilevit.py`
pretrained cfgs; top-1 from timm's `results/results-imagenet.csv`) and Apple's own
files (ml-cvnets `README-model-zoo.md`) for the ImageNet-1k 384x384 fine-tunes, which
timm does not carry. File sizes are those shown by the hub; Apple publishes none.
"""

from __future__ import annotations

import math

from keras_mvit2.weights.pretrained import APPLE_BASE_URL, PretrainedWeights

__all__ = [
    "PRESETS",
    "PRETRAINED_WEIGHTS",
    "PresetsProperty",
    "check_pretrained_config",
    "find_preset",
    "find_weights",
    "is_weights_tag",
    "list_weights",
    "model_name_for_width",
]

_WIDTHS = {
    "mobilevitv2_050": 0.5, "mobilevitv2_075": 0.75, "mobilevitv2_100": 1.0,
    "mobilevitv2_125": 1.25, "mobilevitv2_150": 1.5, "mobilevitv2_175": 1.75,
    "mobilevitv2_200": 2.0,
}


# timm results-imagenet.csv top-1 and hub safetensors sizes (MB), per model.
_IN1K = {
    "mobilevitv2_050": (70.156, 5.54), "mobilevitv2_075": (75.612, 11.5),
    "mobilevitv2_100": (78.088, 19.7), "mobilevitv2_125": (79.682, 30.0),
    "mobilevitv2_150": (80.380, 42.5), "mobilevitv2_175": (80.870, 57.1),
    "mobilevitv2_200": (81.148, 73.9),
}
_IN22K = {
    "mobilevitv2_150": (81.466, 42.5), "mobilevitv2_175": (81.950, 57.1),
    "mobilevitv2_200": (82.320, 73.9),
}
_IN22K_384 = {
    "mobilevitv2_150": (82.606, 42.5), "mobilevitv2_175": (82.920, 57.1),
    "mobilevitv2_200": (83.430, 73.9),
}
# Apple's model zoo (README-model-zoo.md) top-1 of the ImageNet-1k 384x384 fine-tunes.
_APPLE_IN1K_384 = {
    "mobilevitv2_050": 72.14, "mobilevitv2_075": 76.98, "mobilevitv2_100": 79.68,
    "mobilevitv2_125": 80.94, "mobilevitv2_150": 81.50, "mobilevitv2_175": 82.04,
    "mobilevitv2_200": 82.17,
}

_TIMM_TOP1 = "timm results-imagenet.csv"
_TIMM_CROP = 0.888  # timm's crop_pct: 256 / 0.888 -> 288, as ml-cvnets' resize 288


def _timm(model: str, tag: str, timm_tag: str, size: int, crop: float, top1: float,
          size_mb: float, trained_on: str) -> PretrainedWeights:
    return PretrainedWeights(
        model=model, tag=tag, width_multiplier=_WIDTHS[model], source="timm",
        location=f"timm/{model}.{timm_tag}", filename="model.safetensors", timm_tag=timm_tag,
        input_size=size, crop_pct=crop, interpolation="bicubic", top1=top1,
        top1_source=_TIMM_TOP1, file_size_mb=size_mb, trained_on=trained_on,
    )


def _apple_384(model: str) -> PretrainedWeights:
    width = _WIDTHS[model]
    name = f"mobilevitv2-{width}.pt"  # str(float): 0.5, 0.75, 1.0, ... 2.0 as in the zoo
    return PretrainedWeights(
        model=model, tag="imagenet_384", width_multiplier=width, source="apple",
        location=f"{APPLE_BASE_URL}/imagenet1k/384x384/{name}",
        filename=f"imagenet1k-384x384-{name}", timm_tag=None, input_size=384, crop_pct=1.0,
        interpolation="bicubic", top1=_APPLE_IN1K_384[model],
        top1_source="Apple ml-cvnets model zoo", file_size_mb=None,
        trained_on="ImageNet-1k, fine-tuned at 384x384",
    )


def _build_table() -> tuple[PretrainedWeights, ...]:
    rows = []
    for model, (top1, mb) in _IN1K.items():
        rows.append(_timm(model, "imagenet", "cvnets_in1k", 256, _TIMM_CROP, top1, mb,
                          "ImageNet-1k"))
    for model, (top1, mb) in _IN22K.items():
        rows.append(_timm(model, "imagenet22k_ft_in1k", "cvnets_in22k_ft_in1k", 256,
                          _TIMM_CROP, top1, mb, "ImageNet-21k, fine-tuned on ImageNet-1k"))
    for model, (top1, mb) in _IN22K_384.items():
        rows.append(_timm(model, "imagenet22k_ft_in1k_384", "cvnets_in22k_ft_in1k_384", 384,
                          1.0, top1, mb,
                          "ImageNet-21k, fine-tuned on ImageNet-1k at 256 then 384"))
    rows.extend(_apple_384(model) for model in _APPLE_IN1K_384)
    return tuple(rows)


#: Every published checkpoint, one row per (model, tag).
PRETRAINED_WEIGHTS: tuple[PretrainedWeights, ...] = _build_table()

#: timm's tag names are accepted as synonyms of ours.
_ALIASES = {row.timm_tag: row.tag for row in PRETRAINED_WEIGHTS if row.timm_tag}


def _canonical(tag: str) -> str:
    return _ALIASES.get(tag, tag)


def is_weights_tag(value) -> bool:
    """Whether `value` names published weights (`"imagenet"`, ...) rather than a file."""
    if not isinstance(value, str):
        return False
    return any(row.tag == _canonical(value) for row in PRETRAINED_WEIGHTS)


def list_weights(model: str | None = None) -> list[PretrainedWeights]:
    """The published checkpoints (all, or those of `model`), smallest model first.

    Example:
        ```python
        for w in keras_mvit2.list_weights("mobilevitv2_150"):
            print(w.tag, w.input_size, w.top1)
        ```
    """
    rows = [r for r in PRETRAINED_WEIGHTS if model is None or r.model == model]
    if model is not None and not rows:
        raise ValueError(
            f"No published weights for model {model!r}. Models with weights: "
            f"{sorted(_WIDTHS)}."
        )
    return sorted(rows, key=lambda r: (r.width_multiplier, r.input_size, r.tag))


def find_weights(model: str, tag: str) -> PretrainedWeights:
    """The checkpoint of `model` called `tag`; a clear error naming the valid tags otherwise."""
    canonical = _canonical(tag)
    for row in PRETRAINED_WEIGHTS:
        if row.model == model and row.tag == canonical:
            return row
    if model not in _WIDTHS:
        raise ValueError(
            f"weights={tag!r}: keras_mvit2 has published weights only for the MobileViTv2 "
            f"widths {sorted(_WIDTHS)}; model {model!r} has none. Pass weights=None or the "
            "path of a checkpoint file."
        )
    valid = [r.tag for r in list_weights(model)]
    others = sorted({r.model for r in PRETRAINED_WEIGHTS if r.tag == canonical})
    hint = f" Tag {tag!r} exists for {others}." if others else ""
    raise ValueError(
        f"No weights {tag!r} for {model} (width {_WIDTHS[model]:g}). Its tags: {valid}.{hint}"
    )


def find_preset(name: str) -> PretrainedWeights | None:
    """The checkpoint whose KerasHub preset name (`PretrainedWeights.preset`) is `name`,
    or None where `name` is not one of ours."""
    for row in PRETRAINED_WEIGHTS:
        if row.preset == name:
            return row
    return None


def model_name_for_width(width_multiplier: float) -> str | None:
    """The registered name of a published width (`0.5 -> "mobilevitv2_050"`), else None."""
    for name, width in _WIDTHS.items():
        if math.isclose(width, float(width_multiplier)):
            return name
    return None


def check_pretrained_config(
    width_multiplier: float,
    tag: str,
    *,
    include_top: bool,
    classes: int,
    input_shape,
    input_tensor,
    attention,
) -> tuple[PretrainedWeights, tuple[int, int, int] | None]:
    """Validates a `MobileViTV2(width_multiplier, weights=tag, ...)` call before anything
    is built or downloaded.

    Returns:
        `(entry, input_shape)`: the checkpoint, and the input shape to build with (the
        checkpoint's size when none was given).

    Raises:
        ValueError: a width without published weights, a tag of other widths, `classes`
            other than 1000 with `include_top=True`, an input size other than the
            checkpoint's with `include_top=True`, or an attention other than the
            paper's separable attention. A dynamic side (`None`) is accepted.
    """
    model = model_name_for_width(width_multiplier)
    if model is None:
        raise ValueError(
            f"weights={tag!r}: weights are published for the widths "
            f"{sorted(_WIDTHS.values())} only. Received: width_multiplier={width_multiplier}"
        )
    entry = find_weights(model, tag)
    if attention != "separable":
        raise ValueError(
            f"weights={tag!r} holds the paper's separable attention; build with the default "
            f"attention='separable'. Received: attention={attention!r}"
        )
    size = entry.input_size
    if input_shape is None and input_tensor is None:
        input_shape = (size, size, 3)
    shape = tuple(input_shape) if input_shape is not None else tuple(input_tensor.shape[1:])
    if len(shape) == 3 and shape[2] not in (None, 3):
        raise ValueError(
            f"weights={tag!r} expects RGB images (3 channels). Received: input_shape={shape}"
        )
    if include_top:
        if classes != 1000:
            raise ValueError(
                f"weights={tag!r} with include_top=True has the 1000 ImageNet classes; pass "
                "classes=1000, or include_top=False to load the backbone and add your own "
                f"head. Received: classes={classes}"
            )
        if any(side is not None and side != size for side in shape[:2]):
            raise ValueError(
                f"weights={tag!r} of {model} was trained at {size}x{size}; with "
                f"include_top=True a fixed input must be ({size}, {size}, 3). Use "
                "include_top=False for the backbone at other sizes (the weights do not depend "
                "on the input size), or input_shape=(None, None, 3) for one model that "
                f"runs any size. Received: input_shape={shape}"
            )
    return entry, None if input_shape is None else tuple(input_shape)


# --------------------------------------------------------------------------------------
# The same rows as KerasHub presets (data only: no keras-hub import)
# --------------------------------------------------------------------------------------


def _metadata(entry: PretrainedWeights) -> dict:
    return {
        "metadata": {
            "description": (
                f"MobileViTv2-{entry.width_multiplier:g} at {entry.input_size}x"
                f"{entry.input_size}, {entry.trained_on}; ImageNet-1k top-1 "
                f"{entry.top1:g} % ({entry.top1_source})."
            ),
            "path": "mobilevitv2",
            "weights": entry.tag,
            "input_size": entry.input_size,
            "top1": entry.top1,
        },
        "source": entry.url,
    }


#: Every published preset name -> its description (as KerasHub's `presets`). Turning a
#: name (or a timm checkpoint) into a cached KerasHub preset directory is
#: `keras_mvit2.models.mobilevitv2.mobilevitv2_preset_resolver`.
PRESETS: dict[str, dict] = {
    entry.preset: _metadata(entry)
    for entry in sorted(PRETRAINED_WEIGHTS, key=lambda entry: entry.preset)
}


class PresetsProperty:
    """`cls.presets` of our KerasHub classes (as KerasHub's): the published names and
    descriptions."""

    def __get__(self, instance, owner) -> dict[str, dict]:
        return dict(PRESETS)
