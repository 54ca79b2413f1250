"""`mvit2 export` (TFLite / Core ML) and `mvit2 validate` (exported vs Keras on real images)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys

from keras_mvit2.utils.files import atomic_output


def register(sub) -> None:
    from keras_mvit2.export import available_targets, get_target
    from keras_mvit2.export.roads import ROADS

    p = sub.add_parser(
        "export",
        help="export a model to TFLite (Android), Core ML or Core AI (iPhone)",
        description=(
            "Export a .keras model or a registered model name to TFLite (optionally quantized; "
            "builtin ops only, checked in LiteRT) or to a Core ML ML Program (.mlpackage), "
            "and print the report."
        ),
    )
    targets = [get_target(name) for name in available_targets()]
    p.add_argument("model", help="a .keras file, or a registered model name (see `mvit2 list`)")
    p.add_argument("-o", "--output", required=True,
                   help="output path (" + ", ".join(
                       f"{'/'.join(t.suffixes)} for {t.display_name}" for t in targets) + ")")
    p.add_argument("--format", metavar="|".join(t.name for t in targets),
                   help="the export target (default: from the output suffix)")
    p.add_argument("--quantization", metavar="FORMAT",
                   help="the numeric format; " + "; ".join(
                       f"{t.display_name}: {', '.join(t.formats)} (default {t.default_format}"
                       + (f"; {'/'.join(t.calibrated_formats)} need --calibration-data"
                          if t.calibrated_formats else "") + ")" for t in targets))
    p.add_argument("--road", choices=ROADS,
                   help="the converter (docs/architecture.md, 'Roads, not targets'): tensorflow "
                        "(TensorFlow's TFLite converter / coremltools from the TensorFlow "
                        "graph, on Keras' TensorFlow backend) or torch (litert-torch / "
                        "torch.export + coremltools / coreai-torch, on Keras' PyTorch "
                        "backend: every .tflite format, int8 by ai-edge-quantizer; needs the "
                        "torch extra, and litert-torch or coreai for those files; Core AI's only "
                        "road). Default: the road of this process's Keras backend. Another "
                        "road re-runs this command with KERAS_BACKEND set for it, unless "
                        "KERAS_BACKEND is set to another backend (then it says what to run)")
    _model_args(p)
    for target in targets:
        target.add_cli_arguments(p.add_argument_group(target.display_name))
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
    p.add_argument("--per-layer", action="store_true",
                   help="full-int8 .tflite files: rank the Keras layers by their own int8 "
                        "error (TFLite's QuantizationDebugger, calibrated as the file "
                        "records), print the top ones and write a bar chart")
    p.add_argument("--per-layer-plot", metavar="PATH",
                   help="where the bar chart goes (default: next to the --json report, "
                        "else next to the file: <file>.per_layer.png)")
    p.add_argument("--per-layer-top", type=int, default=10, metavar="N",
                   help="layers printed and plotted (default 10)")
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
    from keras_mvit2 import create_model, list_models
    from keras_mvit2.utils.model_files import load_keras_model

    if spec.endswith(".keras") or os.path.sep in spec or os.path.exists(spec):
        if not os.path.exists(spec):
            raise FileNotFoundError(f"Model file not found: {spec!r}")
        if not spec.endswith(".keras"):
            raise ValueError(
                f"Expected a .keras model file or a registered model name. Received: {spec!r}"
            )
        if args.weights:
            raise ValueError("--weights is for registered model names; a .keras file has weights.")
        return load_keras_model(spec)
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


def _export_target(args: argparse.Namespace):
    """The target `--format` names, or the one whose files end like `--output`."""
    from keras_mvit2.export import available_targets, get_target, target_for_path

    if args.format is not None:
        return get_target(args.format)
    try:
        return target_for_path(args.output)
    except ValueError:
        raise ValueError(
            f"Cannot tell the format from the output name; pass --format "
            f"{'|'.join(available_targets())} (or name it "
            f"{' / '.join(s for n in available_targets() for s in get_target(n).suffixes)}). "
            f"Received: -o {args.output!r}"
        ) from None


#: The Keras backend each road converts on.
ROAD_BACKENDS = {"tensorflow": "tensorflow", "torch": "torch"}


def road_command(args: argparse.Namespace) -> list[str] | None:
    """The command that takes `--road` on its own backend, or None if this process can.

    A Keras backend is fixed when Keras is imported, and `mvit2` has imported it, so a road
    of another backend runs in a new process: ``python -m keras_mvit2.cli`` with the
    same arguments and ``KERAS_BACKEND`` set for the road.

    Raises:
        ValueError: ``KERAS_BACKEND`` is set to another backend (the user chose it; the
            message gives the command to run instead).
        ImportError: the road's backend (PyTorch) is not installed.
    """
    from keras_mvit2.export.roads import default_road

    road = getattr(args, "road", None)
    if road is None or road == default_road():
        return None
    backend = ROAD_BACKENDS[road]
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    if os.environ.get("KERAS_BACKEND"):
        raise ValueError(
            f"--road {road} converts a model Keras runs on {backend!r}, and KERAS_BACKEND="
            f"{os.environ['KERAS_BACKEND']} is set here. Run: KERAS_BACKEND={backend} mvit2 "
            f"{shlex.join(argv)}")
    if importlib.util.find_spec(backend) is None:
        raise ImportError(f"--road {road} needs {backend}, which is not installed: "
                          f"pip install 'keras_mvit2[{'torch' if backend == 'torch' else 'tf'}]'"
                          " (docs/install.md)")
    return [sys.executable, "-m", "keras_mvit2.cli", *argv]


def _export(args: argparse.Namespace) -> int:
    from keras_mvit2.models.input_size import has_dynamic_size, with_input_size

    command = road_command(args)
    if command is not None:
        backend = ROAD_BACKENDS[args.road]
        print(f"mvit2 export: --road {args.road} runs on Keras' {backend} backend: re-running "
              f"with KERAS_BACKEND={backend}", file=sys.stderr)
        return subprocess.run(command, env={**os.environ, "KERAS_BACKEND": backend}).returncode
    target = _export_target(args)
    arguments = target.cli_arguments(args)  # checked before the model is loaded
    class_names = read_class_names(args.class_names) if args.class_names else None
    model = load_model(args.model, args)
    if args.input_size is not None or has_dynamic_size(model):
        # A model built for any size (input_shape=(None, None, 3)) is exported at one.
        size = _input_shape(args.input_size)[:2] if args.input_size is not None else None
        model = with_input_size(model, size)
    report = target.convert(model, args.output, class_names=class_names, **arguments)
    print_report(target, report)
    if args.json_path:
        with atomic_output(args.json_path) as tmp, open(tmp, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    return 0


def print_report(target, report) -> None:
    """The export report as a table (the target's rows), and the target's note for this host."""
    from rich.table import Table

    from keras_mvit2.utils.console import output_console

    table = Table(title=f"{target.display_name} export: {report.path}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for field, value in target.report_rows(report):
        table.add_row(field, value)
    output_console().print(table)
    note = target.host_note()
    if note:
        print(f"note: {note}", file=sys.stderr)


def _validate(args: argparse.Namespace) -> int:
    from keras_mvit2.export.calibration import load_labelled_images
    from keras_mvit2.export.validate import (
        print_reports,
        reference_outputs,
        save_reports,
        validate,
    )
    from keras_mvit2.utils.console import output_console

    for path in args.exported:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Exported model not found: {path!r}")
    if args.per_layer_plot and not args.per_layer:
        raise ValueError("--per-layer-plot is for --per-layer; add --per-layer.")
    if args.per_layer_plot and len(args.exported) > 1:
        raise ValueError("--per-layer-plot names one chart: validate one file with it, or "
                         "leave it out (each chart then goes next to its file).")
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
            per_layer=args.per_layer,
        )
        for path in args.exported
    ]
    print_reports(reports, console=output_console())  # off a terminal: at full width
    for report in reports:
        if report.per_layer is not None:
            _print_per_layer(report, args)
    if args.json_path:
        save_reports(reports, args.json_path)
        print(f"wrote {args.json_path}")
    return 0


def _print_per_layer(report, args: argparse.Namespace) -> None:
    """The top layers of `report.per_layer` as a table, and the bar chart written."""
    from rich.table import Table

    from keras_mvit2.export.tflite.layer_errors import LayerError, plot_layer_errors
    from keras_mvit2.utils.console import output_console

    errors = [LayerError(**e) for e in report.per_layer]
    top = max(1, args.per_layer_top)
    table = Table(title=f"int8 error per Keras layer: {report.exported_path} "
                        f"(top {min(top, len(errors))} of {len(errors)}; 0.29 = rounding only)")
    for column in ("#", "layer", "RMSE / scale", "error std / scale", "mean err / scale",
                   "max |err| / scale", "ops", "worst op"):
        table.add_column(column, overflow="fold")  # narrow terminals: wrap, never cut
    for rank, e in enumerate(errors[:top], 1):
        table.add_row(str(rank), e.layer, f"{e.rmse_over_scale:.3g}",
                      f"{e.std_error_over_scale:.3g}", f"{e.mean_error_over_scale:+.3g}",
                      f"{e.max_abs_error_over_scale:.3g}", str(e.num_ops), e.worst_op)
    output_console().print(table)
    if args.per_layer_plot:
        plot_path = args.per_layer_plot
    elif args.json_path:
        plot_path = os.path.splitext(args.json_path)[0] + "." + os.path.basename(
            report.exported_path) + ".per_layer.png"
    else:
        plot_path = report.exported_path + ".per_layer.png"
    print(f"wrote {plot_layer_errors(errors, plot_path, top=top)}")
