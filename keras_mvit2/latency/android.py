"""Android on-device benchmarks with the official TFLite ``benchmark_model`` over ``adb``.

`run_android_benchmarks` picks the phone (``adb devices``), reads its properties
(``adb shell getprop``), checks that the binary was built for the phone's ABI, pushes
the binary and the models into a work folder under ``/data/local/tmp``, runs every
(model, delegate, threads) configuration ``repeats`` times in interleaved order (so
that thermal drift hits all configurations alike), pulls each run's log back, parses
it (`parse_benchmark_output`) into `BenchResult` records (schema
``keras_mvit2.bench/1``, ``device.platform == "android"``) and removes the work folder.
Every ``adb`` call goes through `Adb.run`.

Command line: ``python -m keras_mvit2.latency.android MODEL.tflite ... --benchmark-model
PATH`` (see `add_arguments`; the results are written as JSON and printed as a table).

This module gathers the harness's names; the parts live in `keras_mvit2.latency.android_log`
(the log parser), `keras_mvit2.latency.android_record` (records and the table),
`keras_mvit2.latency.adb` (the phone over adb), `keras_mvit2.latency.android_driver` (the
run) and `keras_mvit2.latency.android_cli` (the command line).

How the tool's report lands in the record: `keras_mvit2.latency.android_record`.
"""

from __future__ import annotations

import sys

from keras_mvit2.latency.adb import (
    BENCHMARK_MODEL_HELP,
    Adb,
    AndroidBenchError,
    parse_getprop,
)
from keras_mvit2.latency.android_cli import add_arguments, main, run_from_args
from keras_mvit2.latency.android_driver import (
    DELEGATES,
    AndroidBenchConfig,
    PartialRunError,
    benchmark_flags,
    run_android_benchmarks,
)
from keras_mvit2.latency.android_log import (
    BenchmarkModelOutput,
    OpProfile,
    RunStats,
    parse_benchmark_output,
)
from keras_mvit2.latency.android_record import format_table, to_bench_result

__all__ = [
    "BENCHMARK_MODEL_HELP",
    "DELEGATES",
    "Adb",
    "AndroidBenchConfig",
    "AndroidBenchError",
    "BenchmarkModelOutput",
    "OpProfile",
    "PartialRunError",
    "RunStats",
    "add_arguments",
    "benchmark_flags",
    "format_table",
    "main",
    "parse_benchmark_output",
    "parse_getprop",
    "run_android_benchmarks",
    "run_from_args",
    "to_bench_result",
]

if __name__ == "__main__":
    sys.exit(main())
