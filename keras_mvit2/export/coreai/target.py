"""The Core AI export target: `to_coreai` and friends behind `ExportTarget`."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from keras_mvit2.backend import keras_backend_name
from keras_mvit2.export.coreai.inspect import (
    CoreAIReport,
    coreai_predictions_available,
    inspect_coreai,
    run_coreai,
)
from keras_mvit2.export.roads import check_road, default_road
from keras_mvit2.export.target import ConvertArguments, ExportTarget, register_target

#: The note a report carries where Core AI cannot run (anything but macOS).
PREDICTIONS_NOTE = (
    "Core AI runs assets on macOS only (its runtime fails to load them on Linux); here "
    "the program's summary and metadata are read."
)


def _check_torch_road(road: str | None) -> None:
    """A ValueError unless `road` (None: the backend's) is ``"torch"`` and this process can
    take it."""
    if (road or default_road()) != "torch":
        raise ValueError(
            "Core AI converts from PyTorch only (coreai-torch): take road='torch' on "
            "KERAS_BACKEND=torch, e.g. `mvit2 export model.keras -o out.aimodel --road torch` "
            "(which re-runs itself on PyTorch) or `KERAS_BACKEND=torch mvit2 export "
            f"model.keras -o out.aimodel`. Received: road={road!r} on Keras' "
            f"{keras_backend_name()!r} backend")
    check_road(road, "coreai")


class CoreAITarget(ExportTarget):
    """`.aimodel` assets for Apple's Core AI (iOS / macOS 27), float32, PyTorch road only.

    Core AI converts from PyTorch only (coreai-torch), so its one road is ``"torch"``
    (`keras_mvit2.export.roads`): `convert` needs ``KERAS_BACKEND=torch``. Options besides
    the shared ones: `minimum_os`.
    """

    name = "coreai"
    display_name = "Core AI"
    suffixes = (".aimodel",)
    formats = ("float32",)
    runtime = "Core AI"

    def _convert(self, model: Any, path: str | os.PathLike, shared: ConvertArguments,
                 options: dict[str, Any]) -> CoreAIReport:
        _check_torch_road(shared.road)
        from keras_mvit2.export.coreai.convert import to_coreai

        self.check_options(options, to_coreai)
        if shared.calibration_data is not None:
            raise ValueError("Core AI exports are float32: drop calibration_data.")
        return to_coreai(model, path, quantization=self.check_format(shared.quantization),
                         class_names=shared.class_names, metadata=shared.metadata,
                         image_size=shared.image_size, **options)

    def cli_arguments(self, args: Any) -> dict[str, Any]:
        road = getattr(args, "road", None)
        _check_torch_road(road)
        return {**({"road": road} if road is not None else {}),
                "quantization": self.check_format(args.quantization)}

    def inspect(self, path: str | os.PathLike) -> CoreAIReport:
        return inspect_coreai(path)

    def can_run(self) -> bool:
        return coreai_predictions_available()

    def host_note(self) -> str | None:
        return None if self.can_run() else PREDICTIONS_NOTE

    def run(self, path: str | os.PathLike, images: np.ndarray, *,
            num_threads: int = 1) -> np.ndarray:
        return run_coreai(path, images)

    def metadata(self, path: str | os.PathLike) -> dict[str, Any]:
        info = dict(inspect_coreai(path).metadata)
        info["quantization"] = info.get("keras_mvit2.precision")
        info["class_names"] = info.get("keras_mvit2.class_names")
        return info

    def report_rows(self, report: CoreAIReport) -> list[tuple[str, str]]:
        names = report.metadata.get("keras_mvit2.class_names")
        return [
            ("size", f"{report.size_bytes / 1e6:.2f} MB"),
            ("minimum OS", str(report.minimum_os)),
            ("ops", f"{report.num_ops}: " + ", ".join(
                f"{k} {v}" for k, v in report.op_histogram.items() if k != "constant")),
            ("constants", str(report.op_histogram.get("constant", 0))),
            ("inputs", json.dumps(report.inputs, ensure_ascii=False)),
            ("outputs", json.dumps(report.outputs, ensure_ascii=False)),
            ("class names", f"{len(names)}: {', '.join(names[:5])}..." if names else "-"),
        ]


COREAI = register_target(CoreAITarget())
