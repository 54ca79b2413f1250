"""One `benchmark_model` run as a `BenchResult` record (`to_bench_result`) and records as a
plain-text table (`format_table`).

What the tool reports and how it lands in the record (times in the log are
microseconds, the record holds milliseconds):

* ``latency_ms.min/max/mean`` and ``runs`` come from the statistics line of the timed
  runs (``count=... min=... max=... avg=... std=...``), ``warmup`` from the warm-up line.
* ``latency_ms.median``: builds of the tool whose statistics keep every run
  (``StatWithPercentiles``: the current LiteRT sources) also print ``p5= median= p95=``;
  their median is the run at index ``n*50/100`` of the sorted runs (the upper median
  for an even count). Older builds print no percentile and the median is ``None``.
* ``latency_ms.p90`` is always ``None``: ``benchmark_model`` does not compute it (it
  prints p5 and p95, kept in ``extra``), and it does not print single runs either.
* ``peak_memory_mb``: "Overall peak memory footprint (MB) via periodic monitoring"
  (``--report_peak_memory_footprint=true``, on by default here; the tool samples the
  footprint from a separate thread every 50 ms).
* ``extra``: init time, first inference, warm-up mean, std, p5/p95, model file size,
  memory footprint deltas, delegate coverage, the exact flags, the binary's SHA-256 and,
  with ``--op-profiling``, the per-op tables (summary by node type and the top ops).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_mvit2.latency.android_log import BenchmarkModelOutput, OpProfile
from keras_mvit2.latency.host_info import _timestamp
from keras_mvit2.latency.schema import BenchResult, LatencyStats


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def _top_ops(profile: OpProfile, k: int = 5) -> list[dict[str, Any]]:
    rows = sorted(profile.by_node_type, key=lambda r: r.get("avg_ms", 0.0), reverse=True)
    return [
        {"node_type": r.get("node_type"), "count": r.get("count"), "avg_ms": r.get("avg_ms"),
         "pct": r.get("avg_pct")}
        for r in rows[:k]
    ]


def to_bench_result(
    output: BenchmarkModelOutput,
    *,
    model: dict[str, Any],
    device: dict[str, Any],
    runtime: dict[str, Any],
    op_histogram: dict[str, int] | None = None,
    extra: dict[str, Any] | None = None,
    timestamp: str | None = None,
) -> BenchResult:
    """Turns a parsed run into a `BenchResult` (milliseconds; see the module docstring
    for which statistic comes from where)."""
    stats = output.inference
    if not output.completed or stats is None:
        raise ValueError(
            "The benchmark_model output has no timed runs (no 'count=' line after the "
            "second 'Running benchmark for at least ...' line, or no 'Inference timings in "
            "us' line). Errors it printed: " + ("; ".join(output.errors) or "none")
        )
    latency = LatencyStats(
        runs=stats.count,
        warmup=output.warmup.count if output.warmup is not None else 0,
        min=_ms(stats.min),
        median=_ms(stats.median),
        p90=None,
        max=_ms(stats.max),
        mean=_ms(stats.avg),
    )
    unavailable = ["p90"] + ([] if stats.median is not None else ["median"])
    info: dict[str, Any] = {
        "init_ms": _ms(output.init_us),
        "first_inference_ms": _ms(output.first_inference_us),
        "warmup_mean_ms": _ms(output.warmup_avg_us),
        "std_ms": _ms(stats.std),
        "p5_ms": _ms(stats.p5),
        "p95_ms": _ms(stats.p95),
        "first_run_ms": _ms(stats.first),
        "model_size_mb": output.model_size_mb,
        "init_footprint_mb": output.init_footprint_mb,
        "overall_footprint_mb": output.overall_footprint_mb,
        "delegates_applied": output.delegates_applied,
        "replaced_nodes": output.replaced_nodes,
        "unavailable_stats": unavailable,
        "stats_source": (
            "benchmark_model statistics line of the timed runs; "
            + ("median = the run at index n*50/100 of the sorted runs; "
               if stats.median is not None else
               "this build prints no percentile, so no median; ")
            + "benchmark_model computes no p90"
        ),
    }
    if output.op_profile is not None:
        info["op_profile"] = {
            "by_node_type": output.op_profile.by_node_type,
            "top_by_time": output.op_profile.top_by_time,
            "top_ops": _top_ops(output.op_profile),
            "nodes_executed": output.op_profile.nodes_executed,
            "profiled_run_mean_ms": _ms(
                output.op_profile.timings.avg if output.op_profile.timings else None
            ),
        }
    info.update(extra or {})
    return BenchResult(
        model=dict(model),
        device=dict(device),
        runtime=dict(runtime),
        latency_ms=latency,
        peak_memory_mb=output.peak_memory_mb,
        op_histogram=dict(op_histogram or {}),
        extra=info,
        timestamp=timestamp or _timestamp(),
    )


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_table(results: Sequence[BenchResult]) -> str:
    """A plain-text table: one row per record, latencies in ms."""
    header = ("model", "device", "delegate", "threads", "runs", "min", "median", "mean",
              "max", "peak MB")
    rows = [header]
    for r in results:
        lat = r.latency_ms
        rows.append((
            str(r.model.get("name")), str(r.device.get("name")), str(r.runtime.get("delegate")),
            str(r.runtime.get("threads")), str(lat.runs), _fmt(lat.min), _fmt(lat.median),
            _fmt(lat.mean), _fmt(lat.max), _fmt(r.peak_memory_mb, 1),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
