"""`mvit2 export` (TFLite / Core ML) and `mvit2 validate` (exported vs Keras on real images)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from keras_mvit2.utils.files import atomic_output

_QUANTIZATIONS = ("float32", "float16", "dynamic_int8", "int8", "int16x8")
_IO_DTYPES = ("float32", "int8", "uint8", "int16")


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a model to TFLite (Android) or Core ML (iPhone)",
        description=(
            "Export a .keras model or a registered model name to TFLite (optionally quantized; "
            "builtin ops only, checked in LiteRT) or to a Core ML ML Program (.mlpackage), "
            "and print the report."
        ),
    )
    p.add_argument("model", help="a .keras file, or a registered model name (see `mvit2 list`)")
    p.add_argument("-o", "--output", required=True,
                   help="output path (.tflite, or .mlpackage for Core ML)")
    p.add_argument("--format", choices=("tflite", "coreml"),
                   help="default: from the output suffix (.tflite / .mlpackage)")
    _model_args(p)
    g = p.add_argument_group("TFLite")
    g.add_argument("--quantization", choices=_QUANTIZATIONS, default="float32",
                   help="float32 (default), float16, dynamic_int8 (int8 weights), int8 "
                        "(full integer, needs --calibration-data) or int16x8")
    g.add_argument("--calibration-data", metavar="DIR|fashion_mnist",
                   help="images for int8/int16x8 calibration: a folder of class sub-folders, "
                        "or fashion_mnist")
    g.add_argument("--num-calibration-samples", type=int, default=200, metavar="N",
                   help="calibration images (default 200)")
    g.add_argument("--io-dtype", choices=_IO_DTYPES, default="float32",
                   help="input/output type: float32 (default); int8/uint8 for int8; int16 for "
                        "int16x8")
    g.add_argument("--batch-size", default="1", metavar="N|dynamic",
                   help="fixed batch of the graph (default 1) or 'dynamic'")
    g.add_argument("--sidecar", action="store_true",
                   help="also write the metadata JSON next to the model (<output>.json)")
    g.add_argument("--allow-float-ops", action="store_true",
                   help="int8: accept ops left in float instead of failing")
    g.add_argument("--no-fuse-pointwise", dest="fuse_pointwise", action="store_false",
                   help="keep back-to-back 1x1 convolutions apart (by default each such "
                        "pair is fused into one: same function, fewer MACs)")
    g = p.add_argument_group("Core ML")
    g.add_argument("--precision", choices=("float16", "float32"), default="float16",
                   help="compute precision (default float16)")
    g.add_argument("--weight-compression", choices=("int8", "palettize", "prune"),
                   help="coremltools.optimize weight compression (default none)")
    g.add_argument("--deployment-target", default="iOS16",
                   help="minimum deployment target (default iOS16)")
    g.add_argument("--tensor-input", action="store_true",
                   help="float tensor input in [0, 1] instead of an RGB image input")
    p.add_argument("--class-names", metavar="FILE",
                   help="class names, one per line (or a JSON list), written into the model")
    p.add_argument("--json", dest="json_path",
                   help="also write the export report to this JSON file")
    p.set_defaults(handler=_guarded(_export, "export"))

    p = sub.add_parser(
        "validate",
        help="compare exported models with the Keras model on real images",
        description=(
            "Run each exported model and the Keras reference on the same held-out images and "
            "report max/mean |difference|, top-1 agreement, accuracies, size, ops, float ops "
            "left and XNNPACK coverage."
        ),
    )
    p.add_argument("exported", nargs="+", help="exported .tflite files (or .mlpackage)")
    p.add_argument("--reference", required=True,
                   help="the Keras model: a .keras file or a registered name (+ --weights)")
    _model_args(p)
    p.add_argument("--data", required=True, metavar="DIR|fashion_mnist",
                   help="held-out images: a folder of class sub-folders, or fashion_mnist "
                        "(its test split)")
    p.add_argument("--limit", type=int, metavar="N", help="use at most N images")
    p.add_argument("--crop-ratio", type=float,
                   help="center-crop ratio of the eval transform (default 0.875 for folders, "
                        "1.0 for fashion_mnist)")
    p.add_argument("--threads", type=int, default=1, help="TFLite interpreter threads")
    p.add_argument("--json", dest="json_path", help="also write the reports to this JSON file")
    p.set_defaults(handler=_guarded(_validate, "validate"))


def _guarded(handler, name: str):
    """Conversion failures (RuntimeError, e.g. UnsupportedOpError) print one line, exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except RuntimeError as err:
            print(f"mvit2 {name}: error: {err}", file=sys.stderr)
            return 2

    return run


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("registered model names")
    g.add_argument("--weights", help="weights for a registered model (checkpoint or .weights.h5)")
    g.add_argument("--input-size", type=int, nargs="+", metavar="PX",
                   help="input size: one value (square) or height width (default 256; a "
                        ".keras model built for any size is exported at its checkpoint's "
                        "size or 256 unless this is given)")
    g.add_argument("--classes", type=int, default=1000, help="classifier classes (default 1000)")


