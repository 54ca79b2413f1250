"""The TFLite (LiteRT) export target: `to_tflite` and friends behind `ExportTarget`."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from keras_mvit2.export.roads import check_road
from keras_mvit2.export.target import ConvertArguments, ExportTarget, register_target
from keras_mvit2.export.tflite.inspect import TFLiteReport, inspect_tflite
from keras_mvit2.export.tflite.metadata import read_tflite_metadata
from keras_mvit2.export.tflite.quantization import (
    CALIBRATED,
    QUANTIZATIONS,
    TFLITE_QUANTIZATIONS,
    TFLiteQuantization,
    resolve_quantization,
)
from keras_mvit2.export.tflite.run import run_tflite

#: ``--io-dtype`` values: every I/O type some quantization takes.
IO_DTYPE_CHOICES = ("float32", "int8", "uint8", "int16")


def _batch_size(value: str) -> int | None:
    """``--batch-size``: a positive int, or None for 'dynamic'."""
    if value == "dynamic":
        return None
    try:
        batch = int(value)
    except ValueError:
        batch = 0
    if batch < 1:
        raise ValueError(f"--batch-size must be a positive int or 'dynamic'. Received: {value!r}")
    return batch


#: The TensorFlow road's `mvit2 export` flags, each with its value when not given.
_TENSORFLOW_ROAD_FLAGS = {"--io-dtype": ("io_dtype", "float32"),
                          "--batch-size": ("batch_size", "1"),
                          "--allow-float-ops": ("allow_float_ops", False),
                          "--float-layers": ("float_layers", None),
                          "--activation-ranges": ("activation_ranges", None),
                          "--no-fuse-pointwise": ("fuse_pointwise", True)}


def _torch_road_cli_arguments(args: Any, quantization: str | TFLiteQuantization
                              ) -> dict[str, Any]:
    """`mvit2 export --road torch` to `.tflite`: the options `to_tflite_via_torch` takes (a
    calibrated format reads `--calibration-data` without TensorFlow); a ValueError naming
    the TensorFlow road's flags given."""
    given = [flag for flag, (name, unset) in _TENSORFLOW_ROAD_FLAGS.items()
             if getattr(args, name, unset) != unset]
    if given:
        raise ValueError(f"{', '.join(given)}: options of the TensorFlow road (to_tflite), "
                         "which --road torch does not take; drop them or pass --road "
                         "tensorflow.")
    quant = resolve_quantization(quantization)
    _check_calibration_flags(args, quant)
    calibration = ({"calibration_data": args.calibration_data,
                    "num_calibration_samples": args.num_calibration_samples}
                   if quant.calibrated else {})
    return {"road": "torch", "quantization": quant.name, "sidecar": args.sidecar,
            **calibration}


def _check_calibration_flags(args: Any, quantization: str | TFLiteQuantization) -> None:
    """`--calibration-data` given exactly when the format calibrates (both roads)."""
    quant = resolve_quantization(quantization)
    if args.calibration_data and not quant.calibrated:
        raise ValueError(
            "--calibration-data is only used by --quantization int8/int16x8. Received: "
            f"--quantization {quant.name}"
        )
    if quant.calibrated and not args.calibration_data:
        raise ValueError(
            f"--quantization {quant.name} needs --calibration-data DIR|fashion_mnist: a "
            "few hundred real images to calibrate the activation ranges (or use "
            "--quantization dynamic_int8, which needs no data)."
        )


