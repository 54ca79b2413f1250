"""`optimize`: every candidate of a target built, measured on held-out images, the best
one within the accuracy budget shipped.

The budget is a drop in top-1 accuracy, in percentage points, against the float Keras
model on the same held-out images. A candidate is eligible when its accuracy was measured
on this host (LiteRT for TFLite; Keras with the package's own weights for Core ML's
weight-only compression) and its drop is at most `max_drop`. Among the eligible ones the
objective picks: ``"size"`` the smallest file (then the faster, then the more accurate),
``"latency"`` the fastest on this host (then the smaller). No eligible candidate is an
`OverBudgetError` naming the closest one: nothing that breaks the budget is called best.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mvit2.export.candidate import Candidate, CandidateResult
from keras_mvit2.export.optimizer.data import OptimizeData, load_optimize_data
from keras_mvit2.utils.files import atomic_output, disk_size

__all__ = ["OBJECTIVES", "OptimizeResult", "OverBudgetError", "best_within", "optimize"]

OBJECTIVES = ("size", "latency")
CANDIDATES_FOLDER = "candidates"


class OverBudgetError(RuntimeError):
    """No candidate keeps the accuracy within the budget (`result` has every measurement)."""

    def __init__(self, message: str, result: OptimizeResult):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class OptimizeResult:
    """What `optimize` built and measured.

    Attributes:
        best: the chosen candidate (None when none meets the budget).
        best_path: where the chosen file was copied (`OUT_DIR/best.tflite`, ...).
        candidates: every candidate, measured (or with the error that stopped it).
        reference_top1: the float Keras model's top-1 on the held-out images.
        report_path / plot_path: `report.json` and `pareto.png`.
    """

    target: str
    objective: str
    max_drop: float
    data: dict[str, Any]
    reference_top1: float
    candidates: list[CandidateResult]
    best: CandidateResult | None = None
    best_path: str | None = None
    report_path: str | None = None
    plot_path: str | None = None
    latency_setup: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["best"] = None if self.best is None else self.best.name
        return out


def optimize(model: Any, output_dir: str | os.PathLike, *, target: str = "tflite",
             data: str | os.PathLike | OptimizeData = "fashion_mnist", max_drop: float = 0.5,
             objective: str = "size", class_names: Sequence[str] | None = None,
             num_calibration: int = 200, num_held_out: int = 1000,
             latency_runs: int = 50, threads: int = 1,
             only: Sequence[str] | None = None, verbose: bool = True) -> OptimizeResult:
    """Ships the smallest (or fastest) file of `target` whose top-1 drop is within budget.

    Args:
        model: the float Keras classifier (fixed input size).
        output_dir: gets ``candidates/`` (every file built), ``best.<suffix>``,
            ``report.json`` and ``pareto.png``.
        target: an export target name (`keras_mvit2.export.available_targets()`).
        data: a folder of class sub-folders, ``"fashion_mnist"``, or `OptimizeData`
            (see `keras_mvit2.export.optimizer.data`: calibration and held-out images are
            disjoint).
        max_drop: the largest top-1 drop allowed, in percentage points, against the
            float Keras model on the held-out images.
        objective: ``"size"`` or ``"latency"`` (on this host; needs the runtime here).
        class_names: written into every file (default: the data's class names).
        num_calibration: calibration images read from `data`.
        num_held_out: held-out images read from `data`.
        latency_runs: timed runs per candidate (median reported), 1 image each.
        threads: runtime threads for the latency.
        only: build only the candidates of these names (default: all of the target's).
        verbose: print a line per candidate.

    Returns:
        `OptimizeResult` (also written as ``report.json``).

    Raises:
        OverBudgetError: no candidate meets `max_drop` (the report is still written).
    """
    from keras_mvit2.export.optimizer.report import plot_pareto, write_report
    from keras_mvit2.export.target import available_targets, get_target

    export_target = get_target(target)
    objective = _checked(objective, max_drop, model)
    out = os.fspath(output_dir)
    if not isinstance(data, OptimizeData):
        data = load_optimize_data(data, image_size=tuple(model.inputs[0].shape[1:3]),
                                  num_calibration=num_calibration, num_held_out=num_held_out)
    names = list(class_names) if class_names is not None else data.class_names
    reference = np.asarray(model.predict(data.held_out, batch_size=64, verbose=0))
    if reference.ndim != 2 or reference.shape[-1] != len(data.class_names):
        raise ValueError(
            f"The model outputs {reference.shape[1:]} per image but the data has "
            f"{len(data.class_names)} classes; optimize a classifier on data of its classes."
        )
    keras_top1 = reference.argmax(-1)
    reference_top1 = float(np.mean(keras_top1 == data.labels))
    try:
        candidates = export_target.candidates(model, calibration_data=data.calibration,
                                              held_out=data.held_out, class_names=names)
    except NotImplementedError as err:
        optimizable = [n for n in available_targets() if _has_candidates(get_target(n))]
        raise ValueError(f"{err} Optimize for one of {optimizable}.") from None
    candidates = _selected(candidates, only)
    folder = os.path.join(out, CANDIDATES_FOLDER)
    os.makedirs(folder, exist_ok=True)
    can_time = bool(export_target.can_run())  # then `bench` times its files here
    if objective == "latency" and not can_time:
        raise ValueError(
            f"objective='latency' needs {export_target.runtime} on this host, which is not "
            f"available here ({export_target.host_note()}); use objective='size'."
        )
    results = []
    for candidate in candidates:
        path = os.path.join(folder, candidate.name + export_target.suffixes[0])
        result = _measure(export_target, candidate, model, path, data, keras_top1,
                          reference_top1, max_drop, can_time, latency_runs, threads)
        results.append(result)
        if verbose:
            print(_line(result), flush=True)
    result = OptimizeResult(
        target=export_target.name, objective=objective, max_drop=float(max_drop),
        data=data.describe(), reference_top1=reference_top1, candidates=results,
        latency_setup={"runtime": export_target.runtime, "threads": threads,
                       "runs": latency_runs, "batch": 1} if can_time else None,
    )
    result.best = best_within(results, max_drop, objective)
    if result.best is not None:
        result.best_path = _ship(result.best.path, out, export_target.suffixes[0])
    result.plot_path = plot_pareto(result, os.path.join(out, "pareto.png"))
    result.report_path = write_report(result, os.path.join(out, "report.json"))
    if result.best is None:
        raise OverBudgetError(_over_budget_message(result), result)
    return result


def _checked(objective: str, max_drop: Any, model: Any) -> str:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}. Received: {objective!r}")
    if isinstance(max_drop, bool) or not isinstance(max_drop, int | float) or not (
            0 <= max_drop <= 100):
        raise ValueError(
            "max_drop is the top-1 drop allowed in percentage points, a number in [0, 100]. "
            f"Received: {max_drop!r}"
        )
    if any(d is None for d in model.inputs[0].shape[1:3]):
        raise ValueError(
            "optimize needs a model of one input size; fix it with "
            "keras_mvit2.models.input_size.with_input_size(model, (H, W))."
        )
    return objective


def _has_candidates(export_target: Any) -> bool:
    from keras_mvit2.export.target import ExportTarget

    return type(export_target).candidates is not ExportTarget.candidates


def _selected(candidates: list[Candidate], only: Sequence[str] | None) -> list[Candidate]:
    if only is None:
        return candidates
    known = [c.name for c in candidates]
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise ValueError(f"Unknown candidates {unknown}; this target's are {known}.")
    return [c for c in candidates if c.name in set(only)]


def _measure(export_target: Any, candidate: Candidate, model: Any, path: str,
             data: OptimizeData, keras_top1: np.ndarray, reference_top1: float,
             max_drop: float, can_time: bool, latency_runs: int,
             threads: int) -> CandidateResult:
    """Builds `candidate` at `path` and measures it (errors are recorded, not raised)."""
    result = CandidateResult(candidate.name, dict(candidate.recipe), None, None,
                             candidate.measured_by, candidate.exact, note=candidate.note)
    try:
        found = candidate.build(path)
    except Exception as err:  # a recipe the runtime or converter refuses: reported
        result.error = f"{type(err).__name__}: {err}"
        return result
    if isinstance(found, dict):  # what the build chose (e.g. the faster token-sum form)
        result.recipe.update(found)
    result.path = path
    result.size_bytes = disk_size(path)
    if not candidate.measurable:
        result.within_budget = False
        return result
    outputs = export_target.outputs_here(model, path, data.held_out)
    top1 = np.asarray(outputs).argmax(-1)
    result.top1 = float(np.mean(top1 == data.labels))
    result.agreement = float(np.mean(top1 == keras_top1))
    result.drop_points = 100.0 * (reference_top1 - result.top1)
    result.within_budget = result.drop_points <= max_drop + 1e-9
    if can_time:
        try:
            record = export_target.bench(path, threads=threads, runs=latency_runs,
                                         warmup=max(3, latency_runs // 10),
                                         measure_memory=False)
        except NotImplementedError:
            return result
        stats = record.latency_ms
        result.latency_ms = stats.median if stats.median is not None else stats.min
    return result


def _rank_key(result: CandidateResult, objective: str) -> tuple:
    latency = result.latency_ms if result.latency_ms is not None else float("inf")
    if objective == "latency":
        return (latency, result.size_bytes, -(result.top1 or 0.0))
    return (result.size_bytes, latency, -(result.top1 or 0.0))


def best_within(results: Sequence[CandidateResult], max_drop: float,
                objective: str = "size") -> CandidateResult | None:
    """The candidate `optimize` would choose from these measurements for another budget
    (None when none is within it): the same rule, without building anything again."""
    eligible = [r for r in results if r.error is None and r.drop_points is not None
                and r.drop_points <= max_drop + 1e-9]
    if not eligible:
        return None
    return min(eligible, key=lambda r: _rank_key(r, objective))


def _ship(path: str, out: str, suffix: str) -> str:
    """Copies the chosen file to `out/best<suffix>` (atomically)."""
    best = os.path.join(out, "best" + suffix)
    with atomic_output(best) as tmp:
        if os.path.isdir(path):
            shutil.copytree(path, tmp)
        else:
            shutil.copyfile(path, tmp)
    return best


def _over_budget_message(result: OptimizeResult) -> str:
    measured = [r for r in result.candidates if r.drop_points is not None]
    if not measured:
        return "No candidate could be measured on this host; nothing was chosen."
    closest = min(measured, key=lambda r: r.drop_points)
    return (
        f"No candidate keeps the top-1 drop within {result.max_drop:g} points (float Keras "
        f"top-1 {100 * result.reference_top1:.2f} % on {result.data['num_held_out']} held-out "
        f"images). The closest is {closest.name!r}: {closest.drop_points:.2f} points, "
        f"{closest.size_bytes / 1e6:.2f} MB ({closest.path}). Raise --max-drop or ship "
        "the float model."
    )


def _line(result: CandidateResult) -> str:
    if result.error:
        return f"  {result.name:<28} failed: {result.error.splitlines()[0][:120]}"
    size = f"{result.size_bytes / 1e6:7.2f} MB"
    if result.top1 is None:
        return f"  {result.name:<28} {size}  accuracy not measurable here"
    latency = f"  {result.latency_ms:7.2f} ms" if result.latency_ms is not None else ""
    mark = "within budget" if result.within_budget else "over budget"
    return (f"  {result.name:<28} {size}  top-1 {100 * result.top1:6.2f} %  "
            f"agreement {100 * result.agreement:6.2f} %  drop {result.drop_points:+.2f}"
            f"{latency}  {mark}")