def _input_shape(sizes: list[int]) -> tuple[int, int, int]:
    if len(sizes) == 1:
        return (sizes[0], sizes[0], 3)
    if len(sizes) == 2:
        return (sizes[0], sizes[1], 3)
    raise ValueError(f"--input-size takes one or two values. Received: {sizes}")


def load_model(spec: str, args: argparse.Namespace):
    """A `.keras` file, or a registered model name built with --weights/--input-size/--classes."""
    import keras

    import keras_mvit2  # noqa: F401  (registers the custom layers for loading)
    from keras_mvit2 import create_model, list_models

    if spec.endswith(".keras") or os.path.sep in spec or os.path.exists(spec):
        if not os.path.exists(spec):
            raise FileNotFoundError(f"Model file not found: {spec!r}")
        if not spec.endswith(".keras"):
            raise ValueError(
                f"Expected a .keras model file or a registered model name. Received: {spec!r}"
            )
        if args.weights:
            raise ValueError("--weights is for registered model names; a .keras file has weights.")
        return keras.models.load_model(spec, compile=False)
    if spec not in list_models():
        raise ValueError(
            f"Unknown model {spec!r}: not a .keras file and not a registered name "
            f"({', '.join(list_models())})."
        )
    return create_model(
        spec,
        input_shape=_input_shape(args.input_size or [256]),
        classes=args.classes,
        weights=args.weights,
    )


