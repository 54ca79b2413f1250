"""Host benchmark: batch-1 latency of a TFLite model in ``ai_edge_litert`` (XNNPACK on/off).

What is measured, and how:

* **Latency**: ``Interpreter.invoke()`` alone (inputs are set once before the
  warm-up), timed with ``time.perf_counter_ns``; ``warmup`` untimed runs first,
  then ``runs`` timed runs, summarised as min / median / p90 / max / mean
  (`LatencyStats`). Several models are measured *interleaved* (round-robin in
  blocks, `measure_interleaved`) so that machine drift hits all of them alike.
* **Peak memory**: a fresh Python subprocess that imports only numpy and
  ``ai_edge_litert`` reads its resident set size (``VmRSS``), resets the kernel's
  high-water mark (``echo 5 > /proc/self/clear_refs``), then loads the model,
  allocates the tensors and runs a few inferences; the figure is the
  high-water mark (``VmHWM``) minus that baseline: model pages touched, tensor
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
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from keras_mvit2.bench.schema import BenchResult, LatencyStats
from keras_mvit2.export.tflite.flatbuffer import (
    TENSOR_TYPE_NAMES,
    op_names,
    parse_flatbuffer,
    serialize_flatbuffer,
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

_MAC_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL")


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------------------
# Device and runtime descriptions


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_device() -> dict[str, Any]:
    """The `device` entry of a host record: name, platform, machine, os, cpu, cores."""
    return {
        "name": socket.gethostname(),
        "platform": "host",
        "machine": platform.machine(),
        "os": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }


def _litert_version() -> str:
    try:
        from importlib.metadata import version

        return version("ai-edge-litert")
    except Exception:  # pragma: no cover - metadata missing
        return "unknown"


def litert_runtime(threads: int, xnnpack: bool) -> dict[str, Any]:
    """The `runtime` entry of a host LiteRT record."""
    return {
        "name": "litert",
        "version": _litert_version(),
        "threads": threads,
        "delegate": "xnnpack" if xnnpack else "none",
        "batch_size": 1,
    }


def _timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------
# Interpreter, inputs, timing


def _check_threads(threads: int) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int. Received: threads={threads!r}")


def make_interpreter(
    model: str | os.PathLike | bytes, *, threads: int = 1, xnnpack: bool = True
) -> Interpreter:
    """An allocated ``ai_edge_litert`` interpreter for a file path or flatbuffer bytes.

    ``xnnpack=False`` uses ``OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES`` (the
    plain TFLite kernels); ``True`` the default resolver, which applies XNNPACK.
    """
    _check_threads(threads)
    resolver = OpResolverType.AUTO if xnnpack else (
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    kwargs: dict[str, Any] = {
        "num_threads": threads,
        "experimental_op_resolver_type": resolver,
    }
    if isinstance(model, bytes | bytearray):
        interpreter = Interpreter(model_content=bytes(model), **kwargs)
    else:
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"TFLite model not found: {path!r}")
        interpreter = Interpreter(model_path=path, **kwargs)
    interpreter.allocate_tensors()
    return interpreter


def random_inputs(interpreter: Interpreter, seed: int = 0) -> list[np.ndarray]:
    """Random valid values for every input: floats in [0, 1), integers over their range.

    Quantized (int8 / uint8 / int16) inputs get uniformly random integers of their
    type, which are all valid quantized values; booleans random bits.
    """
    rng = np.random.default_rng(seed)
    feeds = []
    for detail in interpreter.get_input_details():
        shape = [int(d) for d in detail["shape"]]
        dtype = np.dtype(detail["dtype"])
        if np.issubdtype(dtype, np.floating):
            feeds.append(rng.random(shape, dtype=np.float32).astype(dtype))
        elif dtype == np.bool_:
            feeds.append(rng.integers(0, 2, shape).astype(bool))
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            low, high = max(info.min, -(2**15)), min(info.max, 2**15 - 1)
            feeds.append(rng.integers(low, high, shape, endpoint=True).astype(dtype))
        else:
            raise ValueError(
                f"Cannot make random values for input {detail['name']!r} of type {dtype}; "
                "benchmark a model with float or integer inputs."
            )
    return feeds


def _set_inputs(interpreter: Interpreter, feeds: Sequence[np.ndarray]) -> None:
    for detail, feed in zip(interpreter.get_input_details(), feeds, strict=True):
        interpreter.set_tensor(detail["index"], feed)


class Samples(NamedTuple):
    """Timed invokes of one model: wall-clock and calling-thread CPU time, in ms."""

    wall_ms: list[float]
    cpu_ms: list[float]


def _time_invokes(interpreter: Interpreter, count: int) -> Samples:
    wall, cpu = [], []
    invoke = interpreter.invoke
    clock, thread_clock = time.perf_counter_ns, time.thread_time_ns
    for _ in range(count):
        start, start_cpu = clock(), thread_clock()
        invoke()
        end_cpu, end = thread_clock(), clock()
        wall.append((end - start) / 1e6)
        cpu.append((end_cpu - start_cpu) / 1e6)
    return Samples(wall, cpu)


def _check_counts(runs: int, warmup: int, rounds: int = 1) -> None:
    for label, value, low in (("runs", runs, 1), ("warmup", warmup, 0), ("rounds", rounds, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(
                f"{label} must be an int >= {low}. Received: {label}={value!r}"
            )


def measure_interleaved(
    interpreters: Mapping[Any, Interpreter],
    *,
    runs: int,
    warmup: int,
    rounds: int = 5,
    seed: int = 0,
) -> dict[Any, Samples]:
    """Invoke latencies (ms) of several models, measured round-robin.

    Each model gets `warmup` untimed runs, then `rounds` rounds in which every
    model in turn runs a block of about ``runs / rounds`` timed invokes, so that a
    slow phase of a shared machine hits all models alike. Returns `runs` samples
    per key: wall-clock time and the CPU time of the calling thread (with 1
    interpreter thread, XNNPACK and the TFLite kernels run in the calling thread, so
    its CPU time is the latency the model would have on an idle core: it leaves
    out the time the thread waited while other processes ran).
    """
    _check_counts(runs, warmup, rounds)
    rounds = min(rounds, runs)
    for index, interpreter in enumerate(interpreters.values()):
        _set_inputs(interpreter, random_inputs(interpreter, seed + index))
        _time_invokes(interpreter, warmup)
    blocks = [runs // rounds + (1 if r < runs % rounds else 0) for r in range(rounds)]
    samples: dict[Any, Samples] = {key: Samples([], []) for key in interpreters}
    for block in blocks:
        for key, interpreter in interpreters.items():
            timed = _time_invokes(interpreter, block)
            samples[key].wall_ms.extend(timed.wall_ms)
            samples[key].cpu_ms.extend(timed.cpu_ms)
    return samples


# --------------------------------------------------------------------------------------
# Flatbuffer facts: MACs, precision


def _shape(tensor: Any) -> list[int]:
    return [] if tensor.shape is None else [int(d) for d in tensor.shape]


def _op_macs(name: str, op: Any, tensors: list[Any]) -> int:
    inputs = [] if op.inputs is None else [int(i) for i in op.inputs]
    outputs = [] if op.outputs is None else [int(i) for i in op.outputs]
    if not outputs or len(inputs) < 2:
        return 0
    out = int(np.prod(_shape(tensors[outputs[0]]), dtype=np.int64))
    weights = _shape(tensors[inputs[1]])
    if name == "CONV_2D":            # filter (out, kh, kw, in / groups)
        return out * int(np.prod(weights[1:], dtype=np.int64))
    if name == "DEPTHWISE_CONV_2D":  # filter (1, kh, kw, out)
        return out * weights[1] * weights[2]
    if name == "FULLY_CONNECTED":    # weights (units, in)
        return out * weights[-1]
    if name == "BATCH_MATMUL":       # (..., m, k) x (..., k, n)
        lhs = _shape(tensors[inputs[0]])
        options = op.builtinOptions
        adj_x = bool(getattr(options, "adjX", False))
        return out * (lhs[-2] if adj_x else lhs[-1])
    return 0


def tflite_macs(path: str | os.PathLike | bytes) -> int | None:
    """Multiply-accumulates of one batch-1 inference, from the flatbuffer's shapes.

    Counts CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED and BATCH_MATMUL (output
    elements times the reduction length), the convention of
    `keras_mvit2.profiling.count_macs`; element-wise ops are not counted. Returns
    ``None`` (unknown) when a counted op has a dynamic (``-1``) dimension or the
    model has control-flow subgraphs, whose trip counts are unknown.
    """
    model = parse_flatbuffer(path)
    names = op_names(model)
    if len(model.subgraphs or []) != 1:
        return None
    graph = model.subgraphs[0]
    tensors = graph.tensors or []
    total = 0
    for op in graph.operators or []:
        name = names[op.opcodeIndex]
        if name not in _MAC_OPS:
            continue
        ids = [int(i) for i in list(op.inputs)[:2]] + [int(i) for i in list(op.outputs)[:1]]
        for i in ids:
            signature = tensors[i].shapeSignature
            if signature is not None and any(int(d) < 0 for d in list(signature)[1:]):
                return None
        total += _op_macs(name, op, tensors)
    return int(total)


def tflite_precision(path: str | os.PathLike) -> str:
    """``"float32"``, ``"float16"``, ``"dynamic_int8"``, ``"int8"`` or ``"int16x8"``.

    Read from the keras_mvit2 metadata when the file has it, otherwise from the
    tensor types of the first convolution / fully-connected op.
    """
    from keras_mvit2.export.tflite import read_tflite_metadata

    info = read_tflite_metadata(path)
    if info and info.get("quantization"):
        return str(info["quantization"])
    model = parse_flatbuffer(path)
    names = op_names(model)
    graph = model.subgraphs[0]
    tensors = graph.tensors
    has_fp16 = any(int(t.type) == tfl_schema.TensorType.FLOAT16 for t in tensors)
    for op in graph.operators or []:
        if names[op.opcodeIndex] not in _MAC_OPS:
            continue
        activation = TENSOR_TYPE_NAMES.get(int(tensors[int(op.inputs[0])].type), "")
        weight = TENSOR_TYPE_NAMES.get(int(tensors[int(op.inputs[1])].type), "")
        if activation in ("int8", "uint8"):
            return "int8"
        if activation == "int16":
            return "int16x8"
        if weight in ("int8", "uint8"):
            return "dynamic_int8"
        break
    return "float16" if has_fp16 else "float32"


# --------------------------------------------------------------------------------------
# Peak memory (fresh subprocess)

_MEMORY_PROBE = r"""
import json, os, resource, sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

