"""Host benchmark: batch-1 latency of a TFLite model in ``ai_edge_litert`` (XNNPACK on/off).

What is measured, and how:

* **Latency**: ``Interpreter.invoke()`` alone (inputs are set once before the
  warm-up), timed with ``time.perf_counter_ns``; ``warmup`` untimed runs first,
  then ``runs`` timed runs, summarised as min / median / p90 / max / mean
  (`LatencyStats`). Several models are measured *interleaved* (round-robin in
  blocks, `measure_interleaved`) so that machine drift hits all of them alike.
* **Peak memory**: a fresh Python process (`keras_mvit2.latency.memory_probe`, run as a
  script) that imports only numpy and ``ai_edge_litert`` reads its resident set size
  (``VmRSS``), resets the kernel's high-water mark (``echo 5 > /proc/self/clear_refs``),
  then loads the model, allocates the tensors and runs a few inferences; the figure is
  the high-water mark (``VmHWM``) minus that baseline: model pages touched, tensor
  arena, XNNPACK's repacked weights and workspace. Where the high-water mark
  cannot be reset (not Linux), ``ru_maxrss`` minus the baseline is used and the
  record says so (`extra["peak_memory_method"]`).
* **MACs**: from the Keras model (`keras_mvit2.profiling.profile`) when there is
  one; for a bare ``.tflite`` they are computed from the flatbuffer's
  CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED / BATCH_MATMUL tensor shapes
  (`tflite_macs`), the same convention (element-wise ops not counted).
* **Per-op time** (`op_profile`): LiteRT's Python API has no op profiler, so each
  operator is cut out of the flatbuffer into a one-op model, fed the real
  intermediate values of a full run, and timed on its own (same threads and
  delegate); the invoke overhead of an empty model is subtracted.

This module gathers the host harness's names; the parts live in
`keras_mvit2.latency.host_info` (device and runtime entries), `keras_mvit2.latency.litert_timing`
(interpreters and timing), `keras_mvit2.latency.tflite_facts` (MACs, precision),
`keras_mvit2.latency.memory_probe`, `keras_mvit2.latency.coreml_host` (Core ML on a Mac) and
`keras_mvit2.latency.op_timing` (per-op time).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.latency import memory_probe
from keras_mvit2.latency.coreml_host import bench_coreml
from keras_mvit2.latency.host_info import (
    _timestamp,
    host_device,
    litert_runtime,
)
from keras_mvit2.latency.litert_timing import (
    Samples,
    _check_counts,
    _check_threads,
    make_interpreter,
    measure_interleaved,
    random_inputs,
)
from keras_mvit2.latency.op_timing import (
    OpTiming,
    op_profile,
    op_type_breakdown,
)
from keras_mvit2.latency.schema import BenchResult, LatencyStats
from keras_mvit2.latency.tflite_facts import (
    tflite_macs,
    tflite_precision,
)

__all__ = [
    "OpTiming",
    "bench",
    "bench_coreml",
    "bench_tflite",
    "host_device",
    "litert_runtime",
    "make_interpreter",
    "measure_interleaved",
    "op_profile",
    "op_type_breakdown",
    "peak_memory_mb",
    "random_inputs",
    "tflite_macs",
    "tflite_precision",
]

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------------------
# Peak memory (fresh subprocess)


def peak_memory_mb(
    path: str | os.PathLike, *, threads: int = 1, xnnpack: bool = True, runs: int = 3
) -> tuple[float | None, dict[str, Any]]:
    """Peak resident memory added by loading and running the model (MiB).

    Runs `keras_mvit2.latency.memory_probe` in a fresh subprocess (see the module
    docstring). Returns ``(None, info)`` with the reason in ``info["error"]`` if the probe
    fails.
    """
    command = [sys.executable, memory_probe.__file__, os.fspath(path), str(threads),
               "1" if xnnpack else "0", str(runs)]
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return None, {"error": "memory probe timed out"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, {"error": f"memory probe failed (exit {done.returncode}): {tail[0]}"}
    info = json.loads(lines[-1])
    return round(float(info.pop("peak_mb")), 2), info


# --------------------------------------------------------------------------------------
# One .tflite file -> BenchResult

def _histogram_and_report(path: str) -> tuple[dict[str, int], dict[str, Any]]:
    from keras_mvit2.export.tflite.inspect import inspect_tflite

    report = inspect_tflite(path)
    extra = {
        "num_ops": sum(report.op_histogram.values()),
        "xnnpack_partitions": report.num_xnnpack_partitions,
        "ops_outside_xnnpack": report.ops_outside_xnnpack,
        "max_tensor_rank": report.max_tensor_rank,
    }
    return dict(report.op_histogram), extra


def tflite_model_entry(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    params: int | None = None,
    macs: int | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """The `model` entry of a record for a `.tflite` file (MACs from the file if not given)."""
    path = os.fspath(path)
    interpreter = Interpreter(model_path=path)
    detail = interpreter.get_input_details()[0]
    flat_macs = tflite_macs(path)
    return {
        "name": name or os.path.splitext(os.path.basename(path))[0],
        "path": os.path.abspath(path),
        "format": "tflite",
        "precision": tflite_precision(path),
        "size_bytes": os.path.getsize(path),
        "params": params,
        "macs": macs if macs is not None else flat_macs,
        "macs_source": "keras" if macs is not None else (
            "tflite" if flat_macs is not None else "unknown"),
        "macs_tflite": flat_macs,
        "input_shape": [int(d) for d in detail["shape"]],
        "input_dtype": np.dtype(detail["dtype"]).name,
        "source": source,
    }


def make_result(
    model_entry: dict[str, Any],
    samples: Samples,
    *,
    warmup: int,
    threads: int,
    xnnpack: bool,
    peak_memory: float | None,
    op_histogram: dict[str, int],
    extra: dict[str, Any],
) -> BenchResult:
    """A host `BenchResult` from timed samples.

    ``latency_ms`` is wall-clock time. With 1 thread the calling thread's CPU time
    is added as ``extra["cpu_ms"]`` (same statistics): on a shared, loaded machine it
    is the better estimate of the latency on an idle core.
    """
    extra = dict(extra)
    if threads == 1:
        extra["cpu_ms"] = dataclasses.asdict(LatencyStats.from_samples(samples.cpu_ms, warmup))
        extra["cpu_ms_note"] = ("CPU time of the invoking thread (1 interpreter thread): "
                                "excludes time spent waiting for other processes")
    extra["load_average"] = _load_average()
    return BenchResult(
        model=model_entry,
        device=host_device(),
        runtime=litert_runtime(threads, xnnpack),
        latency_ms=LatencyStats.from_samples(samples.wall_ms, warmup),
        peak_memory_mb=peak_memory,
        op_histogram=op_histogram,
        extra=extra,
        timestamp=_timestamp(),
    )


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def bench_tflite(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    threads: int = 1,
    runs: int = 100,
    warmup: int = 10,
    xnnpack: bool = True,
    measure_memory: bool = True,
    params: int | None = None,
    macs: int | None = None,
    source: str | None = None,
    seed: int = 0,
) -> BenchResult:
    """Benchmarks one `.tflite` file at batch 1 on this machine.

    Args:
        path: the model file (float, float16, dynamic-range or full-integer).
        name: the model name in the record (default: the file's stem).
        threads: interpreter threads.
        runs: timed invokes.
        warmup: untimed invokes before timing.
        xnnpack: XNNPACK delegate on (default) or off (plain TFLite kernels).
        measure_memory: also measure peak memory in a fresh subprocess.
        params: parameters of the Keras model, when known.
        macs: MACs of the Keras model, when known (otherwise read from the
            flatbuffer, `tflite_macs`).
        source: where the file came from (e.g. "converted from NAME"), recorded.
        seed: seed of the random inputs.

    Returns:
        The `BenchResult` (device: this host; runtime: litert).
    """
    _check_threads(threads)
    _check_counts(runs, warmup)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"TFLite model not found: {path!r}")
    entry = tflite_model_entry(path, name=name, params=params, macs=macs, source=source)
    histogram, extra = _histogram_and_report(path)
    interpreter = make_interpreter(path, threads=threads, xnnpack=xnnpack)
    samples = measure_interleaved({0: interpreter}, runs=runs, warmup=warmup, rounds=1,
                                  seed=seed)[0]
    del interpreter
    memory = None
    if measure_memory:
        memory, info = peak_memory_mb(path, threads=threads, xnnpack=xnnpack)
        extra["peak_memory_method"] = info.get("method") or info.get("error")
        extra["memory_baseline_mb"] = info.get("baseline_mb")
    return make_result(entry, samples, warmup=warmup, threads=threads, xnnpack=xnnpack,
                       peak_memory=memory, op_histogram=histogram, extra=extra)


# --------------------------------------------------------------------------------------
# An exported file -> BenchResult, timed in its export target's runtime


def bench_file(
    path: str | os.PathLike,
    *,
    target: Any = None,
    threads: int = 1,
    runs: int = 100,
    warmup: int = 10,
    xnnpack: bool = True,
    measure_memory: bool = True,
    compute_units: str = "all",
    browser: Any = None,
) -> BenchResult:
    """Times an exported file on this host in the runtime apps load it with.

    Args:
        path: the file (or folder) an export target wrote.
        target: its export target, a name (``"tflite"``) or an `ExportTarget` (default:
            the one whose files end like `path`, `keras_mvit2.export.target_for_path`).
        threads: runtime threads (MediaPipe Tasks web has one; Core ML picks its own).
        runs: timed runs.
        warmup: untimed runs before them.
        xnnpack: LiteRT's XNNPACK delegate on or off (`bench_tflite`), for TFLite files.
        measure_memory: also LiteRT's peak memory (`bench_tflite`), for TFLite files.
        compute_units: Core ML's setting (`bench_coreml`), for Core ML packages.
        browser: a running `keras_mvit2.export.web.Browser` for a web page folder (else
            one is started and closed here).

    Returns:
        The `BenchResult`: a `.tflite` timed by `bench_tflite`, a Core ML package by
        `bench_coreml` (macOS), a web page folder by MediaPipe Tasks in headless Chromium
        (platform ``"browser"``).

    Raises:
        NotImplementedError: the target's files cannot be timed on this host (Core AI).
    """
    from keras_mvit2.export.target import get_target, target_for_path

    if target is None:
        target = target_for_path(path)
    elif isinstance(target, str):
        target = get_target(target)
    if target.name == "tflite":
        return bench_tflite(path, threads=threads, runs=runs, warmup=warmup, xnnpack=xnnpack,
                            measure_memory=measure_memory)
    if target.name == "coreml":
        return bench_coreml(path, runs=runs, warmup=warmup, compute_units=compute_units)
    if target.name == "web":
        return _bench_web(path, threads=threads, runs=runs, warmup=warmup, browser=browser)
    raise NotImplementedError(f"{target.display_name} files cannot be benchmarked here.")


def _bench_web(path: str | os.PathLike, *, threads: int, runs: int, warmup: int,
               browser: Any) -> BenchResult:
    """Milliseconds per image of MediaPipe Tasks in headless Chromium (the task's whole
    call: image in, results out) for a page folder of `mvit2 export -o NAME.web`."""
    from keras_mvit2.export.target import get_target
    from keras_mvit2.export.web.runtime import TASKS_VISION_VERSION
    from keras_mvit2.export.web.target import open_page

    if threads != 1:
        raise ValueError("MediaPipe Tasks web runs its WebAssembly on one thread. "
                         f"Received: threads={threads}")
    report = get_target("web").inspect(path)
    shape = report.tflite.inputs[0].shape
    image = np.random.default_rng(0).integers(0, 256, (shape[1], shape[2], 3), np.uint8)
    with open_page(path, browser) as page:
        samples = page.bench(image, runs=runs, warmup=warmup)
        device = {**host_device(), "platform": "browser",
                  "browser": f"Chromium {page.browser_version} (headless)"}
    meta = report.metadata or {}
    model = tflite_model_entry(report.tflite.path,
                               name=os.path.basename(os.fspath(path).rstrip("/")))
    return BenchResult(
        model={**model, "path": os.path.abspath(path), "format": "web",
               "quantization": meta.get("quantization")},
        device=device,
        runtime={"name": "mediapipe-tasks-web", "version": TASKS_VISION_VERSION,
                 "threads": 1, "delegate": "xnnpack (wasm)", "batch_size": 1},
        latency_ms=LatencyStats.from_samples(samples, warmup),
        op_histogram=dict(report.op_histogram),
        extra={"timed": "the task's call per image (image in, results out)"},
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


# --------------------------------------------------------------------------------------
# Anything -> BenchResult: .tflite, .keras, registered name, .mlpackage


def _input_shape(sizes: Sequence[int] | None, default: int = 256) -> tuple[int, int, int]:
    if not sizes:
        return (default, default, 3)
    if len(sizes) == 1:
        return (int(sizes[0]), int(sizes[0]), 3)
    if len(sizes) == 2:
        return (int(sizes[0]), int(sizes[1]), 3)
    raise ValueError(f"input size takes one or two values. Received: {list(sizes)}")


def keras_to_tflite(model: Any, path: str) -> tuple[int | None, int | None]:
    """Converts `model` to float32 `path`; returns `(params, macs)` of the Keras model."""
    from keras_mvit2.export.tflite.convert import to_tflite
    from keras_mvit2.profiling import profile

    to_tflite(model, path)
    try:
        info = profile(model)
        return info.params, info.macs
    except (ValueError, TypeError):
        return None, None


def _export_target(lower: str):
    """The export target whose files end like `lower` (a lower-cased path), or None."""
    from keras_mvit2.export.target import target_for_path

    try:
        return target_for_path(lower)
    except ValueError:
        return None


def bench(
    spec: str,
    *,
    threads: int = 1,
    runs: int = 100,
    warmup: int = 10,
    xnnpack: bool = True,
    input_size: Sequence[int] | None = None,
    measure_memory: bool = True,
    compute_units: str = "all",
    log: Log = _quiet,
) -> BenchResult:
    """Benchmarks a `.tflite`, `.keras`, `.mlpackage` or a registered model name.

    A `.keras` file or a registered name (`keras_mvit2.list_models()`) is converted
    to a temporary float32 `.tflite` first (with `keras_mvit2.export.to_tflite`), and
    its parameters and MACs come from the Keras model. `input_size` (one value or
    height width) applies to registered names only (default 256). An exported file is
    timed in its export target's runtime (`bench_file`): a `.tflite` with `bench_tflite`, a
    `.mlpackage` with coremltools on macOS (`bench_coreml`), a `.web` page in headless
    Chromium.
    """
    _check_threads(threads)
    _check_counts(runs, warmup)
    spec = os.fspath(spec)
    lower = spec.rstrip("/").lower()
    target = _export_target(lower)
    if target is not None:  # an exported file: timed by its target's runtime
        if input_size:
            suffix = next(s for s in target.suffixes if lower.endswith(s))
            raise ValueError(
                f"--input-size applies to registered model names only; a {suffix} file has "
                f"a fixed input shape. Received: {spec!r} with input size {list(input_size)}"
            )
        return bench_file(spec, target=target, threads=threads, runs=runs, warmup=warmup,
                          xnnpack=xnnpack, measure_memory=measure_memory,
                          compute_units=compute_units)

    import keras_mvit2.layers
    import keras_mvit2.tasks  # noqa: F401
    from keras_mvit2.models.registry import create_model, list_models
    from keras_mvit2.utils.model_files import load_keras_model

    if lower.endswith(".keras"):
        if input_size:
            raise ValueError(
                "--input-size applies to registered model names only; a .keras model has a "
                f"fixed input shape. Received: {spec!r} with input size {list(input_size)}"
            )
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"Keras model not found: {spec!r}")
        model = load_keras_model(spec)
        name, source = os.path.splitext(os.path.basename(spec))[0], spec
    elif spec in list_models():
        model = create_model(spec, input_shape=_input_shape(input_size))
        name, source = spec, f"registered model {spec} (random weights)"
    else:
        raise ValueError(
            f"{spec!r} is neither a model file (.tflite, .keras, .mlpackage) nor a registered "
            f"model name. Registered names: {', '.join(list_models())}"
        )
    with tempfile.TemporaryDirectory(prefix="keras_mvit2_bench_") as tmp:
        path = os.path.join(tmp, f"{name}.tflite")
        log(f"Converting {source} to a temporary float32 .tflite ...")
        params, macs = keras_to_tflite(model, path)
        result = bench_tflite(path, name=name, threads=threads, runs=runs, warmup=warmup,
                              xnnpack=xnnpack, measure_memory=measure_memory, params=params,
                              macs=macs, source=f"{source} -> temporary float32 .tflite")
        result.model["path"] = None
        return result

