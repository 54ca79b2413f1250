"""iPhone / Mac Core ML benchmarks: the records of the Swift harness in ``harness/ios``.

The Swift package in ``harness/ios`` writes ``keras_mvit2.bench/1`` records itself
(`BenchRecord` in ``Sources/MViT2Bench/BenchRecord.swift`` mirrors
`keras_mvit2.latency.schema` field by field): the Mac command-line tool writes a JSON
list (``--output``) that `load_results` reads as it is; the iPhone test run prints
each record on one console line after `RECORD_MARKER`, and `extract_records` /
``python -m keras_mvit2.latency.ios extract xcodebuild.log -o iphone.json`` collect them
from the ``xcodebuild test`` output into a JSON file for ``mvit2 bench-report``.

The Python path on a Mac (coremltools predictions) is `mvit2 bench MODEL.mlpackage`
(`keras_mvit2.latency.host.bench_coreml`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from keras_mvit2.latency.schema import BenchResult, save_results

__all__ = ["COMPUTE_UNITS", "RECORD_MARKER", "extract_records", "main"]

#: Prefix of a console line carrying one JSON record (`recordMarker` in Swift).
RECORD_MARKER = "KERAS_MVIT2_BENCH_RECORD "

#: Core ML compute units as the records name them (``runtime.delegate``), as in the
#: Swift `ComputeUnitsOption` and `mvit2 bench --compute-units`.
COMPUTE_UNITS = ("cpu_only", "cpu_and_gpu", "cpu_and_ne", "all")


def extract_records(text: str, *, source: str = "log") -> list[BenchResult]:
    """The records printed after `RECORD_MARKER` in a console log (xcodebuild output).

    Raises:
        ValueError: a marked line is not a valid record (names the line), or the log
            has no record at all.
    """
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        position = line.find(RECORD_MARKER)
        if position < 0:
            continue
        payload = line[position + len(RECORD_MARKER):].strip()
        try:
            records.append(BenchResult.from_dict(json.loads(payload)))
        except (json.JSONDecodeError, TypeError, KeyError, ValueError) as err:
            raise ValueError(
                f"{source}:{number}: the line after {RECORD_MARKER.strip()} is not a "
                f"keras_mvit2.bench/1 record ({err})."
            ) from err
    if not records:
        raise ValueError(
            f"No {RECORD_MARKER.strip()} line in {source}: run the MViT2DeviceBenchmarks "
            "tests with `xcodebuild test ... | tee xcodebuild.log` (and check that the Models "
            "folder held an .mlpackage: the test is skipped otherwise)."
        )
    return records


def _extract_command(paths: Iterable[Path], output: Path) -> int:
    records: list[BenchResult] = []
    for path in paths:
        records += extract_records(Path(path).read_text(errors="replace"), source=str(path))
    save_results(records, output)
    for r in records:
        lat = r.latency_ms
        print(f"{r.device.get('name')} | {r.model.get('name')} | {r.runtime.get('delegate')}: "
              f"median {lat.median:.3f} ms (min {lat.min:.3f}, max {lat.max:.3f}, "
              f"{lat.runs} runs)")
    print(f"Wrote {len(records)} record(s) to {output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m keras_mvit2.latency.ios extract LOG... -o FILE.json``."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_mvit2.latency.ios",
        description="Collect the Core ML benchmark records of the Swift harness.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    extract = sub.add_parser(
        "extract", help="records printed by an `xcodebuild test` run -> one JSON file"
    )
    extract.add_argument("logs", nargs="+", type=Path, help="saved xcodebuild output")
    extract.add_argument("-o", "--output", type=Path, default=Path("ios_bench.json"),
                         help="results JSON (default: ios_bench.json)")
    args = parser.parse_args(argv)
    try:
        return _extract_command(args.logs, args.output)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