class TFLiteTarget(ExportTarget):
    """`.tflite` files for LiteRT (Android, MediaPipe Tasks), builtin ops only.

    Options of `convert` besides the shared ones: `road` (`keras_mvit2.export.roads`:
    ``"tensorflow"``, `to_tflite`; ``"torch"``, `to_tflite_via_torch`; default the Keras
    backend's) and those of the road's converter (TensorFlow: `io_dtype`, `batch_size`,
    `num_calibration_samples`, `sidecar`, `allow_float_ops`, `calibration_seed`,
    `fuse_pointwise`, `float_layers`, `activation_ranges`, `forms`; torch:
    `TORCH_ROAD_OPTIONS`).
    """

    name = "tflite"
    display_name = "TFLite"
    suffixes = (".tflite",)
    formats = QUANTIZATIONS
    calibrated_formats = CALIBRATED
    runtime = "LiteRT"

    def _convert(self, model: Any, path: str | os.PathLike, shared: ConvertArguments,
                 options: dict[str, Any]) -> TFLiteReport:
        if check_road(shared.road, self.name) == "torch":
            from keras_mvit2.export.tflite.torch_road import to_tflite_via_torch

            self.check_options(options, to_tflite_via_torch)
            return to_tflite_via_torch(
                model, path, quantization=self.check_format(shared.quantization),
                calibration_data=shared.calibration_data, class_names=shared.class_names,
                metadata=shared.metadata, image_size=shared.image_size, **options)
        from keras_mvit2.export.tflite.convert import to_tflite

        self.check_options(options, to_tflite)
        return to_tflite(model, path, quantization=self.check_format(shared.quantization),
                         representative_data=shared.calibration_data,
                         class_names=shared.class_names, metadata=shared.metadata,
                         image_size=shared.image_size, **options)

    def add_cli_arguments(self, group: Any) -> None:
        group.add_argument("--calibration-data", metavar="DIR|fashion_mnist",
                           help="images for int8/int16x8 calibration: a folder of class "
                                "sub-folders, or fashion_mnist")
        group.add_argument("--num-calibration-samples", type=int, default=200, metavar="N",
                           help="calibration images (default 200)")
        group.add_argument("--io-dtype", choices=IO_DTYPE_CHOICES, default="float32",
                           help="input/output type: float32 (default); int8/uint8 for int8; "
                                "int16 for int16x8")
        group.add_argument("--batch-size", default="1", metavar="N|dynamic",
                           help="fixed batch of the graph (default 1) or 'dynamic'")
        group.add_argument("--sidecar", action="store_true",
                           help="also write the metadata JSON next to the model "
                                "(<output>.json)")
        group.add_argument("--allow-float-ops", action="store_true",
                           help="int8: accept ops left in float instead of failing, and "
                                "run the attention weights' SOFTMAX in float inside XNNPACK "
                                "(faster on a multi-core CPU; not for integer-only "
                                "accelerators)")
        group.add_argument("--float-layers", metavar="LAYER[,LAYER...]",
                           help="int8: keep these Keras layers in float (comma-separated "
                                "names or paths as `mvit2 validate --per-layer` lists "
                                "them); the rest stays int8")
        group.add_argument("--activation-ranges", metavar="p99.99|mse|minmax|pPERCENT",
                           help="int8/int16x8: how each activation's range is chosen from the "
                                "calibration images: its two-sided 99.99 %% interval (the int8 "
                                "default), least squared error (mse) or the converter's global "
                                "min / max (minmax, the int16x8 default); see docs/int8.md")
        group.add_argument("--no-fuse-pointwise", dest="fuse_pointwise", action="store_false",
                           help="keep back-to-back 1x1 convolutions apart (by default each "
                                "such pair is fused into one: same function, fewer MACs)")

    def cli_arguments(self, args: Any) -> dict[str, Any]:
        quant = resolve_quantization(self.check_format(args.quantization))
        quantization = quant.name
        road = getattr(args, "road", None)
        if road is not None and check_road(road, self.name) == "torch":
            return _torch_road_cli_arguments(args, quant)
        _check_calibration_flags(args, quant)
        float_layers = [n.strip() for n in (args.float_layers or "").split(",") if n.strip()]
        if float_layers and not quant.float_layers:
            raise ValueError(
                "--float-layers keeps layers in float inside a full-int8 model: it needs "
                f"--quantization int8. Received: --quantization {quantization}"
            )
        options = {"float_layers": float_layers} if float_layers else {}
        if args.activation_ranges is not None:
            if not quant.calibrated:
                raise ValueError(
                    "--activation-ranges applies to --quantization int8/int16x8. Received: "
                    f"--quantization {quantization}"
                )
            options["activation_ranges"] = args.activation_ranges
        return {
            **options,
            **({"road": road} if road is not None else {}),
            "quantization": quantization,
            "calibration_data": args.calibration_data,
            "num_calibration_samples": args.num_calibration_samples,
            "io_dtype": args.io_dtype,
            "batch_size": _batch_size(args.batch_size),
            "sidecar": args.sidecar,
            "allow_float_ops": args.allow_float_ops,
            "fuse_pointwise": args.fuse_pointwise,
        }

    def inspect(self, path: str | os.PathLike) -> TFLiteReport:
        return inspect_tflite(path)

    def run(self, path: str | os.PathLike, images: np.ndarray, *,
            num_threads: int = 1) -> np.ndarray:
        return run_tflite(path, images, num_threads=num_threads)

    def metadata(self, path: str | os.PathLike) -> dict[str, Any]:
        info = dict(read_tflite_metadata(path) or {})
        info.setdefault("quantization", None)
        info.setdefault("class_names", None)
        return info

    def report_rows(self, report: TFLiteReport) -> list[tuple[str, str]]:
        meta = report.metadata or {}
        quant = meta.get("quantization", "?")
        rows = [("quantization", str(quant))]
        for what, tensors in (("input", report.inputs), ("output", report.outputs)):
            for t in tensors:
                q = f", scale {t.quantization[0]:.6g}, zero point {t.quantization[1]}" if (
                    t.quantization[0]) else ""
                rows.append((what, f"{t.name} {list(t.shape_signature)} {t.dtype}{q}"))
        rows.append(("size", f"{report.size_bytes / 1e6:.2f} MB"))
        rows.append(("ops", f"{report.num_ops}: " + ", ".join(
            f"{k} {v}" for k, v in report.op_histogram.items())))
        if getattr(TFLITE_QUANTIZATIONS.get(quant), "calibrated", False):
            left = ", ".join(f"{k} {v}" for k, v in report.float_ops.items()) or "none"
            rows.append(("float ops left", left))
        rows.append(("XNNPACK partitions", str(report.num_xnnpack_partitions)))
        outside = report.ops_outside_xnnpack or {}
        rows.append(("ops outside XNNPACK", f"{report.num_ops_outside_xnnpack}" + (
            ": " + ", ".join(f"{k} {v}" for k, v in outside.items()) if outside else "")))
        fused = meta.get("graph_optimizations")
        rows.append(("fused 1x1 conv pairs", "off (--no-fuse-pointwise)" if fused is None else (
            f"{fused['fused_pointwise_convolutions']} "
            f"({fused['macs_saved'] / 1e6:.1f} M MACs saved)")))
        forms = meta.get("forms")
        rows.append(("export forms", "-" if not forms else ", ".join(
            f"{k} {v}" for k, v in forms.items())))
        rows.append(("max tensor rank", str(report.max_tensor_rank)))
        rows.append(("flex / custom ops", str(report.flex_ops + report.custom_ops or "none")))
        names = meta.get("class_names")
        rows.append(("class names", f"{len(names)}: {', '.join(names[:5])}..." if names else "-"))
        rows.append(("metadata", "embedded ('keras_mvit2' entry)" if meta else "none"))
        return rows


TFLITE = register_target(TFLiteTarget())
