"""The presets of `MobileViTV2ImageClassifier` / `MobileViTV2Backbone`: one per published
checkpoint, as KerasHub's ``presets``.

Data only: `PRESETS` (every published name and its description) and the `PresetsProperty`
descriptor of the classes. The names and checkpoints are the rows of the one table,
`keras_mvit2.weights.pretrained` (`PretrainedWeights.preset`, `find_preset`), which
`weights=` and `finetune` read too. Turning a name (or a timm checkpoint) into a cached
KerasHub preset directory is `keras_mvit2.kerashub.preset_resolver`.
"""

from __future__ import annotations

from keras_mvit2.weights.pretrained import PRETRAINED_WEIGHTS, PretrainedWeights

__all__ = ["PRESETS", "PresetsProperty"]


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


#: Every published preset name -> its description (as KerasHub's `presets`).
PRESETS: dict[str, dict] = {
    entry.preset: _metadata(entry)
    for entry in sorted(PRETRAINED_WEIGHTS, key=lambda entry: entry.preset)
}


class PresetsProperty:
    """`cls.presets` of our classes (as KerasHub's): the published names and descriptions."""

    def __get__(self, instance, owner) -> dict[str, dict]:
        return dict(PRESETS)
