"""The command line of the Android harness: ``python -m keras_mvit2.latency.android`` and
``mvit2 bench-android`` (`add_arguments`, `run_from_args`, `main`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from keras_mvit2.latency.adb import BENCHMARK_MODEL_HELP
from keras_mvit2.latency.android_driver import (
    DEFAULT_REMOTE_DIR,
    DELEGATES,
    AndroidBenchConfig,
    PartialRunError,
    run_android_benchmarks,
)
from keras_mvit2.latency.android_record import format_table
from keras_mvit2.latency.schema import save_results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line arguments (for ``mvit2 bench-android`` or ``python -m``)."""
    parser.add_argument("models", nargs="+", type=Path, metavar="MODEL.tflite",
                        help="one or more .tflite models (e.g. from `mvit2 export`)")
    parser.add_argument("--benchmark-model", required=True, type=Path, metavar="PATH",
                        help="the Android benchmark_model binary (see below where to get it)")
    parser.add_argument("--delegate", nargs="+", default=["xnnpack"], choices=sorted(DELEGATES),
                        help="runtime configurations (default: xnnpack); gpu and nnapi give "
                             "the ops they reject to XNNPACK")
    parser.add_argument("--threads", nargs="+", type=int, default=[1],
                        help="CPU thread counts (default: 1)")
    parser.add_argument("--runs", type=int, default=50, help="timed runs (default: 50)")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up runs (default: 5)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over all configurations, interleaved; the record keeps "
                             "the round with the median mean (default: 1)")
    parser.add_argument("--op-profiling", action="store_true",
                        help="per-op timings (--enable_op_profiling=true; adds overhead)")
    parser.add_argument("--no-peak-memory", action="store_true",
                        help="do not pass --report_peak_memory_footprint=true")
    parser.add_argument("--taskset", metavar="MASK",
                        help="CPU affinity mask for the run, e.g. f0 for the big cores")
    parser.add_argument("--extra-flag", action="append", default=[], metavar="FLAG",
                        help="more benchmark_model flags, e.g. --extra-flag=--gpu_backend=cl")
    parser.add_argument("--serial", help="the device's serial (adb devices) if several")
    parser.add_argument("--adb", default="adb", help="the adb executable (default: adb)")
    parser.add_argument("--remote-dir", default=DEFAULT_REMOTE_DIR,
                        help=f"work folder on the phone (default: {DEFAULT_REMOTE_DIR})")
    parser.add_argument("--keep-remote", action="store_true",
                        help="leave the work folder on the phone")
    parser.add_argument("--raw-dir", type=Path,
                        help="also keep each run's benchmark_model log in this folder")
    parser.add_argument("--tool-version", help="label of the binary (e.g. nightly-2026-10-01)")
    parser.add_argument("-o", "--output", type=Path, default=Path("android_bench.json"),
                        help="results JSON (default: android_bench.json)")


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the command line's configuration, writes the JSON and prints the table."""
    config = AndroidBenchConfig(
        models=list(args.models), benchmark_model=args.benchmark_model,
        delegates=list(args.delegate), threads=list(args.threads), runs=args.runs,
        warmup=args.warmup, repeats=args.repeats, peak_memory=not args.no_peak_memory,
        op_profiling=args.op_profiling, taskset=args.taskset,
        extra_flags=list(args.extra_flag), serial=args.serial, adb=args.adb,
        remote_dir=args.remote_dir, keep_remote=args.keep_remote, raw_dir=args.raw_dir,
        tool_version=args.tool_version,
    )
    try:
        results = run_android_benchmarks(config, log=lambda m: print(m, file=sys.stderr))
    except PartialRunError as err:
        if err.results:
            _write(err.results, args.output)
        print(f"error: {err}", file=sys.stderr)
        return 1
    _write(results, args.output)
    return 0


def _write(results, output: Path) -> None:
    """Writes the records' JSON and prints their table."""
    save_results(results, output)
    print(format_table(results))
    print(f"Wrote {len(results)} record(s) to {output}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m keras_mvit2.latency.android``."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_mvit2.latency.android",
        description="Benchmark .tflite models on an Android phone with benchmark_model "
                    "over adb; writes keras_mvit2.bench/1 JSON records.",
        epilog=BENCHMARK_MODEL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
