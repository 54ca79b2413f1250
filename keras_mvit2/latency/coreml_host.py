"""Core ML on this Mac: `bench_coreml` times a model with coremltools' ``predict``."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from keras_mvit2.latency.host_info import _timestamp, host_device
from keras_mvit2.latency.litert_timing import _check_counts
from keras_mvit2.latency.schema import BenchResult, LatencyStats

_COMPUTE_UNITS = {
    "all": "ALL",
    "cpu_only": "CPU_ONLY",
    "cpu_and_gpu": "CPU_AND_GPU",
    "cpu_and_ne": "CPU_AND_NE",
}


def bench_coreml(
    path: str | os.PathLike, *, runs: int = 100, warmup: int = 10, compute_units: str = "all"
) -> BenchResult:
    """Benchmarks a Core ML model with coremltools' `predict` (macOS only).

    Raises:
        RuntimeError: not on macOS (Core ML's runtime exists only there).
        ValueError: unknown `compute_units`.
    """
    from keras_mvit2.export.coreml.inspect import coreml_predictions_available

    path = os.fspath(path)
    if not coreml_predictions_available():
        raise RuntimeError(
            f"Benchmarking a Core ML model ({os.path.basename(path.rstrip('/'))}) needs macOS: "
            f"Core ML predictions run only there, and this is {platform.system()}. Run "
            "`mvit2 bench MODEL.mlpackage` on a Mac (or use the iPhone harness in harness/ios/), "
            "or benchmark the .tflite export of the same model here."
        )
    if compute_units not in _COMPUTE_UNITS:
        raise ValueError(
            f"compute_units must be one of {sorted(_COMPUTE_UNITS)}. "
            f"Received: compute_units={compute_units!r}"
        )
    _check_counts(runs, warmup)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Core ML model not found: {path!r}")
    import coremltools as ct

    from keras_mvit2.export.coreml.inspect import inspect_coreml

    report = inspect_coreml(path)
    model = ct.models.MLModel(path, compute_units=getattr(ct.ComputeUnit,
                                                          _COMPUTE_UNITS[compute_units]))
    rng = np.random.default_rng(0)
    feed: dict[str, Any] = {}
    for entry in report.inputs:
        if entry["type"] == "imageType":
            from PIL import Image

            pixels = rng.integers(0, 256, (entry["height"], entry["width"], 3), dtype=np.uint8)
            feed[entry["name"]] = Image.fromarray(pixels, "RGB")
        else:
            feed[entry["name"]] = rng.random(entry["shape"], dtype=np.float32)
    for _ in range(warmup):
        model.predict(feed)
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        model.predict(feed)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    entry = {
        "name": os.path.splitext(os.path.basename(path.rstrip("/")))[0],
        "path": os.path.abspath(path),
        "format": "mlpackage",
        "precision": None,
        "size_bytes": report.size_bytes,
        "params": None,
        "macs": None,
        "input_shape": None,
    }
    return BenchResult(
        model=entry,
        device={**host_device(), "platform": "macos"},
        runtime={"name": "coremltools", "version": ct.__version__, "threads": None,
                 "delegate": compute_units, "batch_size": 1},
        latency_ms=LatencyStats.from_samples(samples, warmup),
        op_histogram=report.op_histogram,
        extra={"note": "coremltools MLModel.predict from Python, includes its overhead"},
        timestamp=_timestamp(),
    )
