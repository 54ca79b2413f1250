"""`optimize`: every candidate of a target built, measured on held-out images, the best
one within the accuracy budget shipped.

The budget is a drop in top-1 accuracy, in percentage points, against the float Keras
model on the same held-out images. A candidate is eligible when its accuracy was measured
on this host (LiteRT for TFLite; Keras with the package's own weights for Core ML's
weight-only compression) and its drop is at most `max_drop`. Among the eligible ones the
objective picks (`OBJECTIVES`):

- ``"size_fast"`` (the default): the smallest file that is not slower than the float32
  candidate timed in the same run on this host (median latency at most float32's; float32
  itself always qualifies). Where float32 was not timed in the run (its runtime does not
  run here, as Core ML off macOS, or `only` left it out) speeds cannot be compared and it
  chooses as ``"size"`` does, said in `OptimizeResult.objective_note`;
- ``"size"``: the smallest file whatever its speed (then the faster, then the more
  accurate): it may ship a file slower than float32;
- ``"latency"``: the fastest on this host (then the smaller).

No eligible candidate is an `OverBudgetError` naming the closest one: nothing that breaks
the budget (or, under ``"size_fast"``, runs slower than float32) is called best.

Quantization-aware training (`QATSettings`): given training images, the optimizer of a
target that has one (TFLite) builds the ``qat_int8`` candidate (a short quantization-aware
training of the ``int8`` candidate's own graph, `keras_mvit2.quantize.qat`; the trained file
only where its exact paired test chooses it, else the post-training file) only when no
post-training int8 candidate meets the budget (`qat_decision`): it costs minutes where the
others cost seconds.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mvit2.optimizer.candidate import Candidate, CandidateResult
from keras_mvit2.optimizer.data import OptimizeData, load_optimize_data
from keras_mvit2.optimizer.qat_settings import (
    QAT_BATCH_SIZE,
    QAT_CANDIDATE,
    QAT_EPOCHS,
    QAT_LEARNING_RATE,
    QAT_MAX_STEPS,
    QATSettings,
    qat_settings,
)
from keras_mvit2.optimizer.targets import (
    CANDIDATES,
    QAT_CANDIDATES,
    candidates_of,
    qat_candidate_of,
)
from keras_mvit2.utils.files import atomic_output, disk_size

__all__ = [
    "DEFAULT_OBJECTIVE", "OBJECTIVES", "QAT_BATCH_SIZE", "QAT_CANDIDATE", "QAT_EPOCHS",
    "QAT_LEARNING_RATE",
    "QAT_MAX_STEPS", "OptimizeResult", "OverBudgetError", "QATSettings", "best_within",
    "compare_with_float", "float_reference", "objective_note", "optimize", "qat_decision",
    "qat_settings",
]

OBJECTIVES = ("size_fast", "size", "latency")
#: What `optimize`, `mvit2 optimize` and `mvit2 finetune --max-drop` minimise by default.
DEFAULT_OBJECTIVE = "size_fast"
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
        latency_setup: how each file was timed on this host (None: not timed here).
        objective_note: how the objective was applied where it could not be as stated
            (``"size_fast"`` without a float32 timed in the run), else None.
        qat: whether the ``qat_int8`` candidate was built and why (`qat_decision`), and
            its settings.
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
    objective_note: str | None = None
    qat: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["best"] = None if self.best is None else self.best.name
        return out


def optimize(model: Any, output_dir: str | os.PathLike, *, target: str = "tflite",
             data: str | os.PathLike | OptimizeData = "fashion_mnist", max_drop: float = 0.5,
             objective: str = DEFAULT_OBJECTIVE, class_names: Sequence[str] | None = None,
             num_calibration: int = 200, num_held_out: int = 1000,
             latency_runs: int = 50, threads: int = 1,
             only: Sequence[str] | None = None, qat: QATSettings | None = None,
             verbose: bool = True) -> OptimizeResult:
    """Ships the smallest file of `target` within the top-1 budget that is not slower than
    float32 on this host (or, by `objective`, the smallest or the fastest).

    Args:
        model: the float Keras classifier (fixed input size).
        output_dir: gets ``candidates/`` (every file built), ``best.<suffix>``,
            ``report.json`` and ``pareto.png``.
        target: an export target name (`keras_mvit2.export.available_targets()`).
        data: a folder of class sub-folders, ``"fashion_mnist"``, or `OptimizeData`
            (see `keras_mvit2.optimizer.data`: calibration and held-out images are
            disjoint).
        max_drop: the largest top-1 drop allowed, in percentage points, against the
            float Keras model on the held-out images.
        objective: ``"size_fast"`` (default: the smallest file not slower than float32
            on this host), ``"size"`` (the smallest, whatever its speed) or ``"latency"``
            (the fastest on this host; needs the runtime here). See the module docstring.
        class_names: written into every file (default: the data's class names).
        num_calibration: calibration images read from `data`.
        num_held_out: held-out images read from `data`.
        latency_runs: timed runs per candidate (median reported), 1 image each.
        threads: runtime threads for the latency.
        only: build only the candidates of these names (default: all of the target's;
            ``"qat_int8"`` among them builds it whatever the other int8 files measure).
        qat: training images and schedule of the ``qat_int8`` candidate, built when no
            post-training int8 candidate meets the budget (`qat_decision`); None: never.
        verbose: print a line per candidate (the QAT worker's progress is streamed by
            `qat.verbose`).

    Returns:
        `OptimizeResult` (also written as ``report.json``).

    Raises:
        OverBudgetError: no candidate meets `max_drop` (under ``"size_fast"``: none that
            meets it is as fast as float32); the report is still written.
    """
    from keras_mvit2.export.target import get_target
    from keras_mvit2.optimizer.report import plot_pareto, write_report

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
        candidates = candidates_of(export_target, model, calibration_data=data.calibration,
                                   class_names=names)
    except NotImplementedError as err:
        raise ValueError(f"{err} Optimize for one of {sorted(CANDIDATES)}.") from None
    qat_asked = only is not None and QAT_CANDIDATE in only
    has_qat = export_target.name in QAT_CANDIDATES
    if qat_asked and not has_qat:
        raise ValueError(f"{export_target.display_name} has no {QAT_CANDIDATE!r} candidate "
                         "(quantization-aware training makes TFLite files); leave it out of "
                         "--only.")
    if qat_asked and qat is None:
        raise ValueError(f"The {QAT_CANDIDATE!r} candidate trains on training images; pass "
                         "them (qat=QATSettings(train_data=...), --train-data DIR).")

    def qat_candidate() -> Candidate:
        return qat_candidate_of(export_target, model, qat, calibration_data=data.calibration,
                                class_names=names, training_class_names=data.class_names,
                                held_out=(data.held_out, data.labels))

    asked = None
    if qat_asked:  # before anything is built: a missing extra is said at once
        try:
            asked = qat_candidate()
        except NotImplementedError as err:
            raise ValueError(f"{err} (or leave {QAT_CANDIDATE!r} out of --only)") from None
    candidates = _selected(candidates, None if only is None else
                           [n for n in only if n != QAT_CANDIDATE])
    folder = os.path.join(out, CANDIDATES_FOLDER)
    os.makedirs(folder, exist_ok=True)
    can_time = bool(export_target.can_run())  # then `bench_file` times its files here
    if objective == "latency" and not can_time:
        raise ValueError(
            f"objective='latency' needs {export_target.runtime} on this host, which is not "
            f"available here ({export_target.host_note()}); use objective='size'."
        )
    results: list[CandidateResult] = []

    def measure(candidate: Candidate) -> None:
        path = os.path.join(folder, candidate.name + export_target.suffixes[0])
        measured = _measure(export_target, candidate, model, path, data, keras_top1,
                            reference_top1, max_drop, can_time, latency_runs, threads)
        results.append(measured)
        if verbose:
            print(_line(measured, float_reference(results)), flush=True)

    for candidate in candidates:
        measure(candidate)
    build_qat, reason = qat_decision(results, max_drop, qat, only)
    if not has_qat:
        build_qat, reason = False, (f"{export_target.display_name} has no "
                                    "quantization-aware-trained candidate")
    if build_qat:
        try:
            candidate = asked or qat_candidate()
        except NotImplementedError as err:  # the target has no such candidate
            build_qat, reason = False, str(err)
        else:
            if verbose:
                print(f"  {QAT_CANDIDATE}: {reason}: quantization-aware training "
                      f"({qat.max_steps} steps at most)", flush=True)
            measure(candidate)
    compare_with_float(results)
    result = OptimizeResult(
        target=export_target.name, objective=objective, max_drop=float(max_drop),
        data=data.describe(), reference_top1=reference_top1, candidates=results,
        latency_setup={"runtime": export_target.runtime, "threads": threads,
                       "runs": latency_runs, "batch": 1} if can_time else None,
        objective_note=objective_note(results, objective, can_time),
        qat={"built": build_qat, "reason": reason,
             "settings": None if qat is None else qat.describe()},
    )
    result.best = best_within(results, max_drop, objective)
    if result.best is not None:
        result.best_path = _ship(result.best.path, out, export_target.suffixes[0])
    result.plot_path = plot_pareto(result, os.path.join(out, "pareto.png"))
    result.report_path = write_report(result, os.path.join(out, "report.json"))
    if result.best is None:
        raise OverBudgetError(_over_budget_message(result), result)
    return result


def _check_objective(objective: Any) -> str:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}. Received: {objective!r}")
    return objective


def _checked(objective: str, max_drop: Any, model: Any) -> str:
    _check_objective(objective)
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


def _selected(candidates: list[Candidate], only: Sequence[str] | None) -> list[Candidate]:
    if only is None:
        return candidates
    known = [c.name for c in candidates]
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise ValueError(f"Unknown candidates {unknown}; this target's are {known} (and "
                         f"{QAT_CANDIDATE!r} for TFLite, given training images).")
    return [c for c in candidates if c.name in set(only)]


def _measure(export_target: Any, candidate: Candidate, model: Any, path: str,
             data: OptimizeData, keras_top1: np.ndarray, reference_top1: float,
             max_drop: float, can_time: bool, latency_runs: int,
             threads: int) -> CandidateResult:
    """Builds `candidate` at `path` and measures it (errors are recorded, not raised)."""
    result = CandidateResult(candidate.name, dict(candidate.recipe), None, None,
                             candidate.measured_by, candidate.exact, note=candidate.note,
                             float_reference=candidate.float_reference)
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
        from keras_mvit2.latency.host import bench_file

        try:
            record = bench_file(path, target=export_target, threads=threads,
                                runs=latency_runs, warmup=max(3, latency_runs // 10),
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


def float_reference(results: Sequence[CandidateResult]) -> CandidateResult | None:
    """The float reference among `results` (the float32 file) where it was built and timed
    on this host, else None."""
    for r in results:
        if r.float_reference and r.error is None and r.latency_ms is not None:
            return r
    return None


def _not_slower(result: CandidateResult, reference: CandidateResult) -> bool:
    return result.latency_ms is not None and result.latency_ms <= reference.latency_ms


def compare_with_float(results: Sequence[CandidateResult]) -> None:
    """Sets each timed result's `latency_vs_float32` (its median over float32's) and
    `vs_float32` (``"faster"``, ``"slower"``, ``"as fast"``, ``"reference"``); leaves them
    None where float32 or the candidate was not timed in the run."""
    reference = float_reference(results)
    for r in results:
        r.latency_vs_float32 = r.vs_float32 = None
        if reference is None or r.latency_ms is None or r.error is not None:
            continue
        r.latency_vs_float32 = r.latency_ms / reference.latency_ms
        if r is reference:
            r.vs_float32 = "reference"
        elif r.latency_ms < reference.latency_ms:
            r.vs_float32 = "faster"
        else:
            r.vs_float32 = "as fast" if _not_slower(r, reference) else "slower"


def best_within(results: Sequence[CandidateResult], max_drop: float,
                objective: str = DEFAULT_OBJECTIVE) -> CandidateResult | None:
    """The candidate `optimize` would choose from these measurements for another budget
    (None when none is within it): the same rule, without building anything again.

    Under ``"size_fast"`` a candidate slower than the float32 result timed among `results`
    is not eligible; without such a float32 result the choice is by size alone
    (`objective_note` says so)."""
    _check_objective(objective)
    eligible = [r for r in results if r.error is None and r.drop_points is not None
                and r.drop_points <= max_drop + 1e-9]
    if objective == "size_fast":
        reference = float_reference(results)
        if reference is not None:
            eligible = [r for r in eligible if _not_slower(r, reference)]
    if not eligible:
        return None
    return min(eligible, key=lambda r: _rank_key(r, objective))


def objective_note(results: Sequence[CandidateResult], objective: str,
                   can_time: bool = True) -> str | None:
    """Why ``"size_fast"`` chose by size alone (no float32 timed in the run), else None."""
    if objective != "size_fast" or float_reference(results) is not None:
        return None
    if not can_time:
        why = "files of this target do not run on this host, so none was timed"
    elif not any(r.float_reference for r in results):
        why = "the run built no float32 candidate (--only)"
    else:
        why = "the float32 candidate could not be built or timed"
    return (f"objective size_fast compares each file's speed with float32's, but {why}: "
            "chosen by size alone (as objective size).")


def qat_decision(results: Sequence[CandidateResult], max_drop: float,
                 qat: QATSettings | None,
                 only: Sequence[str] | None = None) -> tuple[bool, str]:
    """Whether `optimize` builds the ``qat_int8`` candidate after measuring `results`, and
    why, in words.

    With `only` given it is built exactly when named there. Otherwise it is built when
    training images were given (`qat`) and no post-training int8 candidate (a file the
    converter quantized to full int8, some layers kept float included) is within
    `max_drop`: quantization-aware training is the fix for an int8 file that loses too
    much, and costs minutes where the others cost seconds.
    """
    if only is not None:
        if QAT_CANDIDATE in only:
            return True, f"{QAT_CANDIDATE!r} named in --only"
        return False, f"{QAT_CANDIDATE!r} not named in --only"
    int8 = [r for r in results if r.name != QAT_CANDIDATE and r.error is None
            and r.recipe.get("quantization") == "int8"]
    within = [r for r in int8 if r.drop_points is not None
              and r.drop_points <= max_drop + 1e-9]
    if within:
        best = min(within, key=lambda r: r.drop_points)
        return False, (f"the post-training int8 file {best.name!r} is within the budget "
                       f"({best.drop_points:+.2f} points): no quantization-aware training "
                       "needed")
    if qat is None:
        return False, ("no post-training int8 file is within the budget, and no training "
                       "images were given for quantization-aware training (--train-data "
                       "DIR)")
    if not int8:
        return True, "no post-training int8 file was built"
    return True, "no post-training int8 file is within the budget"


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
    within = [r for r in measured if r.error is None and r.drop_points <= result.max_drop + 1e-9]
    reference = float_reference(result.candidates)
    if within and result.objective == "size_fast" and reference is not None:
        slower = ", ".join(f"{r.name} ({r.latency_ms / reference.latency_ms:.2f}x)"
                           if r.latency_ms is not None else f"{r.name} (not timed)"
                           for r in sorted(within, key=lambda r: r.size_bytes))
        return (
            f"No candidate within {result.max_drop:g} top-1 points runs as fast as float32 "
            f"on this host ({reference.latency_ms:.2f} ms; float32 itself loses "
            f"{reference.drop_points:.2f} points): the ones within the budget are slower, by "
            f"their latency over float32's: {slower}. Pass --objective size (Python: "
            "objective='size') to ship the smallest of them anyway, or raise --max-drop."
        )
    closest = min(measured, key=lambda r: r.drop_points)
    return (
        f"No candidate keeps the top-1 drop within {result.max_drop:g} points (float Keras "
        f"top-1 {100 * result.reference_top1:.2f} % on {result.data['num_held_out']} held-out "
        f"images). The closest is {closest.name!r}: {closest.drop_points:.2f} points, "
        f"{closest.size_bytes / 1e6:.2f} MB ({closest.path}). Raise --max-drop or ship "
        "the float model."
    )


def _line(result: CandidateResult, reference: CandidateResult | None = None) -> str:
    if result.error:
        return f"  {result.name:<28} failed: {result.error.splitlines()[0][:120]}"
    size = f"{result.size_bytes / 1e6:7.2f} MB"
    if result.top1 is None:
        return f"  {result.name:<28} {size}  accuracy not measurable here"
    latency = f"  {result.latency_ms:7.2f} ms" if result.latency_ms is not None else ""
    if latency and reference is not None and result is not reference:
        latency += f" ({result.latency_ms / reference.latency_ms:.2f}x float32)"
    mark = "within budget" if result.within_budget else "over budget"
    return (f"  {result.name:<28} {size}  top-1 {100 * result.top1:6.2f} %  "
            f"agreement {100 * result.agreement:6.2f} %  drop {result.drop_points:+.2f}"
            f"{latency}  {mark}")
