"""Entry point of the `mvit2` console script."""

import argparse
import sys

from keras_mvit2.cli import (
    bench_android_cmd,
    bench_cmd,
    demo_cmd,
    export_cmd,
    models_cmd,
    predict_cmd,
    qat_cmd,
    task_cmd,
    train_cmd,
    visualize_cmd,
    weights_cmd,
)

_COMMANDS = (demo_cmd, predict_cmd, models_cmd, weights_cmd, visualize_cmd, bench_cmd,
             bench_android_cmd, qat_cmd, export_cmd, task_cmd, train_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mvit2",
        description="MobileViTv2 for Keras 3: build, port, train, export, benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs `mvit2`; returns the exit status (errors print one line, no traceback)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, ImportError, OSError) as err:
        print(f"mvit2 {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
