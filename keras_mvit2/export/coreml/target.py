"""The Core ML export target: `to_coreml` and friends behind `ExportTarget`."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from keras_mvit2.export.coreml.description import PRECISIONS
from keras_mvit2.export.coreml.inspect import (
    CoreMLReport,
    coreml_class_names,
    coreml_predictions_available,
    inspect_coreml,
    run_coreml,
)
from keras_mvit2.export.roads import check_road
from keras_mvit2.export.target import ConvertArguments, ExportTarget, register_target

#: The note a report carries where Core ML cannot run (anything but macOS).
PREDICTIONS_NOTE = (
    "Core ML predictions need macOS (Core ML's runtime); on this platform only the "
    "structure of the ML Program is checked."
)


class CoreMLTarget(ExportTarget):
    """`.mlpackage` ML Programs for iPhone (Core ML), float16 by default.

    Options of `convert` besides the shared ones: `road` (`keras_mvit2.export.roads`:
    ``"tensorflow"``, `to_coreml`; ``"torch"``, `to_coreml_via_torch`; default the Keras
    backend's) and those of the road's converter (`image_input`,
    `minimum_deployment_target`, `weight_compression`, `palettize_bits`,
    `palettize_granularity`, `palettize_group_size`, `prune_sparsity`, `fuse_pointwise`;
    TensorFlow road only: `activation_quantization`; ready-made sets:
    `recipes.COMPRESSION_RECIPES`). Only activation quantization (W8A8) is calibrated:
    `calibration_data` must be None otherwise.
    """

    name = "coreml"
    display_name = "Core ML"
    suffixes = (".mlpackage", ".mlmodel")
    formats = tuple(sorted(PRECISIONS, key=lambda p: p != "float16"))  # float16 first
    runtime = "Core ML"

    def _convert(self, model: Any, path: str | os.PathLike, shared: ConvertArguments,
                 options: dict[str, Any]) -> CoreMLReport:
        quantization, class_names, metadata = (
            shared.quantization, shared.class_names, shared.metadata)
        calibration_data, image_size = shared.calibration_data, shared.image_size
        if check_road(shared.road, self.name) == "torch":
            from keras_mvit2.export.coreml.torch_road import to_coreml_via_torch

            self.check_options(options, to_coreml_via_torch)
            if calibration_data is not None:
                raise ValueError(
                    "The torch road makes no activation-quantized (W8A8) Core ML program, "
                    "the only calibrated one: drop calibration_data (weight compression "
                    "needs none), or take road='tensorflow'.")
            return to_coreml_via_torch(
                model, path, quantization=self.check_format(quantization),
                class_names=class_names, metadata=None if metadata is None else dict(metadata),
                image_size=image_size, **options)
        from keras_mvit2.export.coreml.convert import to_coreml

        self.check_options(options, to_coreml)
        if calibration_data is not None:
            if options.get("activation_quantization") is None:
                raise ValueError(
                    "Core ML exports are not calibrated unless activation_quantization='int8' "
                    "(W8A8): drop calibration_data, or set it (or compress the weights only, "
                    "with weight_compression='int8' / 'palettize')."
                )
            from keras_mvit2.export.calibration import calibration_images

            size = image_size or tuple(model.input_shape[1:3])
            if isinstance(size, int):
                size = (size, size)
            if None in size:
                raise ValueError("A model of dynamic input size needs image_size to calibrate "
                                 "its Core ML activations.")
            options["calibration_images"] = calibration_images(calibration_data,
                                                               image_size=tuple(size))
        return to_coreml(model, path, quantization=self.check_format(quantization),
                         class_names=class_names,
                         metadata=None if metadata is None else dict(metadata),
                         image_size=image_size, **options)

    def add_cli_arguments(self, group: Any) -> None:
        group.add_argument("--weight-compression", choices=("int8", "palettize", "prune"),
                           help="coremltools.optimize weight compression (default none)")
        group.add_argument("--deployment-target", default="iOS16",
                           help="minimum deployment target (default iOS16)")
        group.add_argument("--tensor-input", action="store_true",
                           help="float tensor input in [0, 1] instead of an RGB image input")

    def cli_arguments(self, args: Any) -> dict[str, Any]:
        road = getattr(args, "road", None)
        return {
            **({"road": check_road(road, self.name)} if road is not None else {}),
            "quantization": self.check_format(args.quantization),
            "image_input": not args.tensor_input,
            "minimum_deployment_target": args.deployment_target,
            "weight_compression": args.weight_compression,
        }

    def host_note(self) -> str | None:
        return None if self.can_run() else PREDICTIONS_NOTE

    def inspect(self, path: str | os.PathLike) -> CoreMLReport:
        return inspect_coreml(path)

    def outputs_here(self, model: Any, path: str | os.PathLike,
                     images: np.ndarray) -> np.ndarray:
        """Core ML's outputs on macOS; elsewhere the package's own MIL program run in
        TensorFlow with its own (decompressed) weights (`predict_with_package_weights`)."""
        if self.can_run():
            return self.run(path, images)
        from keras_mvit2.export.coreml.package_weights import predict_with_package_weights

        return predict_with_package_weights(model, path, images)

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
