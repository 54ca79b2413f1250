"""Two int8 files compared on the same images: which one keeps the float model's answers, and
the exact paired test that decides whether the second one is shipped.

Agreement with the float model (the share of images where a file's top-1 class is the
model's) needs no labels, so it can be measured on every image neither file trained or
calibrated on. Two files run on the same images differ only on their *discordant* images:
``only_a`` where file a alone agrees with the model, ``only_b`` where file b alone does.
Where b is no better than a, each discordant image is b's with probability at most 1/2, so
McNemar's exact test (the one-sided binomial test of ``only_b`` out of ``only_a + only_b``
at 1/2, `scipy.stats.binomtest`) gives a p-value: the chance of b agreeing on at least this
many of them if it were no better.

`choose_b` ships file b only where that p-value is below `ALPHA`, where labels are given its
top-1 on the same images is not below a's, and on the caller's held-out images (a subset of
them) neither its agreement nor its top-1 is below a's. What this guarantees: where b agrees
with the model no more often than a, b is shipped in at most `ALPHA` (5 %) of the runs (tested
by simulation, ``tests/test_qat.py``). It does not say by how much b is better, and a b that
is better by less than the images can show is not shipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["ALPHA", "AgreementComparison", "choose_b", "compare_agreement", "paired_p_value"]

#: The one-sided level of the paired test: file b is shipped only at a p-value below this.
ALPHA = 0.05


def paired_p_value(only_a: int, only_b: int) -> float:
    """McNemar's exact one-sided p-value that file b agrees more often than file a: the
    binomial tail P(X >= `only_b`), X ~ Binomial(`only_a` + `only_b`, 1/2); 1.0 where the
    files never differ."""
    n = int(only_a) + int(only_b)
    if n == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(int(only_b), n, 0.5, alternative="greater").pvalue)


@dataclasses.dataclass(frozen=True)
class AgreementComparison:
    """Two files' agreement with the float model on the same images.

    Attributes:
        num_images: images compared.
        agreement_a, agreement_b: each file's share of images where its top-1 class is the
            float model's.
        only_a, only_b: images only file a (only file b) agrees on.
        p_value: `paired_p_value(only_a, only_b)`: the exact one-sided test that b agrees
            more often.
        top1_a, top1_b: each file's top-1 against the labels, or None without labels.
    """

    num_images: int
    agreement_a: float
    agreement_b: float
    only_a: int
    only_b: int
    p_value: float
    top1_a: float | None = None
    top1_b: float | None = None

    @property
    def difference(self) -> float:
        """``agreement_b - agreement_a``."""
        return self.agreement_b - self.agreement_a

    @property
    def b_passes(self) -> bool:
        """Whether b passes the test on these images: ``p_value < ALPHA`` and, with labels,
        its top-1 is not below a's."""
        return self.p_value < ALPHA and (self.top1_a is None or self.top1_b >= self.top1_a)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "difference": self.difference,
                "b_passes": self.b_passes}


def compare_agreement(reference: np.ndarray, a: np.ndarray, b: np.ndarray,
                      labels: np.ndarray | None = None) -> AgreementComparison:
    """Compares files `a` and `b` (their top-1 classes, `(N,)`) against the float model's
    top-1 classes `reference` `(N,)` on the same N images (and against `labels` `(N,)`,
    where given)."""
    reference, a, b = (np.asarray(v).ravel() for v in (reference, a, b))
    if not len(reference) == len(a) == len(b) or len(reference) == 0 or (
            labels is not None and len(np.ravel(labels)) != len(reference)):
        raise ValueError(
            f"compare_agreement needs the same non-zero number of answers from the model and "
            f"both files (and labels, where given). Received: {len(reference)}, {len(a)} and "
            f"{len(b)}{'' if labels is None else f', {len(np.ravel(labels))} labels'}.")
    agree_a, agree_b = a == reference, b == reference
    only_a, only_b = int((agree_a & ~agree_b).sum()), int((agree_b & ~agree_a).sum())
    top1_a = top1_b = None
    if labels is not None:
        labels = np.ravel(labels)
        top1_a, top1_b = float(np.mean(a == labels)), float(np.mean(b == labels))
    return AgreementComparison(
        num_images=len(reference), agreement_a=float(agree_a.mean()),
        agreement_b=float(agree_b.mean()), only_a=only_a, only_b=only_b,
        p_value=paired_p_value(only_a, only_b), top1_a=top1_a, top1_b=top1_b)


def choose_b(judged: AgreementComparison, held_out: AgreementComparison | None = None, *,
             name: str = "file b") -> tuple[bool, str]:
    """Whether file b is shipped instead of file a, and why, in words.

    Args:
        judged: the two files on every judge image (`compare_agreement`, with labels where
            the images have them).
        held_out: the same on the caller's held-out images alone (a subset of the judge
            images), or None.
        name: file b in the reasons (``"the QAT file"``).

    Returns:
        ``(ship_b, reason)``: b is shipped only where ``judged.b_passes`` and, on
        `held_out`, its agreement and top-1 are not below a's.
    """
    if judged.p_value >= ALPHA:
        return False, (f"the paired test does not show that {name} agrees more often (p = "
                       f"{judged.p_value:.2g}, not below {ALPHA:g})")
    if judged.top1_a is not None and judged.top1_b < judged.top1_a:
        return False, (f"{name}'s top-1 on the judge images is lower "
                       f"({100 * judged.top1_b:.1f} against {100 * judged.top1_a:.1f} %)")
    if held_out is not None:
        if held_out.agreement_b < held_out.agreement_a:
            return False, (f"{name} agrees less often on the {held_out.num_images} held-out "
                           f"images ({100 * held_out.agreement_b:.1f} against "
                           f"{100 * held_out.agreement_a:.1f} %)")
        if held_out.top1_a is not None and held_out.top1_b < held_out.top1_a:
            return False, (f"{name}'s top-1 on the {held_out.num_images} held-out images is "
                           f"lower ({100 * held_out.top1_b:.1f} against "
                           f"{100 * held_out.top1_a:.1f} %)")
    return True, (f"{name} agrees more often (p = {judged.p_value:.2g}, below {ALPHA:g}) "
                  "with a top-1 not lower"
                  + (", and neither is lower on the held-out images" if held_out is not None
                     else ""))
