"""The Core ML export target: `to_coreml` and friends behind `ExportTarget`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from keras_mvit2.export.coreml.convert import PRECISIONS, to_coreml
from keras_mvit2.export.coreml.inspect import (
    CoreMLReport,
    coreml_class_names,
    coreml_predictions_available,
    inspect_coreml,
    run_coreml,
)
from keras_mvit2.export.target import ExportTarget, register_target

#: The note a report carries where Core ML cannot run (anything but macOS).
PREDICTIONS_NOTE = "Core ML predictions need macOS; on Linux only the structure is checked."


class CoreMLTarget(ExportTarget):
    """`.mlpackage` ML Programs for iPhone (Core ML), float16 by default.

    Options of `convert` besides the shared ones: those of `to_coreml` (`image_input`,
    `minimum_deployment_target`, `weight_compression`, `palettize_bits`, `prune_sparsity`,
    `fuse_pointwise`). Core ML is not calibrated: `calibration_data` must be None.
    """

    name = "coreml"
    display_name = "Core ML"
    suffixes = (".mlpackage",)
    formats = tuple(sorted(PRECISIONS, key=lambda p: p != "float16"))  # float16 first
    runtime = "Core ML"

    def convert(self, model: Any, path: str | os.PathLike, *,
                quantization: str | None = None,
                class_names: Sequence[str] | None = None,
                calibration_data: Any = None,
                metadata: Mapping[str, Any] | None = None,
                image_size: int | tuple[int, int] | None = None,
                **options: Any) -> CoreMLReport:
        self.check_options(options, to_coreml)
        if calibration_data is not None:
            raise ValueError(
                "Core ML exports are not calibrated: drop calibration_data (compress the "
                "weights with weight_compression='int8' / 'palettize' instead)."
            )
        return to_coreml(model, path, quantization=self.check_format(quantization),
                         class_names=class_names,
                         metadata=None if metadata is None else dict(metadata),
                         image_size=image_size, **options)

    def inspect(self, path: str | os.PathLike) -> CoreMLReport:
        return inspect_coreml(path)

    def can_run(self) -> bool:
        return coreml_predictions_available()

    def run(self, path: str | os.PathLike, images: np.ndarray, *,
            num_threads: int = 1) -> np.ndarray:
        return run_coreml(path, np.asarray(images, np.float32) * 255.0)

    def metadata(self, path: str | os.PathLike) -> dict[str, Any]:
        report = inspect_coreml(path)
        info: dict[str, Any] = dict(report.metadata)
        precision = info.get("keras_mvit2.precision")
        compression = info.get("keras_mvit2.weight_compression")
        quantization = precision
        if precision and compression and compression != "None":
            quantization = f"{precision}, {compression} weights"
        info["quantization"] = quantization
        info["class_names"] = coreml_class_names(path)
        return info

    def report_rows(self, report: CoreMLReport) -> list[tuple[str, str]]:
        return [
            ("spec version", str(report.spec_version)),
            ("size", f"{report.size_bytes / 1e6:.2f} MB"),
            ("ops", f"{report.num_ops}: " + ", ".join(
                f"{k} {v}" for k, v in report.op_histogram.items() if k != "const")),
            ("constants", str(report.op_histogram.get("const", 0))),
            ("max tensor rank", str(report.max_tensor_rank)),
            ("inputs", json.dumps(report.inputs)),
            ("outputs", json.dumps(report.outputs)),
        ]


COREML = register_target(CoreMLTarget())
