"""The benchmark result record shared by every harness (host LiteRT, Android
`benchmark_model`, iPhone Core ML), so results from several devices merge into one
table (`mvit2 bench-report`)."""

import json
import os
import statistics
from dataclasses import asdict, dataclass, field

from keras_mvit2.utils.files import write_json

SCHEMA = "keras_mvit2.bench/1"


@dataclass
class LatencyStats:
    """Latency of single-batch inferences in milliseconds.

    `median` and `p90` are `None` when a tool does not report them (e.g. older
    TFLite `benchmark_model` builds print only min / max / avg); they are never
    estimated.
    """

    runs: int
    warmup: int
    min: float
    median: float | None
    p90: float | None
    max: float
    mean: float

    @classmethod
    def from_samples(cls, samples_ms: list[float], warmup: int) -> "LatencyStats":
        if not samples_ms:
            raise ValueError("LatencyStats needs at least one timed run. Received: 0 samples")
        ordered = sorted(samples_ms)
        p90_index = min(len(ordered) - 1, max(0, round(0.9 * (len(ordered) - 1))))
        return cls(
            runs=len(ordered),
            warmup=warmup,
            min=ordered[0],
            median=statistics.median(ordered),
            p90=ordered[p90_index],
            max=ordered[-1],
            mean=statistics.fmean(ordered),
        )


@dataclass
class BenchResult:
    """One model measured on one device with one runtime configuration.

    `device.platform` is `"host"`, `"android"` or `"ios"`; `runtime.delegate` is
    e.g. `"xnnpack"`, `"none"`, `"gpu"`, `"nnapi"` (TFLite) or `"cpu_only"`,
    `"cpu_and_gpu"`, `"cpu_and_ne"`, `"all"` (Core ML compute units).
    """

    model: dict                     # name, path, format, size_bytes, params, macs, input_shape
    device: dict                    # name, platform, machine, os, cpu
    runtime: dict                   # name, version, threads, delegate, batch_size
    latency_ms: LatencyStats
    peak_memory_mb: float | None = None
    op_histogram: dict[str, int] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    timestamp: str = ""
    schema: str = SCHEMA

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "BenchResult":
        if data.get("schema") != SCHEMA:
            raise ValueError(
                f"Not a keras_mvit2 benchmark record (schema {SCHEMA!r}). "
                f"Received: schema={data.get('schema')!r}"
            )
        data = dict(data)
        data["latency_ms"] = LatencyStats(**data["latency_ms"])
        return cls(**data)


def save_results(results: list[BenchResult], path: str | os.PathLike) -> None:
    """Writes results as a JSON list, atomically."""
    write_json(path, [r.to_dict() for r in results])


def load_results(path: str | os.PathLike) -> list[BenchResult]:
    """Reads a JSON file of one record or a list of records."""
    with open(path) as f:
        data = json.load(f)
    records = data if isinstance(data, list) else [data]
    return [BenchResult.from_dict(r) for r in records]
