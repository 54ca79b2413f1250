"""Resolves the `from_preset` names of `MobileViTV2ImageClassifier` / `MobileViTV2Backbone`:
a published name (`mobilevitv2_presets.PRESETS`, the rows of the one table) or a timm
MobileViTv2 checkpoint is downloaded, ported and turned, once, into an ordinary KerasHub
preset directory (`save_to_preset`), cached under `$KERAS_HOME/keras_mvit2/presets` keyed
by the SHA-256 of the downloaded file; KerasHub's own loader then reads it.

The port to a KerasHub classifier is `keras_mvit2.kerashub.convert.classifier_from_model`,
which registers itself here (`register_classifier_factory`) when `keras_mvit2.kerashub`
imports it: `convert` imports the classes whose `from_preset` calls `resolve_preset`,
so this module does not import `convert` (`keras_mvit2.kerashub` stands above
`keras_mvit2.models`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from keras_mvit2.models.mobilevitv2.mobilevitv2_builders import MobileViTV2
from keras_mvit2.models.mobilevitv2.mobilevitv2_port import load_torch_weights
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import find_preset
from keras_mvit2.weights.pretrained import PretrainedWeights

__all__ = ["presets_home", "register_classifier_factory", "resolve_preset"]

#: timm's model names: `mobilevitv2_<100 * width>`.
_TIMM_PREFIX = "mobilevitv2_"
_PRESET_FILES = ("config.json", "task.json", "model.weights.h5", "preprocessor.json")

#: `keras_mvit2.kerashub.convert.classifier_from_model`, once `keras_mvit2.kerashub` is imported.
_classifier_from_model: Callable[..., Any] | None = None


def register_classifier_factory(factory: Callable[..., Any]) -> None:
    """Sets the function that turns a `MobileViTV2` into a `MobileViTV2ImageClassifier`
    (`keras_mvit2.kerashub.convert.classifier_from_model`, which calls this on import)."""
    global _classifier_from_model
    _classifier_from_model = factory


def _classifier_factory() -> Callable[..., Any]:
    if _classifier_from_model is None:  # `keras_mvit2.kerashub` imports convert first
        raise RuntimeError(
            "keras_mvit2.kerashub.convert is not imported; import keras_mvit2.kerashub before "
            "resolving a preset."
        )
    return _classifier_from_model


def presets_home() -> str:
    """Where converted presets are cached: `$KERAS_HOME/keras_mvit2/presets`."""
    base = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    if not os.access(base, os.W_OK) and os.path.exists(base):
        base = os.path.join(tempfile.gettempdir(), ".keras")
    return os.path.join(base, "keras_mvit2", "presets")


def _complete(folder: str) -> bool:
    return all(os.path.exists(os.path.join(folder, f)) for f in _PRESET_FILES)


def _save(classifier, target: str) -> str:
    """`classifier.save_to_preset` into `target`, atomically (a folder renamed in place)."""
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".partial-", dir=parent)
    try:
        classifier.save_to_preset(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process wrote it first
            if not _complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _published(name: str, entry: PretrainedWeights) -> str:
    from keras_mvit2.weights.download import download_weights, load_pretrained

    resolved = download_weights(entry)
    target = os.path.join(presets_home(), f"{name}.{resolved.sha256[:16]}")
    if _complete(target):
        return target
    size = entry.input_size
    model = MobileViTV2(entry.width_multiplier, input_shape=(size, size, 3),
                        classifier_activation=None)
    load_pretrained(model, resolved, include_top=True, port=load_torch_weights)
    model._keras_mvit2_weights = entry
    classifier = _classifier_factory()(model, entry.width_multiplier,
                                       interpolation=entry.interpolation)
    return _save(classifier, target)


def _timm_config(preset: str) -> dict | None:
    """timm's `config.json` of `preset` when it is a timm MobileViTv2, else None."""
    import json

    from keras_hub.src.utils.preset_utils import get_file

    try:
        path = get_file(preset, "config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except Exception:  # not a preset KerasHub can read: KerasHub gives its own error
        return None
    architecture = config.get("architecture") if isinstance(config, dict) else None
    if isinstance(architecture, str) and architecture.startswith(_TIMM_PREFIX):
        return config
    return None


def _timm_width(architecture: str) -> float:
    digits = architecture[len(_TIMM_PREFIX):].split("_")[0].split(".")[0]
    if not digits.isdigit():
        raise ValueError(
            "A timm MobileViTv2 architecture is named mobilevitv2_<100 x width>, e.g. "
            f"mobilevitv2_050. Received: architecture={architecture!r}"
        )
    return int(digits) / 100.0


def _timm(preset: str, config: dict) -> str:
    from keras_hub.src.utils.preset_utils import get_file

    from keras_mvit2.utils.files import sha256_file

    architecture = config["architecture"]
    width = _timm_width(architecture)
    cfg = config.get("pretrained_cfg") or {}
    num_classes = int(config.get("num_classes", cfg.get("num_classes", 1000)))
    _, height, width_px = cfg.get("input_size", (3, 256, 256))
    if height != width_px:
        raise ValueError(
            f"{preset}: MobileViTV2ImageConverter takes a square input size. Received: "
            f"input_size={cfg.get('input_size')}"
        )
    mean = [float(m) for m in cfg.get("mean", (0.0, 0.0, 0.0))]
    std = [float(s) for s in cfg.get("std", (1.0, 1.0, 1.0))]
    if all(m == 0.0 for m in mean) and all(s == 1.0 for s in std):
        scale, offset = 1.0 / 255.0, None
    else:
        scale = [1.0 / (255.0 * s) for s in std]
        offset = [-m / s for m, s in zip(mean, std, strict=True)]
    try:
        weights = get_file(preset, "model.safetensors")
    except FileNotFoundError:
        weights = get_file(preset, "pytorch_model.bin")  # older repos; needs torch
    target = os.path.join(presets_home(),
                          f"timm.{architecture}.{sha256_file(weights)[:16]}")
    if _complete(target):
        return target
    model = MobileViTV2(width, input_shape=(height, height, 3), classes=num_classes,
                        classifier_activation=None)
    load_torch_weights(model, weights)
    classifier = _classifier_factory()(
        model, width, crop_pct=float(cfg.get("crop_pct", 0.888)),
        interpolation=cfg.get("interpolation", "bicubic"), scale=scale, offset=offset)
    return _save(classifier, target)


def resolve_preset(preset: str) -> str:
    """The KerasHub preset to load for `preset`.

    A published name (`PRESETS`) or a timm MobileViTv2 checkpoint (`hf://timm/...`, or
    a directory with timm's `config.json` and `model.safetensors`) -> the cached
    KerasHub preset directory made from it (made on first use); anything else is
    returned as is, for KerasHub.
    """
    if not isinstance(preset, str):
        return preset
    entry = find_preset(preset)
    if entry is not None:
        return _published(preset, entry)
    config = _timm_config(preset)
    if config is not None:
        return _timm(preset, config)
    return preset
