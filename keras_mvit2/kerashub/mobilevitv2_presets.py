"""The presets of `MobileViTV2ImageClassifier` / `MobileViTV2Backbone`: one per published
checkpoint (`keras_mvit2.list_weights()`), as KerasHub's ``presets``.

Data only: `PRESETS` (every published name and its description), `preset_name` and the
`PresetsProperty` descriptor of the classes. Turning a name (or a timm checkpoint)
into a cached KerasHub preset directory is `keras_mvit2.kerashub.preset_resolver`.
"""

from __future__ import annotations

from keras_mvit2.weights.pretrained import PRETRAINED_WEIGHTS, PretrainedWeights

__all__ = ["PRESETS", "PRESET_WEIGHTS", "PresetsProperty", "preset_name"]


def preset_name(entry: PretrainedWeights) -> str:
    """`"<model>_<tag>"`, e.g. `"mobilevitv2_050_imagenet"`."""
    return f"{entry.model}_{entry.tag}"


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


#: Every published preset name -> its checkpoint (`keras_mvit2.weights.pretrained`).
PRESET_WEIGHTS: dict[str, PretrainedWeights] = {
    preset_name(entry): entry for entry in PRETRAINED_WEIGHTS
}

#: Every published preset name -> its description (as KerasHub's `presets`).
PRESETS: dict[str, dict] = {
    name: _metadata(entry) for name, entry in sorted(PRESET_WEIGHTS.items())
}


class PresetsProperty:
    """`cls.presets` of our classes (as KerasHub's): the published names and descriptions."""

    def __get__(self, instance, owner) -> dict[str, dict]:
        return dict(PRESETS)


# `presets_home` and `resolve_preset` lived here and are still importable from here, on
# first use: they are in `keras_mvit2.kerashub.preset_resolver` now, which imports this module.
_MOVED = ("presets_home", "resolve_preset")


def __getattr__(name: str):
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module("keras_mvit2.kerashub.preset_resolver"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
