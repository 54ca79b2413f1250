"""Merge benchmark records from several devices into one comparison table.

Rows are models in a format/precision (``"mobilevitv2_050 [tflite/int8]"``), columns
are device / runtime / threads / delegate (``"Pixel 7 (android) · tflite 2.16 · 4 thr
· gpu"``), cells the median latency in ms. Records of the shared schema
(`keras_mvit2.latency.schema`) from the host harness, the Android ``benchmark_model``
harness and the iPhone Core ML harness all merge. Several records for the same
cell (repeated runs) give the median of their medians, and the cell remembers
how many there were.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from keras_mvit2.latency.schema import BenchResult, load_results
from keras_mvit2.utils.files import write_text

__all__ = ["ComparisonTable", "column_label", "compare", "load_many", "row_label"]


def row_label(result: BenchResult) -> str:
    """``"<model> [<format>/<precision>]"`` (precision left out when unknown)."""
    model = result.model
    kind = "/".join(str(p) for p in (model.get("format"), model.get("precision")) if p)
    return f"{model.get('name', '?')} [{kind or '?'}]"


def column_label(result: BenchResult) -> str:
    """``"<device> (<platform>) · <runtime> <version> · <threads> thr · <delegate>"``."""
    device, runtime = result.device, result.runtime
    name = device.get("name") or device.get("machine") or "?"
    platform = device.get("platform")
    rt = " ".join(str(p) for p in (runtime.get("name"), runtime.get("version")) if p)
    threads = runtime.get("threads")
    return " · ".join([
        f"{name} ({platform})" if platform else str(name),
        rt or "?",
        f"{threads} thr" if threads else "- thr",
        str(runtime.get("delegate") or "-"),
    ])


@dataclasses.dataclass
class ComparisonTable:
    """Median latency (ms) per (row, column); see the module docstring."""

    rows: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], float]
    counts: dict[tuple[str, str], int]
    #: Cells filled with the mean because the tool printed no median (older
    #: Android `benchmark_model` builds); marked with "*" in the table.
    from_mean: frozenset[tuple[str, str]] = frozenset()

    def cell(self, row: str, column: str) -> float | None:
        return self.cells.get((row, column))

    def cell_text(self, row: str, column: str) -> str:
        value = self.cells.get((row, column))
        if value is None:
            return "-"
        count = self.counts.get((row, column), 1)
        text = f"{value:.3f}" if value < 10 else f"{value:.2f}"
        if (row, column) in self.from_mean:
            text += "*"
        return text if count == 1 else f"{text} (n={count})"

    def to_markdown(self) -> str:
        lines = ["| model | " + " | ".join(self.columns) + " |",
                 "|---|" + "---:|" * len(self.columns)]
        for row in self.rows:
            lines.append(f"| {row} | "
                         + " | ".join(self.cell_text(row, c) for c in self.columns) + " |")
        lines.append("")
        lines.append("Median latency in ms, batch 1; '-' = not measured; (n=...) = median of "
                     "that many records.")
        if self.from_mean:
            lines.append("* mean latency: the benchmark tool printed no median.")
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["model", *self.columns])
        for row in self.rows:
            writer.writerow([row, *("" if self.cell(row, c) is None else
                                    f"{self.cell(row, c):.6g}" for c in self.columns)])
        return buffer.getvalue()

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": "ms (median latency, batch 1)",
            "columns": self.columns,
            "rows": [
                {"model": row,
                 "median_ms": {c: self.cell(row, c) for c in self.columns
                               if self.cell(row, c) is not None},
                 "records": {c: self.counts[(row, c)] for c in self.columns
                             if (row, c) in self.counts}}
                for row in self.rows
            ],
        }

    def write(self, *, markdown: str | None = None, csv_path: str | None = None,
              json_path: str | None = None) -> None:
        """Writes the requested formats, each atomically."""
        for path, text in ((markdown, self.to_markdown), (csv_path, self.to_csv),
                           (json_path, lambda: json.dumps(self.to_dict(), indent=2))):
            if path:
                write_text(path, text())


def load_many(paths: Iterable[str | os.PathLike]) -> list[BenchResult]:
    """Records from several JSON files (one record or a list each).

    Raises:
        FileNotFoundError / ValueError: naming the file that is missing or not a
            keras_mvit2 benchmark file.
    """
    results: list[BenchResult] = []
    for path in paths:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Benchmark result file not found: {path!r}")
        try:
            results.extend(load_results(path))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path!r} is not JSON: {err}") from err
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"{path!r} does not hold keras_mvit2 benchmark records (BenchResult JSON, "
                f"as written by `mvit2 bench --json`): {err}"
            ) from err
    return results


def compare(results: Sequence[BenchResult]) -> ComparisonTable:
    """The comparison table of `results` (rows and columns in first-seen order)."""
    rows: list[str] = []
    columns: list[str] = []
    values: dict[tuple[str, str], list[float]] = {}
    from_mean: set[tuple[str, str]] = set()
    for result in results:
        row, column = row_label(result), column_label(result)
        if row not in rows:
            rows.append(row)
        if column not in columns:
            columns.append(column)
        latency = result.latency_ms.median
        if latency is None:
            latency = result.latency_ms.mean
            from_mean.add((row, column))
        values.setdefault((row, column), []).append(float(latency))
    cells = {key: statistics.median(v) for key, v in values.items()}
    counts = {key: len(v) for key, v in values.items()}
    return ComparisonTable(rows=rows, columns=columns, cells=cells, counts=counts,
                           from_mean=frozenset(from_mean))
