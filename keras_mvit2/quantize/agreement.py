"""Which of two int8 files keeps the float model's answers better, with its confidence interval.

Agreement with the float model (the share of images where a file's top-1 class is the
model's) needs no labels, so it can be measured on every image at hand. Two files run on the
same images are compared pair-wise: per image the difference of their agreements is -1, 0 or
+1, and the 95 % interval of its mean (normal approximation of the paired difference, as in
McNemar's test) says whether one file is better or the images cannot tell them apart.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["AgreementComparison", "compare_agreement", "wilson_interval"]

_Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = _Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / n`` (95 % by default)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclasses.dataclass(frozen=True)
class AgreementComparison:
    """Two files' agreement with the float model on the same images.

    Attributes:
        num_images: images compared.
        agreement_a, agreement_b: each file's share of images where its top-1 class is the
            float model's.
        interval_a, interval_b: their 95 % Wilson intervals.
        difference: ``agreement_b - agreement_a``.
        difference_interval: the 95 % interval of the paired difference.
        only_a, only_b: images only file a (only file b) agrees on.
    """

    num_images: int
    agreement_a: float
    agreement_b: float
    interval_a: tuple[float, float]
    interval_b: tuple[float, float]
    difference: float
    difference_interval: tuple[float, float]
    only_a: int
    only_b: int

    @property
    def b_is_better(self) -> bool:
        """Whether file b agrees more often and the images can tell (the paired interval
        lies above 0)."""
        return self.difference_interval[0] > 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "b_is_better": self.b_is_better}


def compare_agreement(reference: np.ndarray, a: np.ndarray, b: np.ndarray) -> AgreementComparison:
    """Compares files `a` and `b` (their top-1 classes, `(N,)`) against the float model's
    top-1 classes `reference` `(N,)` on the same N images."""
    reference, a, b = (np.asarray(v).ravel() for v in (reference, a, b))
    if not len(reference) == len(a) == len(b) or len(reference) == 0:
        raise ValueError(
            f"compare_agreement needs the same non-zero number of answers from the model and "
            f"both files. Received: {len(reference)}, {len(a)} and {len(b)}.")
    agree_a, agree_b = a == reference, b == reference
    n = len(reference)
    diff = agree_b.astype(np.float64) - agree_a.astype(np.float64)
    mean = float(diff.mean())
    half = _Z95 * float(diff.std(ddof=1)) / math.sqrt(n) if n > 1 else 1.0
    return AgreementComparison(
        num_images=n,
        agreement_a=float(agree_a.mean()), agreement_b=float(agree_b.mean()),
        interval_a=wilson_interval(int(agree_a.sum()), n),
        interval_b=wilson_interval(int(agree_b.sum()), n),
        difference=mean, difference_interval=(mean - half, mean + half),
        only_a=int((agree_a & ~agree_b).sum()), only_b=int((agree_b & ~agree_a).sum()),
    )