def read_class_names(path: str) -> list[str]:
    """Class names from a text file (one per line, blank lines skipped) or a JSON list."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Class-names file not found: {path!r}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        names = json.loads(text)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{path!r} must hold a JSON list of strings.")
        return names
    return [line.strip() for line in text.splitlines() if line.strip()]


def _batch_size(value: str) -> int | None:
    if value == "dynamic":
        return None
    try:
        batch = int(value)
    except ValueError:
        batch = 0
    if batch < 1:
        raise ValueError(f"--batch-size must be a positive int or 'dynamic'. Received: {value!r}")
    return batch


def _export(args: argparse.Namespace) -> int:
    from keras_mvit2.models.input_size import has_dynamic_size, with_input_size

    fmt = args.format
    if fmt is None:
        if args.output.endswith(".tflite"):
            fmt = "tflite"
        elif args.output.rstrip("/").endswith(".mlpackage"):
            fmt = "coreml"
        else:
            raise ValueError(
                "Cannot tell the format from the output name; pass --format tflite|coreml "
                f"(or name it .tflite / .mlpackage). Received: -o {args.output!r}"
            )
    if fmt == "tflite" and args.calibration_data and args.quantization not in ("int8", "int16x8"):
        raise ValueError(
            f"--calibration-data is only used by --quantization int8/int16x8. Received: "
            f"--quantization {args.quantization}"
        )
    if fmt == "tflite" and args.quantization in ("int8", "int16x8") and not args.calibration_data:
        raise ValueError(
            f"--quantization {args.quantization} needs --calibration-data DIR|fashion_mnist: a "
            "few hundred real images to calibrate the activation ranges (or use "
            "--quantization dynamic_int8, which needs no data)."
        )
    batch_size = _batch_size(args.batch_size)
    class_names = read_class_names(args.class_names) if args.class_names else None
    model = load_model(args.model, args)
    if args.input_size is not None or has_dynamic_size(model):
        # A model built for any size (input_shape=(None, None, 3)) is exported at one.
        size = _input_shape(args.input_size)[:2] if args.input_size is not None else None
        model = with_input_size(model, size)

    if fmt == "tflite":
        from keras_mvit2.export import to_tflite

        report = to_tflite(
            model,
            args.output,
            quantization=args.quantization,
            representative_data=args.calibration_data,
            num_calibration_samples=args.num_calibration_samples,
            io_dtype=args.io_dtype,
            batch_size=batch_size,
            class_names=class_names,
            sidecar=args.sidecar,
            allow_float_ops=args.allow_float_ops,
            fuse_pointwise=args.fuse_pointwise,
        )
        _print_tflite(report)
    else:
        from keras_mvit2.export import to_coreml

        report = to_coreml(
            model,
            args.output,
            precision=args.precision,
            image_input=not args.tensor_input,
            class_labels=class_names,
            minimum_deployment_target=args.deployment_target,
            weight_compression=args.weight_compression,
        )
        _print_coreml(report)
    if args.json_path:
        with atomic_output(args.json_path) as tmp, open(tmp, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    return 0


def _print_tflite(report) -> None:
    from rich.console import Console
    from rich.table import Table

    meta = report.metadata or {}
    table = Table(title=f"TFLite export: {report.path}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    quant = meta.get("quantization", "?")
    table.add_row("quantization", str(quant))
    for what, tensors in (("input", report.inputs), ("output", report.outputs)):
        for t in tensors:
            q = f", scale {t.quantization[0]:.6g}, zero point {t.quantization[1]}" if (
                t.quantization[0]) else ""
            table.add_row(what, f"{t.name} {list(t.shape_signature)} {t.dtype}{q}")
    table.add_row("size", f"{report.size_bytes / 1e6:.2f} MB")
    table.add_row("ops", f"{report.num_ops}: " + ", ".join(
        f"{k} {v}" for k, v in report.op_histogram.items()))
    if quant in ("int8", "int16x8"):
        left = ", ".join(f"{k} {v}" for k, v in report.float_ops.items()) or "none"
        table.add_row("float ops left", left)
    table.add_row("XNNPACK partitions", str(report.num_xnnpack_partitions))
    outside = report.ops_outside_xnnpack or {}
    table.add_row("ops outside XNNPACK", f"{report.num_ops_outside_xnnpack}" + (
        ": " + ", ".join(f"{k} {v}" for k, v in outside.items()) if outside else ""))
    fused = meta.get("graph_optimizations")
    table.add_row("fused 1x1 conv pairs", "off (--no-fuse-pointwise)" if fused is None else (
        f"{fused['fused_pointwise_convolutions']} "
        f"({fused['macs_saved'] / 1e6:.1f} M MACs saved)"))
    table.add_row("max tensor rank", str(report.max_tensor_rank))
    table.add_row("flex / custom ops", str(report.flex_ops + report.custom_ops or "none"))
    names = meta.get("class_names")
    table.add_row("class names", f"{len(names)}: {', '.join(names[:5])}..." if names else "-")
    table.add_row("metadata", "embedded ('keras_mvit2' entry)" if meta else "none")
    Console().print(table)


def _print_coreml(report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Core ML export: {report.path}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    table.add_row("spec version", str(report.spec_version))
    table.add_row("size", f"{report.size_bytes / 1e6:.2f} MB")
    table.add_row("ops", ", ".join(f"{k} {v}" for k, v in report.op_histogram.items()))
    table.add_row("max tensor rank", str(report.max_tensor_rank))
    table.add_row("inputs", json.dumps(report.inputs))
    table.add_row("outputs", json.dumps(report.outputs))
    Console().print(table)
    print(
        "note: Core ML predictions need macOS; on Linux only the structure is checked.",
        file=sys.stderr,
    )


def _validate(args: argparse.Namespace) -> int:
    from keras_mvit2.export.calibration import load_labelled_images
    from keras_mvit2.export.validate import (
        print_reports,
        reference_outputs,
        save_reports,
        validate,
    )

    for path in args.exported:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Exported model not found: {path!r}")
    model = load_model(args.reference, args)
    shape = tuple(model.inputs[0].shape[1:3])
    data = load_labelled_images(
        args.data, image_size=shape, limit=args.limit, crop_ratio=args.crop_ratio
    )
    outputs = reference_outputs(model, data.images)
    if outputs.ndim != 2 or outputs.shape[-1] != len(data.class_names):
        raise ValueError(
            f"The reference model outputs {outputs.shape[1:]} per image but {args.data!r} has "
            f"{len(data.class_names)} classes; validate a classifier on data with its classes."
        )
    reports = [
        validate(
            path,
            model,
            data.images,
            data.labels,
            class_names=data.class_names,
            reference_outputs=outputs,
            num_threads=args.threads,
        )
        for path in args.exported
    ]
    print_reports(reports)
    if args.json_path:
        save_reports(reports, args.json_path)
        print(f"wrote {args.json_path}")
    return 0
