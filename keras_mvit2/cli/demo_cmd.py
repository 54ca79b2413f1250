"""`mvit2 demo`: train, evaluate, export, validate, benchmark and visualize on Fashion-MNIST."""

from __future__ import annotations

import argparse
import os


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole pipeline end to end on the built-in example (a few minutes on a CPU)",
        description=(
            "Train MobileViTV2-0.5 briefly on Fashion-MNIST (Debian's dataset-fashion-mnist, "
            "nothing is downloaded), evaluate it, export it to full-integer int8 TFLite "
            "(calibrated on training images) and Core ML, validate both against Keras, "
            "benchmark the TFLite file on this host, draw context-score maps, and print a "
            "summary table with every figure and artefact."
        ),
    )
    p.add_argument("-o", "--output", default="mvit2-demo",
                   help="folder for every artefact (default ./mvit2-demo; a previous demo "
                        "there is replaced)")
    p.add_argument("--small", action="store_true",
                   help="quick settings (32x32, fewer steps and images; 1-2 minutes)")
    p.add_argument("--threads", type=int, default=1,
                   help="interpreter threads of the latency benchmark (default 1)")
    p.add_argument("--quiet", action="store_true", help="no training progress bar")
    g = p.add_argument_group(
        "pretrained", "--pretrained: skip training; export a model with published ImageNet "
        "weights to int8 TFLite and Core ML with the ImageNet labels")
    g.add_argument("--pretrained", action="store_true",
                   help="export a pretrained model instead of training on Fashion-MNIST")
    g.add_argument("--calibration", metavar="DIR",
                   help="any folder of photos: int8 calibration and the Keras/int8 comparison "
                        "(needed with --pretrained)")
    g.add_argument("--model", default="mobilevitv2_050", help="default mobilevitv2_050")
    g.add_argument("--weights", default="imagenet", help="published tag (default imagenet)")
    g.add_argument("--num-images", type=int, default=100,
                   help="photos used at most (default 100)")
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    if args.pretrained:
        return _pretrained(args)
    import sys

    from rich.markup import escape

    from keras_mvit2.demo import print_summary, run_demo
    from keras_mvit2.utils.console import output_console

    console = output_console()
    result = run_demo(args.output, small=args.small, threads=args.threads,
                      verbose=0 if args.quiet else (1 if sys.stdout.isatty() else 2),
                      log=lambda line: console.print(f"[bold]{escape(line)}[/bold]"))
    print_summary(result, console)
    return 0


def _pretrained(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from keras_mvit2.pretrained_demo import run_pretrained_demo
    from keras_mvit2.utils.console import output_console

    if not args.calibration:
        raise ValueError("--pretrained needs --calibration DIR: any folder of photos.")
    console = output_console()
    result = run_pretrained_demo(
        args.output, args.calibration, model=args.model, weights=args.weights,
        num_images=args.num_images,
        log=lambda line: console.print(f"[bold]{escape(line)}[/bold]"))
    table = Table("photo", "Keras top-1", "probability", "int8 top-1",
                  title=f"{result.model} weights={result.weights!r}: int8 agrees with Keras on "
                        f"{100 * result.top1_agreement:.0f} % of {result.num_images} photos")
    for path, name, prob, int8 in result.predictions[:20]:
        table.add_row(escape(os.path.basename(path)), escape(name), f"{prob:.3f}", escape(int8))
    console.print(table)
    for key, path in result.paths.items():
        if path:
            console.print(f"{key}: {escape(path)}")
    return 0
