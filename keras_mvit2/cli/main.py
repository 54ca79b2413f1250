"""Entry point of the `mvit2` console script."""

import argparse
import contextlib
import functools
import sys

from keras_mvit2._version import __version__
from keras_mvit2.backend import TensorFlowBackendRequiredError
from keras_mvit2.cli import (
    bench_android_cmd,
    bench_cmd,
    demo_cmd,
    export_cmd,
    finetune_cmd,
    models_cmd,
    optimize_cmd,
    predict_cmd,
    qat_cmd,
    task_cmd,
    train_cmd,
    visualize_cmd,
    web_cmd,
    weights_cmd,
)
from keras_mvit2.cli.failure import CommandFailedError
from keras_mvit2.training.divergence import TrainingDivergedError
from keras_mvit2.utils.quiet import native_chatter_filtered, quiet_libraries

_COMMANDS = (demo_cmd, predict_cmd, models_cmd, weights_cmd, visualize_cmd, bench_cmd,
             bench_android_cmd, qat_cmd, export_cmd, optimize_cmd, task_cmd, train_cmd,
             finetune_cmd, web_cmd)

#: The commands of the modules whose options come from TensorFlow-only parts (the export
#: targets, the task models' data and MAC counts): off the TensorFlow backend their
#: `register` raises, and each command is registered to say that it needs TensorFlow when
#: it is run (`mvit2 train`, `mvit2 finetune` and the other commands run on every backend).
_TENSORFLOW_COMMANDS = {export_cmd: ("export", "validate"), optimize_cmd: ("optimize",),
                        task_cmd: ("eval-task", "task-profile")}


def _needs_tensorflow(error: TensorFlowBackendRequiredError, args: argparse.Namespace) -> int:
    raise error


def _register(module, sub: argparse._SubParsersAction) -> None:
    """`module.register(sub)`, or off TensorFlow, its commands answering with the error."""
    try:
        module.register(sub)
    except TensorFlowBackendRequiredError as error:
        if module not in _TENSORFLOW_COMMANDS:
            raise
        for name in _TENSORFLOW_COMMANDS[module]:
            p = sub.add_parser(name, help="needs KERAS_BACKEND=tensorflow", add_help=False)
            p.add_argument("arguments", nargs=argparse.REMAINDER)
            p.set_defaults(handler=functools.partial(_needs_tensorflow, error))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mvit2",
        description="MobileViTv2 for Keras 3: build, port, train, export, benchmark.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the keras_mvit2 version and exit")
    verbose_help = ("show TensorFlow's, coremltools' and Keras' own logs, warnings and "
                    "progress bars (hidden by default)")
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        _register(module, sub)
    for command in sub.choices.values():  # `mvit2 demo -v` as well as `mvit2 -v demo`
        command.add_argument("-v", "--verbose", action="store_true",
                             default=argparse.SUPPRESS, help=verbose_help)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs `mvit2`; returns the exit status.

    Errors print one line, no traceback: status 2 for bad input (a wrong value, a missing
    file, an unconvertible model), 3 for a training run that diverged (NaN or inf loss), a
    command's own status for a reported failure (`CommandFailedError`: `mvit2 optimize` with no
    candidate within the budget exits 1).
    Unless `-v`, the libraries' own logs and progress bars are hidden.
    """
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a command may re-run itself
    quiet = not args.verbose
    if quiet:
        quiet_libraries()
    with native_chatter_filtered() if quiet else contextlib.nullcontext():
        try:
            return int(args.handler(args) or 0)
        except TrainingDivergedError as err:
            error, status = err, 3
        except CommandFailedError as err:
            error, status = err, err.status
        except (ValueError, FileNotFoundError, ImportError, OSError) as err:
            error, status = err, 2
    # After the filter: it would take the line for the continuation of a native entry it
    # drops (TensorFlow's CUDA probe error on a machine without a GPU, say).
    print(f"mvit2 {args.command}: error: {error}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
