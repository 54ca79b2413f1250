"""`mvit2 demo`: train, evaluate, export, validate, benchmark and visualize on Fashion-MNIST."""

from __future__ import annotations

import argparse


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
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    import sys

    from rich.console import Console
    from rich.markup import escape

    from keras_mvit2.demo import print_summary, run_demo

    console = Console()
    result = run_demo(args.output, small=args.small, threads=args.threads,
                      verbose=0 if args.quiet else (1 if sys.stdout.isatty() else 2),
                      log=lambda line: console.print(f"[bold]{escape(line)}[/bold]"))
    print_summary(result, console)
    return 0
