"""One way to ship a model (`Candidate`) and what it measured (`CandidateResult`).

Each export target the optimizer knows has its candidates (`keras_mvit2.optimizer.targets`);
`keras_mvit2.optimizer` builds each one, measures it on the user's held-out images and
picks the best within the accuracy budget. A candidate knows how to write its file and
says how its accuracy is measured on this host (`measured_by`): in the runtime apps use
(LiteRT), or, where that runtime does not run here (Core ML off macOS), by an exact
emulation of the file's weights (`exact=True`) or not at all (`measurable=False`:
reported, never chosen). One candidate per target is the `float_reference` (the float32
file): the optimizer's default objective ships no file slower than it on this host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["Candidate", "CandidateResult"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A recipe for one exported file.

    Attributes:
        name: a short file-name-safe id (`"int8"`, `"palettize_4bit_grouped"`).
        recipe: what makes it, as JSON-able settings (quantization and options).
        build: `build(path)` writes the file at `path` (atomically, as every export);
            it may return a dict of what it chose while building, added to the recipe.
        measured_by: how the file's outputs are computed on this host (`"LiteRT"`,
            `"Keras with the package's decompressed weights"`).
        measurable: False where its accuracy cannot be measured here (never chosen).
        exact: whether that measurement is the file's own arithmetic (False for an
            approximation, said in the report).
        note: what a reader should know about it (e.g. the approximation).
        float_reference: the target's float32 file, the yardstick of speed: every other
            candidate's latency is reported against it ("faster / slower than float32").
    """

    name: str
    recipe: dict[str, Any]
    build: Callable[[str], Any]
    measured_by: str
    measurable: bool = True
    exact: bool = True
    note: str | None = None
    float_reference: bool = False


@dataclasses.dataclass
class CandidateResult:
    """A built candidate and its measured figures (None where not measured here).

    `top1` and `agreement` are fractions in [0, 1]; `drop_points` is the float Keras
    model's top-1 minus the candidate's, in percentage points, on the same images.
    `latency_vs_float32` is its median latency over the float reference's (measured in the
    same run on this host; below 1: faster) and `vs_float32` says it in a word:
    ``"faster"``, ``"slower"``, ``"as fast"`` or ``"reference"`` (None where either was
    not timed here).
    """

    name: str
    recipe: dict[str, Any]
    path: str | None
    size_bytes: int | None
    measured_by: str
    exact: bool
    top1: float | None = None
    agreement: float | None = None
    drop_points: float | None = None
    latency_ms: float | None = None
    within_budget: bool | None = None
    error: str | None = None
    note: str | None = None
    float_reference: bool = False
    latency_vs_float32: float | None = None
    vs_float32: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
