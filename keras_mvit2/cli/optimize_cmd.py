"""`mvit2 optimize`: the smallest phone file within a top-1 budget that is not slower than
float32 on this host (or, by `--objective`, the smallest or the fastest)."""

from __future__ import annotations

import argparse

from keras_mvit2.cli.failure import CommandFailedError


def register(sub) -> None:
    from keras_mvit2.export import available_targets
    from keras_mvit2.optimizer.search import (
        DEFAULT_OBJECTIVE,
        OBJECTIVES,
        QAT_BATCH_SIZE,
        QAT_EPOCHS,
        QAT_LEARNING_RATE,
        QAT_MAX_STEPS,
    )

    p = sub.add_parser(
        "optimize",
        help="ship the smallest/fastest export that keeps top-1 within a budget",
        description=(
            "Build every candidate file of a target (float16, int8, mixed precision, "
            "palettized weights, ...), measure each on held-out images (never the calibration "
            "ones) against the float Keras model, and ship the smallest one whose top-1 drop "
            "is within --max-drop points and that runs no slower than float32 on this host "
            "(--objective): OUT_DIR/best.<suffix>, every candidate, report.json and "
            "pareto.png. With training images (--train-data, or the training part of --data) "
            "and no post-training int8 file within the budget, it also tries qat_int8, a short "
            "quantization-aware training whose file is the trained one only where an exact "
            "paired test on the held-out images and a quarter of the training images set "
            "aside chooses it (p < 0.05, top-1 not lower), else the post-training one. "
            "Exits 1 when no candidate meets the budget."
        ),
    )
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
    p.add_argument("--objective", choices=OBJECTIVES, default=DEFAULT_OBJECTIVE,
                   help="what to minimise within the budget: size_fast (default) the "
                        "smallest file that is not slower than float32 on this host (by "
                        "size alone where float32 is not timed here); size the smallest "
                        "file whatever its speed (it may ship a file slower than float32); "
                        "latency the fastest on this host")
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
    p.add_argument("--train-data", metavar="DIR|fashion_mnist:train",
                   help="labelled training images (never the held-out ones) for the qat_int8 "
                        "candidate; default: the training part of --data (fashion_mnist's "
                        "train split, DIR/train/), none for a flat folder")
    p.add_argument("--qat-steps", type=int, default=QAT_MAX_STEPS, metavar="N",
                   help="qat_int8: a pass over the training images is at most N steps of "
                        f"{QAT_BATCH_SIZE} images (default {QAT_MAX_STEPS}; 0: never try it)")
    p.add_argument("--qat-epochs", type=int, default=QAT_EPOCHS, metavar="E",
                   help=f"qat_int8: passes over the training images (default {QAT_EPOCHS}), "
                        "towards the float model's own answers")
    p.add_argument("--qat-lr", type=float, default=QAT_LEARNING_RATE, metavar="LR",
                   help=f"qat_int8: Adam learning rate (default {QAT_LEARNING_RATE:g})")
    from keras_mvit2.cli.export_cmd import _model_args

    _model_args(p)
    p.set_defaults(handler=_optimize)


def _optimize(args: argparse.Namespace) -> int:
    from keras_mvit2.cli.export_cmd import load_model
    from keras_mvit2.models.input_size import has_dynamic_size, with_input_size
    from keras_mvit2.optimizer import (
        OverBudgetError,
        optimize,
        qat_settings,
        training_images_of,
    )
    from keras_mvit2.optimizer.report import format_table
    from keras_mvit2.utils.console import output_console

    model = load_model(args.model, args)
    if has_dynamic_size(model):
        model = with_input_size(model, None)
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    qat = qat_settings(args.train_data or training_images_of(args.data),
                       steps=args.qat_steps, learning_rate=args.qat_lr,
                       epochs=args.qat_epochs, verbose=True)
    print(f"optimizing {model.name} for {args.target} within {args.max_drop:g} top-1 points "
          f"(objective: {args.objective})", flush=True)
    try:
        result = optimize(model, args.output, target=args.target, data=args.data,
                          max_drop=args.max_drop, objective=args.objective,
                          num_calibration=args.num_calibration,
                          num_held_out=args.num_held_out, latency_runs=args.latency_runs,
                          threads=args.threads, only=only, qat=qat)
    except OverBudgetError as err:
        output_console().print(format_table(err.result))
        _print_wrote(err.result)
        raise CommandFailedError(str(err), status=1) from None
    output_console().print(format_table(result))
    data = result.data
    print(f"images: {data['num_calibration']} for calibration, {data['num_held_out']} held "
          f"out ({data['source']})")
    best = result.best
    speed = (f", {best.latency_vs_float32:.2f}x float32's latency ({best.vs_float32})"
             if best.vs_float32 not in (None, "reference") else "")
    print(f"best: {result.best.name} -> {result.best_path} "
          f"({result.best.size_bytes / 1e6:.2f} MB, drop {result.best.drop_points:+.2f} "
          f"points{speed})")
    _print_wrote(result)
    return 0


def _print_wrote(result) -> None:
    print(f"wrote {result.report_path}" + (f" and {result.plot_path}" if result.plot_path
                                           else ""))