def status_kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None

def maxrss_kb():
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value / 1024 if sys.platform == "darwin" else value

path, threads, xnnpack, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
resolver = OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
baseline = status_kb("VmRSS")
reset = False
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    reset = status_kb("VmHWM") is not None
except OSError:
    pass
if baseline is None:
    baseline = maxrss_kb()
interpreter = Interpreter(model_path=path, num_threads=threads,
                          experimental_op_resolver_type=resolver)
interpreter.allocate_tensors()
for detail in interpreter.get_input_details():
    view = interpreter.tensor(detail["index"])()
    view.fill(1 if np.issubdtype(view.dtype, np.integer) else 0.5)
    del view
for _ in range(runs):
    interpreter.invoke()
peak = status_kb("VmHWM") if reset else maxrss_kb()
method = ("VmHWM after clear_refs reset minus VmRSS before loading" if reset
          else "ru_maxrss minus RSS before loading (high-water mark not resettable)")
print(json.dumps({"peak_mb": (peak - baseline) / 1024.0, "baseline_mb": baseline / 1024.0,
                  "method": method}))
"""


def peak_memory_mb(
    path: str | os.PathLike, *, threads: int = 1, xnnpack: bool = True, runs: int = 3
) -> tuple[float | None, dict[str, Any]]:
    """Peak resident memory added by loading and running the model (MiB).

    Runs in a fresh subprocess (see the module docstring). Returns ``(None, info)``
    with the reason in ``info["error"]`` if the probe fails.
    """
    command = [sys.executable, "-c", _MEMORY_PROBE, os.fspath(path), str(threads),
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
    from keras_mvit2.export.tflite import inspect_tflite

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
    from keras_mvit2.export.tflite import to_tflite
    from keras_mvit2.profiling import profile

    to_tflite(model, path)
    try:
        info = profile(model)
        return info.params, info.macs
    except (ValueError, TypeError):
        return None, None


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
    height width) applies to registered names only (default 256). A `.mlpackage`
    runs with coremltools on macOS (`bench_coreml`).
    """
    _check_threads(threads)
    _check_counts(runs, warmup)
    spec = os.fspath(spec)
    lower = spec.rstrip("/").lower()
    if lower.endswith(".mlpackage") or lower.endswith(".mlmodel"):
        return bench_coreml(spec, runs=runs, warmup=warmup, compute_units=compute_units)
    if lower.endswith(".tflite"):
        if input_size:
            raise ValueError(
                "--input-size applies to registered model names only; a .tflite file has "
                f"a fixed input shape. Received: {spec!r} with input size {list(input_size)}"
            )
        return bench_tflite(spec, threads=threads, runs=runs, warmup=warmup, xnnpack=xnnpack,
                            measure_memory=measure_memory)

    import keras

    import keras_mvit2  # noqa: F401  (registers the custom layers for load_model)
    from keras_mvit2.models.registry import create_model, list_models

    if lower.endswith(".keras"):
        if input_size:
            raise ValueError(
                "--input-size applies to registered model names only; a .keras model has a "
                f"fixed input shape. Received: {spec!r} with input size {list(input_size)}"
            )
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"Keras model not found: {spec!r}")
        model = keras.saving.load_model(spec, compile=False)
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
    from keras_mvit2.export.coreml import coreml_predictions_available

    path = os.fspath(path)
    if not coreml_predictions_available():
        raise RuntimeError(
            f"Benchmarking a Core ML model ({os.path.basename(path.rstrip('/'))}) needs macOS: "
            f"Core ML predictions run only there, and this is {platform.system()}. Run "
            "`mvit2 bench MODEL.mlpackage` on a Mac (or use the iPhone harness in tflite/ios/), "
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

    from keras_mvit2.export.coreml import inspect_coreml

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
    import coremltools

    return BenchResult(
        model=entry,
        device={**host_device(), "platform": "macos"},
        runtime={"name": "coremltools", "version": coremltools.__version__, "threads": None,
                 "delegate": compute_units, "batch_size": 1},
        latency_ms=LatencyStats.from_samples(samples, warmup),
        op_histogram=report.op_histogram,
        extra={"note": "coremltools MLModel.predict from Python, includes its overhead"},
        timestamp=_timestamp(),
    )


# --------------------------------------------------------------------------------------
# Per-op timing by isolating each operator


@dataclasses.dataclass
class OpTiming:
    """Time of one operator of a model, run on its own (see `op_profile`).

    Attributes:
        index: operator index in the main subgraph.
        op: op name, e.g. ``"CONV_2D"``.
        ms: median time of the isolated op minus the empty-model invoke overhead.
        macs: the op's MACs (0 for element-wise ops).
        output_shape: shape of its first output.
    """

    index: int
    op: str
    ms: float
    macs: int
    output_shape: list[int]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _is_constant(model: Any, tensor: Any) -> bool:
    buffer = model.buffers[tensor.buffer] if 0 < tensor.buffer < len(model.buffers) else None
    return buffer is not None and buffer.data is not None and len(buffer.data) > 0


def _single_op_model(model: Any, op: Any) -> bytes:
    """A flatbuffer holding only `op`, its tensors and its constant buffers."""
    graph = model.subgraphs[0]
    old_ids = [int(i) for i in op.inputs if int(i) >= 0] + [int(i) for i in op.outputs]
    mapping: dict[int, int] = {}
    tensors, buffers = [], [tfl_schema.BufferT()]
    for old in old_ids:
        if old in mapping:
            continue
        tensor = copy.copy(graph.tensors[old])
        if _is_constant(model, tensor):
            buffers.append(model.buffers[tensor.buffer])
            tensor.buffer = len(buffers) - 1
        else:
            tensor.buffer = 0
        mapping[old] = len(tensors)
        tensors.append(tensor)
    new_op = copy.copy(op)
    new_op.opcodeIndex = 0
    new_op.inputs = [mapping[int(i)] if int(i) >= 0 else -1 for i in op.inputs]
    new_op.outputs = [mapping[int(i)] for i in op.outputs]
    new_op.intermediates = None
    sub = tfl_schema.SubGraphT()
    sub.tensors = tensors
    sub.operators = [new_op]
    sub.inputs = [mapping[int(i)] for i in op.inputs
                  if int(i) >= 0 and not _is_constant(model, graph.tensors[int(i)])]
    sub.outputs = list(new_op.outputs)
    sub.name = "op"
    single = tfl_schema.ModelT()
    single.version = model.version
    single.operatorCodes = [model.operatorCodes[op.opcodeIndex]]
    single.subgraphs = [sub]
    single.buffers = buffers
    single.description = "keras_mvit2 op_profile"
    return serialize_flatbuffer(single)


def _overhead_model() -> bytes:
    """A one-op model doing almost nothing (RESHAPE of one float): the invoke overhead."""
    model = tfl_schema.ModelT()
    model.version = 3
    code = tfl_schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = tfl_schema.BuiltinOperator.RESHAPE
    model.operatorCodes = [code]
    shape_buffer = tfl_schema.BufferT()
    shape_buffer.data = np.array([1], dtype=np.int32).view(np.uint8)
    model.buffers = [tfl_schema.BufferT(), shape_buffer]
    tensors = []
    for name, shape, kind, buffer in (("x", [1, 1], tfl_schema.TensorType.FLOAT32, 0),
                                      ("shape", [1], tfl_schema.TensorType.INT32, 1),
                                      ("y", [1], tfl_schema.TensorType.FLOAT32, 0)):
        t = tfl_schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, shape, kind, buffer
        tensors.append(t)
    op = tfl_schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    sub = tfl_schema.SubGraphT()
    sub.tensors, sub.operators, sub.inputs, sub.outputs = tensors, [op], [0], [2]
    model.subgraphs = [sub]
    return serialize_flatbuffer(model, 256)


def op_profile(
    path: str | os.PathLike,
    *,
    threads: int = 1,
    xnnpack: bool = True,
    runs: int = 20,
    rounds: int = 3,
    warmup: int = 2,
    seed: int = 0,
) -> tuple[list[OpTiming], dict[str, Any]]:
    """Per-operator times of a TFLite model, each operator timed on its own.

    LiteRT's Python API exposes no op profiler, so: the model is run once with all
    intermediate tensors kept (plain kernels, exact values); then every operator of
    the main subgraph is cut into a one-op flatbuffer (`_single_op_model`) fed those
    values, and timed with the same threads and delegate, interleaved over
    `rounds` (with 1 thread the invoking thread's CPU time, robust on a loaded
    machine; else wall clock). The median invoke time of an empty one-op model is
    subtracted.

    Caveats: XNNPACK plans a whole partition at once and may elide copies
    (e.g. a RESHAPE costs nothing inside a partition but copies in isolation);
    the sum of the op times is returned next to the whole-model median
    (``info["sum_ms"]``, ``info["model_ms"]``) so the gap is visible.

    Returns:
        ``(timings, info)``: one `OpTiming` per operator, and a dict with
        ``overhead_ms``, ``sum_ms``, ``model_ms`` and ``method``.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        content = f.read()
    model = parse_flatbuffer(content)
    if len(model.subgraphs or []) != 1:
        raise ValueError(
            f"op_profile handles single-subgraph models; {path!r} has "
            f"{len(model.subgraphs or [])} subgraphs (control flow)."
        )
    names = op_names(model)
    graph = model.subgraphs[0]

    full = Interpreter(model_content=content, num_threads=threads,
                       experimental_preserve_all_tensors=True)
    full.allocate_tensors()
    _set_inputs(full, random_inputs(full, seed))
    full.invoke()

    singles: dict[int, Interpreter] = {}
    for index, op in enumerate(graph.operators or []):
        interpreter = make_interpreter(_single_op_model(model, op), threads=threads,
                                       xnnpack=xnnpack)
        feeds = []
        for i in op.inputs:
            if int(i) >= 0 and not _is_constant(model, graph.tensors[int(i)]):
                feeds.append(np.array(full.get_tensor(int(i))))
        _set_inputs(interpreter, feeds)
        singles[index] = interpreter
    singles[-1] = make_interpreter(_overhead_model(), threads=threads, xnnpack=xnnpack)
    _set_inputs(singles[-1], [np.zeros((1, 1), np.float32)])
    for interpreter in singles.values():
        _time_invokes(interpreter, warmup)
    samples: dict[int, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for index, interpreter in singles.items():
            timed = _time_invokes(interpreter, runs)
            samples[index].extend(timed.cpu_ms if threads == 1 else timed.wall_ms)
    overhead = float(np.median(samples.pop(-1)))
    timings = []
    for index, op in enumerate(graph.operators or []):
        name = names[op.opcodeIndex]
        timings.append(OpTiming(
            index=index,
            op=name,
            ms=max(0.0, float(np.median(samples[index])) - overhead),
            macs=_op_macs(name, op, graph.tensors),
            output_shape=_shape(graph.tensors[int(op.outputs[0])]),
        ))
    whole = make_interpreter(content, threads=threads, xnnpack=xnnpack)
    timed = measure_interleaved({0: whole}, runs=runs * rounds, warmup=warmup, rounds=1,
                                seed=seed)[0]
    model_ms = float(np.median(timed.cpu_ms if threads == 1 else timed.wall_ms))
    info = {
        "overhead_ms": overhead,
        "sum_ms": float(sum(t.ms for t in timings)),
        "model_ms": model_ms,
        "threads": threads,
        "delegate": "xnnpack" if xnnpack else "none",
        "clock": "thread CPU time" if threads == 1 else "wall clock",
        "method": "each op cut into a one-op model fed the real intermediate values, median "
                  "of isolated invokes minus the empty-model overhead",
    }
    return timings, info


def op_type_breakdown(timings: Sequence[OpTiming]) -> list[dict[str, Any]]:
    """Per op type: count, total ms, share of the summed time, MACs; slowest first."""
    total = sum(t.ms for t in timings) or 1.0
    all_macs = sum(t.macs for t in timings) or 1
    groups: dict[str, dict[str, Any]] = {}
    for t in timings:
        g = groups.setdefault(t.op, {"op": t.op, "count": 0, "ms": 0.0, "macs": 0})
        g["count"] += 1
        g["ms"] += t.ms
        g["macs"] += t.macs
    rows = sorted(groups.values(), key=lambda g: -g["ms"])
    for g in rows:
        g["share"] = g["ms"] / total
        g["macs_share"] = g["macs"] / all_macs
    return rows
