"""The `mvit2` command line. Each sub-command lives in its own module with
`register(subparsers)`; `main` wires them together."""

from keras_mvit2.cli.main import main

__all__ = ["main"]
