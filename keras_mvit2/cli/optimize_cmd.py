"""`mvit2 optimize`: the smallest (or fastest) phone file within a top-1 budget."""

from __future__ import annotations

import argparse

from keras_mvit2.cli.failure import CommandFailedError


def register(sub) -> None:
    p = sub.add_parser(
        "optimize",
        help="ship the smallest/fastest export that keeps top-1 within a budget",
        description=(
            "Build every candidate file of a target (float16, int8, mixed precision, "
            "palettized weights, ...), measure each on held-out images (never the calibration "
            "ones) against the float Keras model, and ship the smallest (or fastest) one whose "
            "top-1 drop is within --max-drop points: OUT_DIR/best.<suffix>, every candidate, "
            "report.json and pareto.png. Exits 1 when no candidate meets the budget."
        ),
    )
    from keras_mvit2.export import available_targets

    p.add_argument("model", help="a .keras classifier, or a registered model name")
    p.add_argument("--data", required=True, metavar="DIR|fashion_mnist",
                   help="labelled images: a folder of class sub-folders (or with train/ and "
                        "val/ sub-folders), or fashion_mnist (calibration from its train "
                        "split, held out from its test split)")
    p.add_argument("--target", default="tflite", choices=available_targets(),
                   help="the export target (default tflite)")
    p.add_argument("--max-drop", type=float, required=True, metavar="POINTS",
                   help="the top-1 drop allowed against the float Keras model, in "
                        "percentage points (e.g. 0.5)")
    p.add_argument("--objective", choices=("size", "latency"), default="size",
                   help="what to minimise within the budget (default size; latency is "
                        "measured on this host)")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR",
                   help="folder for best.<suffix>, candidates/, report.json, pareto.png")
    p.add_argument("--num-calibration", type=int, default=200, metavar="N",
                   help="calibration images (default 200)")
    p.add_argument("--num-held-out", type=int, default=1000, metavar="N",
                   help="held-out images every candidate is measured on (default 1000)")
    p.add_argument("--only", metavar="NAME,...",
                   help="build only these candidates (comma-separated names)")
    p.add_argument("--latency-runs", type=int, default=50, metavar="N",
                   help="timed runs per candidate, median reported (default 50)")
    p.add_argument("--threads", type=int, default=1, help="runtime threads (default 1)")
    from keras_mvit2.cli.export_cmd import _model_args

    _model_args(p)
    p.set_defaults(handler=_optimize)


def _optimize(args: argparse.Namespace) -> int:
    from keras_mvit2.cli.export_cmd import load_model
    from keras_mvit2.export.optimizer import OverBudgetError, optimize
    from keras_mvit2.export.optimizer.report import format_table
    from keras_mvit2.models.input_size import has_dynamic_size, with_input_size
    from keras_mvit2.utils.console import output_console

    model = load_model(args.model, args)
    if has_dynamic_size(model):
        model = with_input_size(model, None)
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    print(f"optimizing {model.name} for {args.target} within {args.max_drop:g} top-1 points "
          f"(objective: {args.objective})", flush=True)
    try:
        result = optimize(model, args.output, target=args.target, data=args.data,
                          max_drop=args.max_drop, objective=args.objective,
                          num_calibration=args.num_calibration,
                          num_held_out=args.num_held_out, latency_runs=args.latency_runs,
                          threads=args.threads, only=only)
    except OverBudgetError as err:
        output_console().print(format_table(err.result))
        print(f"wrote {err.result.report_path}" + (
            f" and {err.result.plot_path}" if err.result.plot_path else ""))
        raise CommandFailedError(str(err), status=1) from None
    output_console().print(format_table(result))
    data = result.data
    print(f"images: {data['num_calibration']} for calibration, {data['num_held_out']} held "
          f"out ({data['source']})")
    print(f"best: {result.best.name} -> {result.best_path} "
          f"({result.best.size_bytes / 1e6:.2f} MB, drop {result.best.drop_points:+.2f} "
          f"points)")
    print(f"wrote {result.report_path}" + (f" and {result.plot_path}" if result.plot_path
                                           else ""))
    return 0
