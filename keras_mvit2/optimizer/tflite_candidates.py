"""The TFLite files `keras_mvit2.optimizer` tries, each measured in LiteRT here.

| candidate      | made by the TFLite converter                                       |
|----------------|--------------------------------------------------------------------|
| `float32`      | float; token sum in its faster exact form (below)                  |
| `float16`      | float16 weights; token sum in its faster exact form                |
| `dynamic_int8` | int8 weights, float activations                                    |
| `int8`         | full int8 (`mvit2 export`'s int8 file)                             |
| `int16x8`      | int16 activations, int8 weights, whole model                       |
| `int8_float_topK` | full int8, the K (1, 3) layers of largest int8 error kept float      |

The mixed int8 / float candidates rank the layers with `layer_errors` on calibration images
(never the held-out ones) by the error's standard deviation in output steps.

| candidate               | made by ai-edge-quantizer from the float32 file (weights only) |
|-------------------------|------------------------------------------------------------------|
| `weight_only_int8`      | int8 weights, float compute                                      |
| `weight_only_int4`      | int4 weights (depthwise kernels stay float)                      |
| `weight_only_int4_int8` | int4 for kernels of >= 4096 elements, int8 for the others        |

| `qat_int8` (given training images) | full int8 after a short quantization-aware training |

`qat_int8` (`qat_candidate`) is the `int8` file's own graph (the same ops, metadata, labels
and signature), written by `keras_mvit2.quantize.qat` after `QATSettings.epochs` passes over
the training images (at most `QATSettings.max_steps` steps each, a quarter of the images set
aside first to judge on): the quantization-aware-trained weights where the exact paired test
on the held-out and the set-aside images chooses them (p < 0.05, top-1 not lower, nothing
lower on the held-out images), else the post-training file itself; the optimizer builds it
only when no post-training int8 candidate meets the budget.

ai-edge-quantizer's calibrated full-int8 recipes are not candidates: the converter's full
int8 (fused 1x1 pairs, uint8 I/O) is the TFLite int8 candidate.

The separable attention's token sum has two exact forms (`keras_mvit2.layers.export_forms`):
a matrix product (the int8-safe form, the default) and a product-and-mean (Core ML's form).
Which one runs faster depends on the runtime and the model, so each float candidate is
converted in both, both are timed in LiteRT on this host (median of `FORM_TIMING_RUNS`
runs), and the faster one is kept; the recipe records both times. Models without that
attention have one form.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from keras_mvit2.optimizer.candidate import Candidate
from keras_mvit2.optimizer.qat_settings import QAT_CANDIDATE

__all__ = [
    "EDGE_WEIGHT_ONLY", "FORM_TIMING_RUNS", "RANK_BY", "SENSITIVE_FLOAT_K", "qat_candidate",
    "qat_facts", "tflite_candidates", "trained_file",
]

_MEASURED_BY = "LiteRT"
#: Timed runs per token-sum form of a float candidate (median compared).
FORM_TIMING_RUNS = 30


def tflite_candidates(model: Any, *, calibration_data: np.ndarray,
                      class_names: Sequence[str] | None = None) -> list[Candidate]:
    """The TFLite candidates for `model` (see the module docstring)."""
    from keras_mvit2.export.tflite.quantization import TFLITE_QUANTIZATIONS
    from keras_mvit2.layers.attention_registry import names_in

    def convert(quantization: str, path: str, *, product_mean: bool = False,
                float_layers: Sequence[str] | None = None) -> None:
        from keras_mvit2.export.tflite.convert import to_tflite
        from keras_mvit2.layers.export_forms import FLOAT_RUNTIME

        to_tflite(model, path, quantization=quantization,
                  class_names=list(class_names) if class_names is not None else None,
                  representative_data=(calibration_data
                                       if TFLITE_QUANTIZATIONS[quantization].calibrated
                                       else None),
                  num_calibration_samples=len(calibration_data),
                  float_layers=float_layers, forms=FLOAT_RUNTIME if product_mean else None,
                  metadata={"token_sum": "product_mean" if product_mean else "matmul"})

    two_forms = "separable" in names_in(model)
    candidates = []
    for quant in TFLITE_QUANTIZATIONS.values():
        recipe = {"quantization": quant.name, "quantizer": "TFLite converter"}
        if quant.calibrated:
            recipe["calibration_images"] = len(calibration_data)
        # The float candidates (float32, float16) are timed in both token-sum forms.
        build = (_faster_form(convert, quant.name) if two_forms and quant.float_weights
                 else _plain(convert, quant.name))
        candidates.append(Candidate(quant.name, recipe, build, _MEASURED_BY,
                                    float_reference=not quant.optimized))
    ranking = _Ranking(model, calibration_data)
    for k in SENSITIVE_FLOAT_K:
        candidates.append(Candidate(
            f"int8_float_top{k}",
            {"quantization": "int8", "quantizer": "TFLite converter",
             "calibration_images": len(calibration_data),
             "float_layers": f"the {k} layer(s) of largest int8 error",
             "ranked_by": RANK_BY},
            _int8_with_float_layers(convert, ranking, k), _MEASURED_BY))
    if _edge_quantizer_installed():
        float_source = _FloatSource(convert)
        for name, recipe in EDGE_WEIGHT_ONLY.items():
            candidates.append(Candidate(
                name, {"quantization": recipe, "quantizer": "ai-edge-quantizer",
                       "from": "float32"},
                _edge(float_source, recipe, class_names), _MEASURED_BY))
    return candidates


def qat_candidate(model: Any, settings: Any, *, calibration_data: np.ndarray,
                  class_names: Sequence[str] | None = None,
                  training_class_names: Sequence[str] | None = None,
                  io_dtype: str = "float32",
                  held_out: tuple[np.ndarray, np.ndarray] | None = None) -> Candidate:
    """The ``qat_int8`` candidate: `keras_mvit2.quantize.qat` on `settings`' training images
    (`settings.epochs` passes of at most `settings.max_steps` steps, towards the model's own
    probabilities), calibrated on `calibration_data`, `class_names` in the file; the QAT file
    where the paired test on `held_out` ``(images, labels)`` and the training images set
    aside chooses it, else the post-training file (the build's facts say which and why).
    """
    names = list(class_names) if class_names is not None else None
    expected = list(training_class_names) if training_class_names is not None else names
    recipe = {"quantization": "int8", "quantizer": "quantization-aware training",
              **settings.describe(), "io_dtype": io_dtype,
              "calibration_images": len(calibration_data)}

    def build(path: str) -> dict[str, Any]:
        from keras_mvit2.quantize.qat import qat

        size = tuple(int(d) for d in model.inputs[0].shape[1:3])
        images, labels = settings.images(size, expected)
        result = qat(model, (images, labels), epochs=settings.epochs,
                     learning_rate=settings.learning_rate, batch_size=settings.batch_size,
                     output_path=path, qat_path=trained_file(path),
                     representative_data=calibration_data, io_dtype=io_dtype,
                     num_calibration_samples=len(calibration_data), validation_data=held_out,
                     class_names=names, verbose=settings.verbose)
        return {**qat_facts(result), "trained_path": result.qat_path}

    return Candidate(QAT_CANDIDATE, recipe, build, _MEASURED_BY)


def trained_file(path: str) -> str:
    """Where the ``qat_int8`` build writing `path` also writes the quantization-aware-trained
    file, whichever file it chose (``candidates/qat_int8_trained.tflite``)."""
    root, suffix = os.path.splitext(path)
    return f"{root}_trained{suffix}"


def qat_facts(result: Any) -> dict[str, Any]:
    """What a `keras_mvit2.quantize.QATResult` chose and on what, as the optimizer's recipe
    and the export step's record keep it (JSON values)."""
    choice, held = result.choice, result.held_out_choice
    facts = {"training_images": result.training_images, "steps": result.steps,
             "qat_seconds": round(result.seconds, 1), "shipped": result.shipped,
             "reason": result.reason, "judged_on": result.judged_on,
             "judge_images": result.split.to_dict(), "num_judged": choice.num_images,
             "agreement_post_training": round(choice.agreement_a, 6),
             "agreement_qat": round(choice.agreement_b, 6),
             "only_post_training": choice.only_a, "only_qat": choice.only_b,
             "p_value": choice.p_value, "judged_top1_post_training": choice.top1_a,
             "judged_top1_qat": choice.top1_b}
    if held is not None:
        facts["held_out"] = {"num_images": held.num_images,
                             "agreement_post_training": held.agreement_a,
                             "agreement_qat": held.agreement_b,
                             "top1_post_training": held.top1_a, "top1_qat": held.top1_b}
    return facts


#: How many of the most sensitive layers the mixed int8 / float candidates keep in float.
SENSITIVE_FLOAT_K = (1, 3)
#: The `layer_errors` metric the mixed candidates rank by: the error's standard deviation in
#: output steps (a constant offset, such as the matrix products' before their second operand
#: had zero point 0, shifts every image alike; keeping a layer in float is for the error that
#: varies).
RANK_BY = "std_error_over_scale"
_RANKING_IMAGES = 100
#: Layers of the ranking written into each mixed candidate's recipe (report.json).
_RANKING_REPORTED = 10


class _Ranking:
    """The layers of `model`'s int8 file ranked by measured error, computed once, on
    calibration images (never the held-out ones)."""

    def __init__(self, model: Any, calibration_data: np.ndarray):
        self._model = model
        self._calibration = calibration_data
        self.errors: list[Any] | None = None

    def top(self, k: int, plot_folder: str) -> list[str]:
        """The `k` worst Keras layers; the first call also draws the ranking into
        `plot_folder/layer_errors.png`."""
        if self.errors is None:
            from keras_mvit2.export.tflite.layer_errors import layer_errors, plot_layer_errors

            self.errors = layer_errors(self._model, self._calibration[:_RANKING_IMAGES],
                                       calibration_data=self._calibration,
                                       num_calibration_samples=len(self._calibration),
                                       rank_by=RANK_BY)
            plot_layer_errors(self.errors, os.path.join(plot_folder, "layer_errors.png"),
                              metric=RANK_BY)
        return [e.layer for e in self.errors if e.mapped][:k]

    def summary(self, n: int = _RANKING_REPORTED) -> list[dict[str, Any]]:
        """The `n` worst layers, for the optimizer's report."""
        return [{"layer": e.layer, RANK_BY: round(e.std_error_over_scale, 3),
                 "rmse_over_scale": round(e.rmse_over_scale, 3), "worst_op": e.worst_op}
                for e in (self.errors or [])[:n]]


def _int8_with_float_layers(convert: Callable, ranking: _Ranking,
                            k: int) -> Callable[[str], dict[str, Any]]:
    def build(path: str) -> dict[str, Any]:
        # The ranking's chart goes beside report.json (the candidates' parent folder).
        layers = ranking.top(k, os.path.dirname(os.path.dirname(os.path.abspath(path))))
        convert("int8", path, float_layers=layers)
        return {"float_layers": layers, "layer_ranking": ranking.summary(),
                "layer_ranking_plot": "layer_errors.png"}
    return build


#: Candidate name -> ai-edge-quantizer recipe (`export.tflite.edge_quantizer.EDGE_RECIPES`).
EDGE_WEIGHT_ONLY = {
    "weight_only_int8": "weight_only_wi8_afp32",
    "weight_only_int4": "weight_only_wi4_afp32",
    "weight_only_int4_int8": "weight_only_wi4_wi8",
}


def _edge_quantizer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ai_edge_quantizer") is not None


class _FloatSource:
    """The float32 file the ai-edge-quantizer candidates start from, converted once."""

    def __init__(self, convert: Callable):
        self._convert = convert
        self._folder: tempfile.TemporaryDirectory | None = None

    def path(self) -> str:
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory()
            self._convert("float32", os.path.join(self._folder.name, "float32.tflite"))
        return os.path.join(self._folder.name, "float32.tflite")


def _edge(source: _FloatSource, recipe: str,
          class_names: Sequence[str] | None) -> Callable[[str], None]:
    def build(path: str) -> None:
        from keras_mvit2.export.tflite.edge_quantizer import quantize_with_edge_quantizer

        quantize_with_edge_quantizer(source.path(), path, recipe=recipe,
                                     class_names=class_names)
    return build


def _plain(convert: Callable, quantization: str) -> Callable[[str], None]:
    def build(path: str) -> None:
        convert(quantization, path)
    return build


def _faster_form(convert: Callable, quantization: str) -> Callable[[str], dict[str, Any]]:
    """Builds both token-sum forms, keeps the one with the lower median latency at `path`."""
    from keras_mvit2.latency.host import bench_tflite

    def build(path: str) -> dict[str, Any]:
        times = {}
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as folder:
            files = {}
            for form in ("matmul", "product_mean"):
                files[form] = os.path.join(folder, f"{form}.tflite")
                convert(quantization, files[form], product_mean=form == "product_mean")
                stats = bench_tflite(files[form], threads=1, runs=FORM_TIMING_RUNS,
                                     warmup=5, measure_memory=False).latency_ms
                times[form] = stats.median if stats.median is not None else stats.min
            faster = min(times, key=times.get)
            os.replace(files[faster], path)
        return {"token_sum": faster,
                "token_sum_median_ms": {form: round(t, 4) for form, t in times.items()}}
    return build
