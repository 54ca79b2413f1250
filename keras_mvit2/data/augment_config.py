"""`AugmentConfig`: the training augmentation settings of a run (no TensorFlow).

The transforms that apply it are `keras_mvit2.data.augment` (tf.data, TensorFlow and JAX)
and `keras_mvit2.data.py_augment` (numpy / PIL, every backend).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """Training augmentation settings (validated on construction).

    Attributes:
        random_resized_crop: bool. Inception-style crop (else: resize the shorter side to
            the target size and center crop).
        rrc_scale: (min, max) area fraction of the crop, in (0, 1].
        rrc_ratio: (min, max) width / height of the crop.
        horizontal_flip: bool. Flip left-right with probability 0.5.
        rand_augment: bool. Keras `RandAugment`, per example.
        rand_augment_ops: int >= 1. Ops applied per example (`num_ops`).
        rand_augment_magnitude: float in [0, 1]. Keras' normalized strength (`factor`);
            0.9 corresponds to the usual "magnitude 9 of 10".
        random_erasing: float in [0, 1]. Probability of erasing a random rectangle (Keras
            `RandomErasing`, filled with 0 like torchvision's default).
        mixup_alpha: float >= 0. Beta(alpha, alpha) for MixUp; 0 turns MixUp off.
        cutmix_alpha: float in [0, 1]. Beta(alpha, alpha) for CutMix; 0 turns it off
            (Keras' CutMix accepts alpha <= 1).
        mix_probability: float in [0, 1]. Probability that a batch is mixed at all.
        switch_probability: float in [0, 1]. Probability of CutMix rather than MixUp for a
            mixed batch when both are on.
    """

    random_resized_crop: bool = True
    rrc_scale: tuple[float, float] = (0.08, 1.0)
    rrc_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    horizontal_flip: bool = True
    rand_augment: bool = False
    rand_augment_ops: int = 2
    rand_augment_magnitude: float = 9 / 10
    random_erasing: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_probability: float = 1.0
    switch_probability: float = 0.5

    def __post_init__(self) -> None:
        def fail(name: str, rule: str) -> None:
            raise ValueError(
                f"AugmentConfig.{name} must be {rule}. Received: {name}={getattr(self, name)!r}"
            )

        for name in ("random_resized_crop", "horizontal_flip", "rand_augment"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "a bool (true/false)")
        for name, low, high in (("rrc_scale", 0.0, 1.0), ("rrc_ratio", 0.0, math.inf)):
            value = getattr(self, name)
            if (
                not isinstance(value, (tuple, list))
                or len(value) != 2
                or not all(_is_number(v) for v in value)
            ):
                fail(name, "a pair of numbers (min, max)")
            lo, hi = value
            if not (low < lo <= hi <= high):
                fail(name, f"a pair with {low} < min <= max <= {high}")
            object.__setattr__(self, name, (float(lo), float(hi)))
        n = self.rand_augment_ops
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            fail("rand_augment_ops", "an int >= 1")
        for name in (
            "rand_augment_magnitude",
            "random_erasing",
            "mix_probability",
            "switch_probability",
            "cutmix_alpha",
        ):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value <= 1.0:
                fail(name, "a number in [0, 1]")
        if not _is_number(self.mixup_alpha) or self.mixup_alpha < 0.0:
            fail("mixup_alpha", "a number >= 0")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> AugmentConfig:
        """Builds a config from a dict (e.g. a YAML section); every key is validated.

        Unknown keys raise a `ValueError` that names them and lists the valid ones; lists are
        accepted for the (min, max) pairs.
        """
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ValueError(f"The augment config must be a mapping. Received: {d!r}")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(
                f"Unknown augment key(s) {unknown}. Valid keys: {valid}. Received: {dict(d)!r}"
            )
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (pairs as lists), the inverse of `from_dict`."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def standard(cls) -> AugmentConfig:
        """Inception-style: random resized crop + horizontal flip."""
        return cls()

    @classmethod
    def advanced(cls) -> AugmentConfig:
        """The paper's advanced set (Table 9) with ml-cvnets' values.

        RandAugment (2 ops, magnitude 0.9), RandomErasing p=0.25, MixUp alpha 0.2 and CutMix
        alpha 1.0 (one of them per batch, each half of the time), on top of the crop + flip.
        """
        return cls(
            rand_augment=True,
            random_erasing=0.25,
            mixup_alpha=0.2,
            cutmix_alpha=1.0,
        )

    @property
    def mixes_labels(self) -> bool:
        """Whether CutMix or MixUp is on (labels become soft)."""
        return self.mix_probability > 0.0 and (self.mixup_alpha > 0.0 or self.cutmix_alpha > 0.0)
